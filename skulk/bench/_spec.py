"""``python -m skulk.bench spec``: speculative decoding (n-gram proposer) vs plain decoding,
in process, on the demo model.

Each case generates the same request both ways: plain is the runner's own single-row path
(:func:`~skulk.engine._single.decode_alone`: a one-row batch, speculation off); speculative is
:class:`~skulk.engine._speculate.SpeculativeDecoder` after the same prefill, its tokens fed
through the same :class:`~skulk.engine._engine.TokenOutput` (so both pay for detokenizing). The
two alternate (plain, speculative, plain, …) after a warm-up, so a noisy machine slows both
alike; tokens/s counts the whole request (prefill included) and the ratio reported is the
median of the per-round ratios. ``cpu_ratio`` is the same ratio in CPU seconds of this process
per token (plain ÷ speculative): the work saved, steadier than wall time on a shared machine,
blind to the host/device overlap. Each round also checks that both produced the same tokens.

Cases: a prompt the answer copies from, and a free prompt, greedy; the free prompt sampled at
temperature 1 (where the proposer's drafts are mostly wrong: the case that must not be slower).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from skulk.engine.inprocess import (
    DEFAULT_SPECULATIVE_TOKENS,
    Engine,
    Sampler,
    SpeculationController,
    SpeculationStatistics,
    SpeculativeDecoder,
    TokenOutput,
    decode_alone,
    warm_up,
)
from skulk.wire.runner import SamplingParams, TextPrompt

COPY_PROMPT = (
    "Repeat this text exactly: the fox builds a cluster of machines, and every machine "
    "runs a model, and every model answers the fox. Repeat this text exactly: the fox builds"
)
FREE_PROMPT = "Tell me a long story about a fox who builds a cluster of machines."


@attrs.frozen
class Case:
    name: str
    prompt: str
    params: SamplingParams


def cases(max_tokens: int) -> tuple[Case, ...]:
    return (
        Case("copy_greedy", COPY_PROMPT, SamplingParams(temperature=0.0, max_tokens=max_tokens)),
        Case("free_greedy", FREE_PROMPT, SamplingParams(temperature=0.0, max_tokens=max_tokens)),
        Case(
            "free_sampled",
            FREE_PROMPT,
            SamplingParams(temperature=1.0, seed=11, max_tokens=max_tokens),
        ),
    )


def prefill(
    engine: Engine, tokens: list[int], params: SamplingParams
) -> tuple[list[Any], Sampler, mx.array]:
    """``(cache, sampler, pending)`` after the prefill :class:`~skulk.engine._batch.Prefill`
    does for a prompt that fits one chunk (every token but the last, then the last one,
    sampled): the same cache, key and first token."""
    model: Any = engine.model
    cache: list[Any] = make_prompt_cache(model)
    sampler = Sampler(params, engine.vocab_size)
    if len(tokens) > 1:
        model(mx.array(tokens[:-1])[None], cache=cache)
    return cache, sampler, sampler(model(mx.array(tokens[-1:])[None], cache=cache)[:, -1, :])


def prefilled_decoder(
    engine: Engine, tokens: list[int], params: SamplingParams, max_draft: int, max_tokens: int
) -> SpeculativeDecoder:
    """A :class:`SpeculativeDecoder` for ``tokens`` after :func:`prefill`."""
    cache, sampler, pending = prefill(engine, tokens, params)
    controller = SpeculationController(max_draft)
    return SpeculativeDecoder(
        engine.model, cache, sampler, pending, tokens, max_tokens, controller=controller
    )


def speculative_tokens(
    engine: Engine, tokens: list[int], params: SamplingParams, max_draft: int
) -> tuple[list[int], SpeculationStatistics]:
    """One request decoded with speculation: the tokens ``TokenOutput`` kept, and the counters."""
    out = TokenOutput(engine.tokenizer, params, len(tokens), engine.context_length)
    decoder = prefilled_decoder(engine, tokens, params, max_draft, out.max_tokens)
    ids: list[int] = []
    while out.finish_reason is None:
        for token in decoder.step():
            ids.extend(out.feed(token).token_ids)
            if out.finish_reason is not None:
                break
    return ids, decoder.statistics()


def plain_tokens(engine: Engine, tokens: list[int], params: SamplingParams) -> list[int]:
    return [t for step in decode_alone(engine, tokens, params) for t in step.token_ids]


def _case(engine: Engine, case: Case, rounds: int, max_draft: int) -> dict[str, object]:
    tokens = engine.tokenize(TextPrompt(case.prompt))
    plain_tokens(engine, tokens, case.params)  # warm-up (compiles the sampler for this shape)
    speculative_tokens(engine, tokens, case.params, max_draft)
    plain_rates: list[float] = []
    spec_rates: list[float] = []
    ratios: list[float] = []
    same = True
    plain: list[int] = []
    spec: list[int] = []
    stats: SpeculationStatistics | None = None
    cpu_ratios: list[float] = []
    for i in range(rounds):
        cpu: dict[str, float] = {}
        for side in ("plain", "spec") if i % 2 == 0 else ("spec", "plain"):  # alternate first
            start, start_cpu = time.perf_counter(), time.process_time()
            if side == "plain":
                plain = plain_tokens(engine, tokens, case.params)
                plain_rates.append(len(plain) / (time.perf_counter() - start))
                cpu[side] = (time.process_time() - start_cpu) / len(plain)
            else:
                spec, stats = speculative_tokens(engine, tokens, case.params, max_draft)
                spec_rates.append(len(spec) / (time.perf_counter() - start))
                cpu[side] = (time.process_time() - start_cpu) / len(spec)
        same = same and plain == spec
        ratios.append(spec_rates[-1] / plain_rates[-1])
        cpu_ratios.append(cpu["plain"] / cpu["spec"])
    assert stats is not None
    return {
        "tokens": len(plain),
        "plain_tokens_per_s": statistics.median(plain_rates),
        "speculative_tokens_per_s": statistics.median(spec_rates),
        "ratio": statistics.median(ratios),
        "cpu_ratio": statistics.median(cpu_ratios),
        "identical_tokens": same,
        "acceptance_rate": stats.acceptance_rate,
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "verify_steps": stats.verify_steps,
        "plain_steps": stats.plain_steps,
    }


def run(
    max_tokens: int = 256,
    rounds: int = 15,
    max_draft: int = DEFAULT_SPECULATIVE_TOKENS,
    home: Path | None = None,
) -> dict[str, object]:
    from skulk.models import ensure_demo_model

    with tempfile.TemporaryDirectory(prefix="skulk-bench-spec-") as tmp:
        path = ensure_demo_model(home or Path(tmp))
        engine = Engine.load(Path(path), lambda done, total: None)
        warm_up(engine)
        results = {c.name: _case(engine, c, rounds, max_draft) for c in cases(max_tokens)}
    return {
        "model": "skulk-demo",
        "max_tokens": max_tokens,
        "rounds": rounds,
        "speculative_tokens": max_draft,
        "cases": results,
    }


def table(result: dict[str, Any]) -> str:
    lines = [
        f"speculative (k={result['speculative_tokens']}) vs plain, {result['rounds']} rounds, "
        f"{result['max_tokens']} max tokens",
        f"{'case':<14}{'plain tok/s':>13}{'spec tok/s':>12}{'ratio':>8}{'cpu':>7}{'accept':>8}"
        f"{'same':>6}",
    ]
    for name, c in result["cases"].items():
        lines.append(
            f"{name:<14}{c['plain_tokens_per_s']:>13.0f}{c['speculative_tokens_per_s']:>12.0f}"
            f"{c['ratio']:>8.2f}{c['cpu_ratio']:>7.2f}{c['acceptance_rate']:>8.2f}{c['identical_tokens']!s:>6}"
        )
    return "\n".join(lines)
