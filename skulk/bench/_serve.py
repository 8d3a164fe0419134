"""``python -m skulk.bench serve``: serving through the HTTP API vs in-process mlx-lm.

Both sides generate greedily from the same model, prompt and ``max_tokens``: the baseline is
``mlx_lm.stream_generate`` in this process, the other side a real ``python -m skulk serve`` driven
over SSE. The sides run alternately (baseline, API, baseline, API, …) after one warm-up each, so
a noisy machine slows both alike; the ratios reported are medians of the per-pair ratios.

* TTFT: request sent → first generated text (in-process: call → first yielded token; the prompt
  is tokenized before the clock starts there, after it through the API — our side pays for it).
* tokens/s: decode rate after the first token, ``(n - 1) / (t_last - t_first)``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import attrs
import httpx

from skulk.harness import NodeProcess

PROMPT = "Tell me a long story about a fox who builds a cluster of machines."


@attrs.frozen
class Run:
    ttft_s: float
    tokens: int
    tokens_per_s: float


class _Clock:
    """Marks the first and last output of one generation."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.first = self.last = 0.0

    def output(self) -> None:
        self.last = time.perf_counter()
        self.first = self.first or self.last

    def run(self, tokens: int) -> Run:
        rate = (tokens - 1) / (self.last - self.first) if tokens > 1 else 0.0
        return Run(self.first - self.start, tokens, rate)


def in_process(model_dir: Path, max_tokens: int) -> Callable[[], Run]:
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    prompt = tokenizer.apply_chat_template(  # type: ignore[no-untyped-call]
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True
    )
    sampler = make_sampler(temp=0.0)

    def once() -> Run:
        clock, n = _Clock(), 0
        for _ in mlx_lm.stream_generate(
            model, tokenizer, prompt, max_tokens=max_tokens, sampler=sampler
        ):
            clock.output()
            n += 1
        return clock.run(n)

    return once


def through_api(http: httpx.Client, max_tokens: int) -> Callable[[], Run]:
    body = {
        "model": "skulk-demo",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }

    def once() -> Run:
        clock, n = _Clock(), 0
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk.get("usage"):  # the exact count: a chunk may carry several tokens
                    n = chunk["usage"]["completion_tokens"]
                elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    clock.output()
        return clock.run(n)

    return once


def run(
    max_tokens: int,
    repeats: int,
    home: Path | None,
    stream_interval: float | None = None,
    speculative_tokens: int | None = None,
) -> dict[str, object]:
    from skulk.models import ensure_demo_model

    node_args: list[str] = []
    if stream_interval is not None:
        node_args += ["--stream-interval", str(stream_interval)]
    if speculative_tokens is not None:
        node_args += ["--speculative-tokens", str(speculative_tokens)]
    with tempfile.TemporaryDirectory(prefix="skulk-bench-") as tmp:
        home = home or Path(tmp)
        baseline = in_process(ensure_demo_model(home), max_tokens)
        with (
            NodeProcess(home, "--log-level", "warning", *node_args) as node,
            httpx.Client(base_url=node.url, timeout=120) as http,
        ):
            ours = through_api(http, max_tokens)
            baseline(), ours()  # warm-up
            pairs = [(baseline(), ours()) for _ in range(repeats)]
    base_runs, our_runs = [b for b, _ in pairs], [o for _, o in pairs]
    if {r.tokens for r in our_runs} != {r.tokens for r in base_runs}:
        print("warning: the two sides generated different token counts", file=sys.stderr)
    med = statistics.median
    return {
        "benchmark": "serve",
        "model": "skulk-demo",
        "max_tokens": max_tokens,
        "repeats": repeats,
        "stream_interval": stream_interval,
        "speculative_tokens": speculative_tokens,
        "tokens": min(r.tokens for r in our_runs),
        "tokens_per_s_ratio": round(med(o.tokens_per_s / b.tokens_per_s for b, o in pairs), 3),
        "ttft_ratio": round(med(o.ttft_s / b.ttft_s for b, o in pairs), 3),
        "skulk_tokens_per_s": round(med(r.tokens_per_s for r in our_runs), 1),
        "mlx_lm_tokens_per_s": round(med(r.tokens_per_s for r in base_runs), 1),
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
    return "\n".join(f"{a:<10} {b!s:>12} {c!s:>18} {d!s:>8}" for a, b, c, d in rows)
