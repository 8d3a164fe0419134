"""The sampled workload of ``bench load --modes sharegpt`` and what is reported of it (sans-IO).

**Requests** (:func:`workload`): a seeded draw of chat requests whose lengths follow a
ShareGPT-like shape (:class:`Shape`): prompt and output lengths log-normal, heavy-tailed,
clipped; every request samples at ``temperature`` 0.7 with a seed of its own. The prompts are
made of plain words (about one token each with the demo tokenizer), each opening with its
request number so no two share a prefix beyond the chat template. Nothing is downloaded.

**Arrivals** (:func:`poisson_offsets`): a Poisson process at a given rate (exponential gaps,
seeded), or — the fixed-concurrency sweep — ``c`` clients each sending its next request when
its last one ended.

**Reports** (:func:`summarize`), per server and setting, in the terms of ``vllm bench serve``:
request throughput and output tokens/s over the run's wall time; TTFT (request sent → first
content), TPOT (first content → end, per output token after the first) and ITL (the gaps
between content chunks — a node that batches tokens per ``--stream-interval`` sends fewer,
larger chunks, so compare TPOT across servers) as mean, p50 and p99; **goodput**: the share,
and the rate, of requests within both SLOs (:class:`Slo`).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence

import attrs

from skulk.bench._load_modes import WORDS


@attrs.frozen
class Shape:
    """Log-normal lengths: ``median`` and ``sigma`` (of the log), clipped to ``[low, high]``.
    The defaults scale ShareGPT's shape (prompts a few hundred tokens, answers a few hundred,
    both heavy-tailed) to a 2048-token context on a small CPU."""

    prompt_median: int = 96
    prompt_sigma: float = 0.9
    prompt_low: int = 8
    prompt_high: int = 768
    output_median: int = 96
    output_sigma: float = 0.7
    output_low: int = 8
    output_high: int = 384
    temperature: float = 0.7


SHAREGPT = Shape()


@attrs.frozen
class Slo:
    """A request is *good* when its TTFT and its TPOT are both within these (seconds)."""

    ttft_s: float = 1.0
    tpot_s: float = 0.1


@attrs.frozen
class Request:
    """One request of the workload: its prompt, output budget and sampling seed."""

    prompt: str
    max_tokens: int
    seed: int


@attrs.frozen
class Outcome:
    """One request as the client saw it (``time.perf_counter`` seconds): sent, each content
    chunk, end, and the output tokens the server counted."""

    sent: float
    chunks: tuple[float, ...]
    end: float
    tokens: int

    @property
    def ttft(self) -> float:
        return (self.chunks[0] if self.chunks else self.end) - self.sent

    @property
    def tpot(self) -> float | None:
        if self.tokens < 2 or not self.chunks:
            return None
        return (self.end - self.chunks[0]) / (self.tokens - 1)




def _lognormal(rng: random.Random, median: int, sigma: float, low: int, high: int) -> int:
    return max(low, min(high, round(rng.lognormvariate(math.log(median), sigma))))


def workload(seed: int, count: int, shape: Shape = SHAREGPT) -> list[Request]:
    """``count`` requests drawn with ``seed`` (the same seed, the same requests)."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        words = _lognormal(
            rng, shape.prompt_median, shape.prompt_sigma, shape.prompt_low, shape.prompt_high
        )
        text = " ".join(rng.choice(WORDS) for _ in range(words))
        tokens = _lognormal(
            rng, shape.output_median, shape.output_sigma, shape.output_low, shape.output_high
        )
        out.append(Request(f"Request {seed}-{i}: {text}", tokens, rng.randrange(2**31)))
    return out


def poisson_offsets(seed: int, rate: float, count: int) -> list[float]:
    """When each of ``count`` requests is sent, seconds from the start, at ``rate``/s."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, not {rate}")
    rng = random.Random(seed)
    at, out = 0.0, []
    for _ in range(count):
        out.append(at)
        at += rng.expovariate(rate)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile ``q`` (0-100) of ``values`` (``nan`` for none)."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _spread(values: Sequence[float], scale: float = 1000.0) -> dict[str, float]:
    """Mean, p50 and p99 of ``values`` (milliseconds by default), rounded."""
    if not values:
        return {"mean": math.nan, "p50": math.nan, "p99": math.nan}
    return {
        "mean": round(statistics.fmean(values) * scale, 2),
        "p50": round(percentile(values, 50) * scale, 2),
        "p99": round(percentile(values, 99) * scale, 2),
    }


def summarize(outcomes: Sequence[Outcome], wall_s: float, slo: Slo) -> dict[str, object]:
    """The figures of one run (see the module doc); times in ms, rates per second."""
    tpots = [t for o in outcomes if (t := o.tpot) is not None]
    itls = [b - a for o in outcomes for a, b in zip(o.chunks, o.chunks[1:], strict=False)]
    good = [
        o for o in outcomes if o.ttft <= slo.ttft_s and (o.tpot is None or o.tpot <= slo.tpot_s)
    ]
    return {
        "requests": len(outcomes),
        "wall_s": round(wall_s, 3),
        "requests_per_s": round(len(outcomes) / wall_s, 3),
        "output_tokens_per_s": round(sum(o.tokens for o in outcomes) / wall_s, 1),
        "ttft_ms": _spread([o.ttft for o in outcomes]),
        "tpot_ms": _spread(tpots),
        "itl_ms": _spread(itls),
        "goodput_share": round(len(good) / len(outcomes), 3) if outcomes else math.nan,
        "goodput_per_s": round(len(good) / wall_s, 3),
    }
