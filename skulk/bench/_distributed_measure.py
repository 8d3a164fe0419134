"""How ``bench distributed`` measures: open an instance (:func:`open_instance`), time requests
on it (:func:`time_requests`), and the rounds that pair every subject's run with the single
runner's runs around it (:func:`measure_all`), and the concurrent levels
(:func:`measure_concurrent`)."""

from __future__ import annotations

import itertools
import os
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from skulk.bench._distributed_setup import (
    COALESCED,
    CONFIG,
    HEARTBEAT,
    PROMPT,
    SINGLE,
    SUBJECTS,
    TINY_REPEATS,
    TINY_SHAPE,
    WARM_UP_TOKENS,
    Instance,
    Settings,
)
from skulk.runner import Runner, loopback_hosts, open_local_group, shard_specs
from skulk.wire.runner import (
    Finished,
    GenerationEnd,
    Prompt,
    RequestFailed,
    SamplingParams,
    TextPrompt,
    TokenChunk,
)


@attrs.frozen
class Sample:
    """The measured request(s) of one opened instance (medians), and its ranks' readings."""

    ttft_s: float
    ms_per_token: float
    tokens: int
    prompt_tokens: int
    finish_reason: str
    coalesced: bool
    rss_bytes: tuple[int, ...]
    mlx_bytes: tuple[int, ...]
    cpu_cores: tuple[float, ...]


class BenchmarkFailed(Exception):
    """A request of the benchmark failed or its runners gave no readings."""


@attrs.frozen
class Paired:
    """A subject's measured run and the single runner's runs right before and after it."""

    before: Sample
    subject: Sample
    after: Sample

    @property
    def base_ms_per_token(self) -> float:
        return (self.before.ms_per_token + self.after.ms_per_token) / 2

    @property
    def base_ttft_s(self) -> float:
        return (self.before.ttft_s + self.after.ttft_s) / 2


async def measure_all(
    settings: Settings, model: Path, tiny: Path | None
) -> tuple[list[Sample], dict[str, list[Paired]], dict[str, Sample]]:
    """The rounds (see the module doc), and the runtime readings (on ``tiny``; ``None``: the
    model is that tiny shape already, so the first readings of the rounds are the runtime's)."""
    runtime = {}
    if tiny is not None:
        for instance in (SINGLE, *SUBJECTS):
            async with open_instance(instance, tiny, TINY_SHAPE.layers) as runners:
                runtime[instance.name] = await time_requests(
                    runners, settings.max_tokens, TINY_REPEATS
                )
    layers = settings.shape.layers
    runs: dict[str, list[Paired]] = {i.name: [] for i in SUBJECTS}
    async with open_instance(SINGLE, model, layers) as single:
        singles = [await time_requests(single, settings.max_tokens)]
        for r in range(settings.rounds):
            for instance in SUBJECTS[r % len(SUBJECTS) :] + SUBJECTS[: r % len(SUBJECTS)]:
                async with open_instance(instance, model, layers) as runners:
                    sample = await time_requests(runners, settings.max_tokens)
                singles.append(await time_requests(single, settings.max_tokens))
                runs[instance.name].append(Paired(singles[-2], sample, singles[-1]))
    if not runtime:
        runtime = {SINGLE.name: singles[0], **{n: ps[0].subject for n, ps in runs.items()}}
    return singles, runs, runtime


async def measure_concurrent(settings: Settings, model: Path) -> dict[int, list[float]]:
    """``concurrent`` (see the module doc): by level, pipeline-2's aggregate tokens/s."""
    rates: dict[int, list[float]] = {n: [] for n in settings.concurrency}
    if not rates:
        return rates

    async def one(runner: Runner, rid: str, timed: list[Timed]) -> None:
        timed.append(await _generate(runner, rid, settings.max_tokens))

    async with open_instance(Instance("pipeline", 2), model, settings.shape.layers) as runners:
        for r in range(settings.rounds):
            for n in settings.concurrency:
                timed: list[Timed] = []
                start = time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for i in range(n):
                        nursery.start_soon(one, runners[0], f"concurrent-{r}-{n}-{i}", timed)
                wall = time.perf_counter() - start
                rates[n].append(sum(t.tokens for t in timed) / wall)
    return rates


@asynccontextmanager
async def open_instance(
    instance: Instance, model: Path, layers: int
) -> AsyncIterator[list[Runner]]:
    """The instance's runners, rank 0 first, ready and warmed up by one short request; all
    stopped when the block ends."""
    if instance.sharding is None:
        runner = Runner("bench", str(model), CONFIG)
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await _generate(runner, "warm-up", WARM_UP_TOKENS)
            yield [runner]
            nursery.cancel_scope.cancel()
        return
    specs = shard_specs(instance.sharding, loopback_hosts(instance.world), layers)
    async with open_local_group("bench", str(model), specs, CONFIG) as group:
        await _generate(group.runners[0], "warm-up", WARM_UP_TOKENS)
        yield group.runners


async def time_requests(runners: list[Runner], max_tokens: int, repeats: int = 1) -> Sample:
    """Time ``repeats`` requests on an open instance (the medians), then read its memory."""
    pids = [r.statistics().pid for r in runners]
    before = [_cpu_seconds(p) for p in pids]
    start = time.perf_counter()
    timed = [await _generate(runners[0], f"measured-{i}", max_tokens) for i in range(repeats)]
    wall = time.perf_counter() - start
    after = [_cpu_seconds(p) for p in pids]
    await trio.sleep(3 * HEARTBEAT)  # a heartbeat sent after the requests: its memory
    stats = [r.statistics() for r in runners]
    if any(s.rss_bytes is None or s.mlx_active_bytes is None for s in stats):
        raise BenchmarkFailed("a rank sent no heartbeat")
    reasons = {t.finish_reason for t in timed}
    return Sample(
        ttft_s=statistics.median(t.ttft_s for t in timed),
        ms_per_token=statistics.median(t.ms_per_token for t in timed),
        tokens=min(t.tokens for t in timed),
        prompt_tokens=timed[0].prompt_tokens,
        finish_reason=reasons.pop() if len(reasons) == 1 else "mixed",
        coalesced=any(t.coalesced for t in timed),
        rss_bytes=tuple(s.rss_bytes or 0 for s in stats),
        mlx_bytes=tuple(s.mlx_active_bytes or 0 for s in stats),
        cpu_cores=tuple(round((a - b) / wall, 3) for b, a in zip(before, after, strict=True)),
    )


@attrs.frozen
class Timed:
    ttft_s: float
    ms_per_token: float
    tokens: int
    prompt_tokens: int
    finish_reason: str
    coalesced: bool
    text: str = ""
    cached_tokens: int = 0


#: Numbers the measured prompts: each is new to every runner, so no prefix cache answers it
#: (a prompt repeated across requests would compare a cached TTFT with uncached ones).
_SERIAL = itertools.count()


async def _generate(runner: Runner, rid: str, max_tokens: int) -> Timed:
    """One greedy request of :data:`PROMPT` (numbered: never seen before), timed (see
    ``ms_per_token`` in the module doc)."""
    prompt = TextPrompt(f"{next(_SERIAL)}. {PROMPT.text}")
    return await timed_request(runner, rid, prompt, SamplingParams(0.0, max_tokens=max_tokens))


async def timed_request(runner: Runner, rid: str, prompt: Prompt, params: SamplingParams) -> Timed:
    """One request, timed: time to first token, decode ms/token, its text and usage."""
    start = time.perf_counter()
    first = finished = 0.0
    tokens = 0
    text: list[str] = []
    end: GenerationEnd | None = None
    async with runner.open_request(rid, prompt, params) as events:
        async for event in events:
            if isinstance(event, TokenChunk) and event.token_ids:
                first = first or time.perf_counter()
                tokens += len(event.token_ids)
                text.append(event.text)
            elif isinstance(event, Finished):
                end, finished = event.end, time.perf_counter()
            elif isinstance(event, RequestFailed):
                raise BenchmarkFailed(f"request failed: {event.reason}: {event.message}")
    if end is None:
        raise BenchmarkFailed(f"the runner went away: {runner.failure}")
    if tokens < 2:
        raise BenchmarkFailed(f"only {tokens} token(s) generated: no decode rate")
    coalesced = finished - first < COALESCED
    per_token = (finished - start) / tokens if coalesced else (finished - first) / (tokens - 1)
    return Timed(
        first - start,
        per_token * 1000,
        tokens,
        end.usage.prompt_tokens,
        end.finish_reason,
        coalesced,
        "".join(text),
        end.usage.cached_tokens,
    )


def _cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` (all its threads), from ``/proc``."""
    if pid is None:
        return 0.0
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
