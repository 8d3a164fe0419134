"""``python -m skulk.bench serve``: serving through the HTTP API vs in-process mlx-lm.

Both sides generate greedily from the same model, prompt and ``max_tokens``; the baseline is
``mlx_lm.stream_generate`` in this process, then a real ``python -m skulk serve`` is started and
driven over SSE. Each side runs ``repeats`` times after a warm-up; medians are reported.

* TTFT: request sent → first generated text (in-process: call → first yielded token).
* tokens/s: decode rate after the first token, ``(n - 1) / (t_last - t_first)``.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
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


@attrs.frozen
class Side:
    name: str
    runs: tuple[Run, ...]

    @property
    def ttft_s(self) -> float:
        return statistics.median(r.ttft_s for r in self.runs)

    @property
    def tokens_per_s(self) -> float:
        return statistics.median(r.tokens_per_s for r in self.runs)

    @property
    def tokens(self) -> int:
        return min(r.tokens for r in self.runs)


def in_process(model_dir: Path, max_tokens: int, repeats: int) -> Side:
    import mlx_lm
    from mlx_lm.sample_utils import make_sampler

    model, tokenizer = mlx_lm.load(str(model_dir))[:2]
    prompt = tokenizer.apply_chat_template(  # type: ignore[no-untyped-call]
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True, tokenize=True
    )
    sampler = make_sampler(temp=0.0)

    def once() -> Run:
        start = time.perf_counter()
        first = last = 0.0
        n = 0
        for _ in mlx_lm.stream_generate(
            model, tokenizer, prompt, max_tokens=max_tokens, sampler=sampler
        ):
            last = time.perf_counter()
            if n == 0:
                first = last
            n += 1
        return Run(first - start, n, (n - 1) / (last - first) if n > 1 else 0.0)

    once()  # warm-up
    return Side("mlx_lm in-process", tuple(once() for _ in range(repeats)))


def through_api(home: Path, max_tokens: int, repeats: int) -> Side:
    body = {
        "model": "skulk-demo",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    with (
        NodeProcess(home, "--log-level", "warning") as node,
        httpx.Client(base_url=node.url, timeout=120) as http,
    ):

        def once() -> Run:
            start = time.perf_counter()
            first = last = 0.0
            n = 0
            with http.stream("POST", "/v1/chat/completions", json=body) as r:
                r.raise_for_status()
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        n = chunk["usage"]["completion_tokens"]
                    elif chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                        last = time.perf_counter()
                        if not first:
                            first = last
            # Rate over the tokens after the first, as on the in-process side.
            return Run(first - start, n, (n - 1) / (last - first) if n > 1 else 0.0)

        once()  # warm-up
        return Side("skulk HTTP API (SSE)", tuple(once() for _ in range(repeats)))


def run(max_tokens: int, repeats: int, home: Path | None) -> dict[str, object]:
    from skulk.models import ensure_demo_model

    with tempfile.TemporaryDirectory(prefix="skulk-bench-") as tmp:
        home = home or Path(tmp)
        model_dir = ensure_demo_model(home)
        base = in_process(model_dir, max_tokens, repeats)
        ours = through_api(home, max_tokens, repeats)
    if ours.tokens != base.tokens:
        print(
            f"warning: token counts differ (api {ours.tokens}, in-process {base.tokens})",
            file=sys.stderr,
        )
    return {
        "benchmark": "serve",
        "model": "skulk-demo",
        "max_tokens": max_tokens,
        "repeats": repeats,
        "tokens": ours.tokens,
        "tokens_per_s_ratio": round(ours.tokens_per_s / base.tokens_per_s, 3),
        "ttft_ratio": round(ours.ttft_s / base.ttft_s, 3),
        "skulk_tokens_per_s": round(ours.tokens_per_s, 1),
        "mlx_lm_tokens_per_s": round(base.tokens_per_s, 1),
        "skulk_ttft_ms": round(ours.ttft_s * 1000, 2),
        "mlx_lm_ttft_ms": round(base.ttft_s * 1000, 2),
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
