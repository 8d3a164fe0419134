"""``python -m skulk.bench serve``: serving through the HTTP API vs in-process mlx-lm.

Both sides generate from the same model, prompt, ``max_tokens`` and sampling: the baseline is
``mlx_lm.stream_generate`` in this process, the other side a real ``python -m skulk serve`` driven
over SSE (its default settings, so speculation on unless ``--speculative-tokens 0``). The sides
run alternately (baseline, API, baseline, API, …) after one warm-up each, so a noisy machine
slows both alike; the ratios reported are medians of the per-pair ratios.

* **Greedy** (the default, ``--temperature 0``): every run has the same prompt (:data:`PROMPT`)
  and both sides generate the same ``max_tokens`` tokens.
* **Sampled free text** (``--temperature T``, e.g. 0.7, with ``--seed S``): pair ``i`` gets
  prompt ``i`` of :func:`prompts` (a seeded list of different free-text requests, so no prefix
  cache serves one pair from an earlier one; prompt 0 is the warm-up's) and seed ``S + i`` on
  both sides: the node gets
  ``temperature`` and ``seed`` in the request; in-process, a
  ``make_sampler(temp=T)`` sampler after ``mx.random.seed(S + i)``. The two samplers are
  different code, so the texts differ; either may end early at end-of-sequence, hence the rate
  is per decode token and the token counts of every run are reported.

* TTFT: request sent → first generated text (in-process: call → first yielded token; the prompt
  is tokenized before the clock starts there, after it through the API — our side pays for it).
* tokens/s: decode rate after the first token, ``(n - 1) / (t_last - t_first)``, ``n`` the
  completion tokens (both sides count an end-of-sequence token, as the step that made it ran),
  ``t_last`` the last output (through the API: the last content delta or the finishing chunk).
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import httpx

from skulk.harness import NodeProcess

PROMPT = "Tell me a long story about a fox who builds a cluster of machines."
#: What :func:`prompts` makes its free-text requests of.
# fmt: off
FORMS = ("Tell me a long story about", "Write a letter from", "Describe a day in the life of",
         "Write a travel diary kept by", "Explain, as a teacher would, the work of",
         "Write a fable about", "Give a detailed report on", "Write a poem in many verses about")
WHO = ("a fox", "an old lighthouse keeper", "a young engineer", "a river otter", "a baker",
       "a librarian", "a ship's cat", "a beekeeper", "a mountain guide", "a clockmaker",
       "a night nurse", "a street musician")
WHAT = ("who builds a cluster of machines", "who learns to sail", "who maps a forgotten city",
        "who repairs a broken bridge", "who trains a flock of pigeons", "who opens a school",
        "who searches for a lost letter", "who grows a garden on a roof",
        "who crosses a desert", "who writes a dictionary")
# fmt: on


@attrs.frozen
class Run:
    ttft_s: float
    tokens: int
    tokens_per_s: float


#: One generation: given a prompt and a seed, timed.
Once = Callable[[str, int], Run]


def prompts(n: int, seed: int) -> list[str]:
    """``n`` different free-text requests, the same for the same ``seed`` (each opens with its
    own words, so no two share a prefix past the chat template's)."""
    combos = [f"{f} {w} {x}." for f in FORMS for w in WHO for x in WHAT]
    if n > len(combos):
        raise ValueError(f"at most {len(combos)} different prompts")
    return random.Random(seed).sample(combos, n)


class _Clock:
    """Marks the first and last output of one generation."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first = self.last = 0.0

    def output(self) -> None:
        self.last = time.perf_counter()
        self.first = self.first or self.last

    def run(self, tokens: int) -> Run:
        span = self.last - self.first
        rate = (tokens - 1) / span if tokens > 1 and span > 0 else 0.0
        return Run(self.first - self.start, tokens, rate)


def in_process(model_dir: Path, max_tokens: int, temperature: float = 0.0) -> Once:
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    sampler = make_sampler(temp=temperature)

    def once(text: str, seed: int) -> Run:
        prompt = tokenizer.apply_chat_template(  # type: ignore[no-untyped-call]
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        mx.random.seed(seed)
        clock, n = _Clock(), 0
        for _ in mlx_lm.stream_generate(
            model, tokenizer, prompt, max_tokens=max_tokens, sampler=sampler
        ):
            clock.output()
            n += 1
        return clock.run(n)

    return once


def request_body(
    text: str, max_tokens: int, temperature: float, seed: int, model: str = "skulk-demo"
) -> dict[str, object]:
    """The streamed chat request for one run (greedy: no seed, as it would change nothing)."""
    body: dict[str, object] = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if temperature > 0:
        body["seed"] = seed
    return body


def through_api(
    http: httpx.Client, max_tokens: int, temperature: float = 0.0, model: str = "skulk-demo"
) -> Once:
    def once(text: str, seed: int) -> Run:
        clock, n = _Clock(), 0
        body = request_body(text, max_tokens, temperature, seed, model)
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):  # the exact count: a chunk may carry several tokens
                    n = chunk["usage"]["completion_tokens"]
                elif chunk["choices"] and (
                    chunk["choices"][0]["delta"].get("content")
                    or chunk["choices"][0].get("finish_reason")
                ):
                    clock.output()
        return clock.run(n)

    return once


def plan(repeats: int, temperature: float, seed: int) -> list[tuple[str, int]]:
    """(prompt, seed) of the warm-up, then of each pair: greedy, always :data:`PROMPT`;
    sampled, a different prompt and seed per pair (module doc)."""
    if temperature <= 0:
        return [(PROMPT, seed)] * (repeats + 1)
    return [(text, seed + i) for i, text in enumerate(prompts(repeats + 1, seed))]


def run(
    max_tokens: int,
    repeats: int,
    home: Path | None,
    stream_interval: float | None = None,
    speculative_tokens: int | None = None,
    temperature: float = 0.0,
    seed: int = 0,
    model: str = "demo",
) -> dict[str, object]:
    from skulk.models import ensure_demo_model

    node_args: list[str] = []
    if stream_interval is not None:
        node_args += ["--stream-interval", str(stream_interval)]
    if speculative_tokens is not None:
        node_args += ["--speculative-tokens", str(speculative_tokens)]
    (warm, warm_seed), *runs = plan(repeats, temperature, seed)
    with tempfile.TemporaryDirectory(prefix="skulk-bench-") as tmp:
        home = home or Path(tmp)
        model_dir = ensure_demo_model(home)
        if model == "large":  # the load benchmark's (it never ends: full-length runs)
            from skulk.bench._load import large_model

            model_dir = large_model(model_dir)
            node_args += ["--model", str(model_dir)]
        baseline = in_process(model_dir, max_tokens, temperature)
        with (
            NodeProcess(home, "--log-level", "warning", *node_args) as node,
            httpx.Client(base_url=node.url, timeout=120) as http,
        ):
            ours = through_api(http, max_tokens, temperature, model_dir.name)
            baseline(warm, warm_seed), ours(warm, warm_seed)
            pairs = [(baseline(text, s), ours(text, s)) for text, s in runs]
    return summary(pairs, max_tokens, temperature, seed) | {
        "model": model_dir.name,
        "repeats": repeats,
        "stream_interval": stream_interval,
        "speculative_tokens": speculative_tokens,
    }


def summary(
    pairs: Sequence[tuple[Run, Run]], max_tokens: int, temperature: float, seed: int
) -> dict[str, object]:
    """The result from (baseline, ours) pairs; a pair where either side made fewer than two
    tokens (no decode rate) is left out of the tokens/s figures."""
    base_runs, our_runs = [b for b, _ in pairs], [o for _, o in pairs]
    if temperature <= 0 and {r.tokens for r in our_runs} != {r.tokens for r in base_runs}:
        print("warning: the two sides generated different token counts", file=sys.stderr)
    med = statistics.median
    rated = [(b, o) for b, o in pairs if b.tokens_per_s > 0 and o.tokens_per_s > 0]

    def rounded(values: list[float], digits: int) -> float | None:
        return round(med(values), digits) if values else None

    return {
        "benchmark": "serve",
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed if temperature > 0 else None,
        "prompts": "varied" if temperature > 0 else "fixed",
        "tokens": min(r.tokens for r in our_runs),
        "skulk_tokens": [r.tokens for r in our_runs],
        "mlx_lm_tokens": [r.tokens for r in base_runs],
        "rated_pairs": len(rated),
        "tokens_per_s_ratio": rounded([o.tokens_per_s / b.tokens_per_s for b, o in rated], 3),
        "ttft_ratio": round(med(o.ttft_s / b.ttft_s for b, o in pairs), 3),
        "skulk_tokens_per_s": rounded([o.tokens_per_s for _, o in rated], 1),
        "mlx_lm_tokens_per_s": rounded([b.tokens_per_s for b, _ in rated], 1),
        "skulk_ttft_ms": round(med(r.ttft_s for r in our_runs) * 1000, 2),
        "mlx_lm_ttft_ms": round(med(r.ttft_s for r in base_runs) * 1000, 2),
    }


def table(result: dict[str, object]) -> str:
    rows = [
        ("", "skulk API", "mlx_lm in-process", "ratio"),
        (
            "tokens/s",
            result["skulk_tokens_per_s"],
            result["mlx_lm_tokens_per_s"],
            result["tokens_per_s_ratio"],
        ),
        ("TTFT ms", result["skulk_ttft_ms"], result["mlx_lm_ttft_ms"], result["ttft_ratio"]),
    ]
    lines = [f"{a:<10} {b!s:>12} {c!s:>18} {d!s:>8}" for a, b, c, d in rows]
    if result.get("prompts") == "varied":
        lines.append(
            f"sampled at temperature {result['temperature']} (seed {result['seed']}), "
            f"{result['rated_pairs']} pairs rated; tokens skulk {result['skulk_tokens']}, "
            f"mlx_lm {result['mlx_lm_tokens']}"
        )
    return "\n".join(lines)
