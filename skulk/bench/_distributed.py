"""``python -m skulk.bench distributed``: what sharding one model over several runners costs.

Every instance is real runner processes driven through the runner layer (no node, no HTTP):
*single* is one :class:`~skulk.runner.Runner` holding the whole model, the subjects are
:func:`~skulk.runner.open_local_group` instances on loopback — ``pipeline-2``, ``pipeline-3``
(the layers split evenly) and ``tensor-2`` (every layer on half the heads and half the MLP).
The model is generated (:func:`~skulk.models._generated.write_generated_model`: a llama with
random float32 weights), by default large enough that one decode step is compute-bound here
(the default shape's ``ms_per_token`` is in the result; its header names the shape).

**Rounds.** The single runner is opened first and stays open (idle between its requests: it
only heartbeats). Each round measures every subject — in an order rotated every round — by
opening its group, serving one short warm-up request, timing the measured request and closing
the group, then timing a request on the single runner; so every subject's run lies between
two of single's, seconds apart, and nothing else of ours computes while one is timed. Every
request is the same text prompt, greedy, ``max_tokens`` tokens (the prompt is stop-free and
every run should end with ``length``; ``finish_reasons`` says). A subject's ratios are against
the mean of the single runs just before and after it; the medians over rounds are reported
(``by_round`` has every round's), so a noisy machine slows both sides of a ratio alike.

* ``ms_per_token``: decode time per token after the first, as rank 0's chunks reach this
  process (first token → ``Finished``, ÷ tokens - 1). Should this process not be scheduled
  while a short generation runs, its chunks arrive together and that span is empty: such a
  run (counted in ``coalesced_runs``) is timed from the request instead, ÷ tokens.
  ``tokens_per_s_ratio`` = single ms/token ÷ subject ms/token (goal for ``pipeline-2``: ≥ 0.9).
* ``ttft_ratio``: time from ``open_request`` to the first token, subject ÷ single.
* ``added_ms_per_token`` = subject ms/token - single ms/token. For a pipeline of n ranks
  ``hops`` = n: per token the hidden state crosses the n - 1 links between stages and the
  sampled token goes back from the last rank to rank 0 (the step's control block rides the
  same links in the same step); ``per_hop_ms`` = added ms/token ÷ hops. For tensor-n,
  ``all_sums_per_token`` = 2 * layers (after each attention and each MLP block) and
  ``per_all_sum_ms`` = added ms/token ÷ that.
* ``rss_mib`` by rank, from each runner's heartbeat after its measured request
  (``Runner.statistics().rss_bytes``), and ``rss_ratio`` = rank ÷ single. ``runtime_rss_mib``
  is the same reading, by rank, for the same kind of instance holding a tiny model (4 layers,
  hidden 64: the runtime alone, measured once before the rounds; with ``--tiny`` the first
  round's readings), and ``rss_ideal_ratio`` by rank = (that rank's runtime + (single -
  single's runtime) / n) ÷ single: the weights split n ways, the runtime paid by every rank.
* ``tiny_model``: the same instances on the tiny model, ``TINY_REPEATS`` requests each (the
  medians), measured once before the rounds: ``ms_per_token`` and the costs above, where
  compute is negligible, so the added time is the links and the lockstep loop themselves.
* ``cpu_cores`` by rank: CPU time the rank's process used during the measured request ÷ its
  wall time (from ``/proc``): how many cores a rank kept busy, computing or waiting.
* ``transfer``: :func:`skulk.bench._transfer.run` — fetching weights from a peer over one
  loopback link vs copying the same bytes locally (MB/s and ratios).
* ``concurrent`` (with ``--concurrency 1,4,8``): after the rounds, one ``pipeline-2`` group
  serves that many requests at once (each the same greedy request), once per level per
  round: ``tokens_per_s`` = every request's tokens ÷ the wall time from the first request to
  the last ``Finished`` (medians), and ``ratio`` = that ÷ the same at the first level.
  Concurrent requests share each decode step (continuous batching, see
  :mod:`skulk.runner._sharded_loop`), so the aggregate should grow with the level.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Literal

import attrs
import trio

from skulk.models._generated import ModelShape
from skulk.runner import Runner, RunnerConfig, loopback_hosts, open_local_group, shard_specs
from skulk.wire.runner import (
    Finished,
    GenerationEnd,
    RequestFailed,
    SamplingParams,
    TextPrompt,
    TokenChunk,
)

#: The default model: single-node decode about 35 ms/token on the 2-core VM of
#: docs/benchmarks.md (38M parameters, 153 MB of float32 weights).
DEFAULT_SHAPE = ModelShape(
    family="llama", layers=12, hidden_size=512, heads=8, kv_heads=4, intermediate_size=1536
)
#: ``--tiny``: the shape the tests use (every sharding divides it).
TINY_SHAPE = ModelShape(
    family="llama", layers=4, hidden_size=64, heads=4, kv_heads=2, intermediate_size=128
)
PROMPT = TextPrompt(
    "In the valley below the old mill the river turns twice before it reaches the sea, and "
    "the people who live along its banks have names for every bend, every stone and every "
    "season of the water."
)
HEARTBEAT = 0.25
WARM_UP_TOKENS = 8
#: Requests timed per instance of the tiny model (its figures are the medians).
TINY_REPEATS = 5
CONFIG = RunnerConfig(
    hello_timeout=120, load_timeout=600, warmup_timeout=300, progress_timeout=120,
    cancel_timeout=30, shutdown_grace=5, heartbeat_interval=HEARTBEAT,
)  # fmt: skip
MIB = 1 << 20
#: A decode span shorter than this means the chunks reached us together (see ``ms_per_token``).
COALESCED = 0.001
COLUMNS = ("instance", "tok/s", "ratio", "ms/tok", "+ms/tok", "ms/hop", "TTFT ms", "TTFT ratio",
           "RSS MiB", "RSS ratio", "ideal", "runtime MiB", "cores")  # fmt: skip


@attrs.frozen
class Instance:
    """What serves: one runner (``sharding`` None) or a sharded group of ``world`` ranks."""

    sharding: Literal["pipeline", "tensor"] | None
    world: int

    @property
    def name(self) -> str:
        return "single" if self.sharding is None else f"{self.sharding}-{self.world}"


SINGLE = Instance(None, 1)
SUBJECTS = (Instance("pipeline", 2), Instance("pipeline", 3), Instance("tensor", 2))


@attrs.frozen
class Settings:
    shape: ModelShape = DEFAULT_SHAPE
    max_tokens: int = 128
    rounds: int = 3
    files: int = 4
    seed: int = 1
    transfer_mib: int = 256
    transfer_rounds: int = 3
    concurrency: tuple[int, ...] = ()


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


@attrs.frozen
class Result:
    """Every reading of one run: ``singles`` in the order they ran, ``runs`` by subject name
    (one per round), ``runtime`` by instance name (on the tiny model)."""

    settings: Settings
    singles: list[Sample]
    runs: dict[str, list[Paired]]
    runtime: dict[str, Sample]
    transfer: dict[str, object]
    weights_bytes: int
    load_average: tuple[float, float]
    concurrent: dict[int, list[float]] = attrs.field(factory=dict)  # level → tokens/s by round

    def subject(self, instance: Instance) -> dict[str, object]:
        """The figures of one instance (medians over rounds; ratios against single)."""
        med = statistics.median
        pairs = self.runs.get(instance.name, [])
        mine = [p.subject for p in pairs] if pairs else self.singles
        ranks = range(instance.world)
        rss = [med(s.rss_bytes[r] for s in mine) for r in ranks]
        single_rss = med(s.rss_bytes[0] for s in self.singles)
        runtime = self.runtime[instance.name].rss_bytes
        weights = (single_rss - self.runtime[SINGLE.name].rss_bytes[0]) / instance.world
        ideal = [(runtime[r] + weights) / single_rss for r in ranks]
        out: dict[str, object] = {
            "ranks": instance.world,
            "tokens_per_s": round(1000 / med(s.ms_per_token for s in mine), 2),
            "ms_per_token": round(med(s.ms_per_token for s in mine), 2),
            "ttft_ms": round(med(s.ttft_s for s in mine) * 1000, 1),
        }
        if pairs:
            out["tokens_per_s_ratio"] = _ratio(
                p.base_ms_per_token / p.subject.ms_per_token for p in pairs
            )
            out["ttft_ratio"] = _ratio(p.subject.ttft_s / p.base_ttft_s for p in pairs)
        by_round: dict[str, list[float]] = {
            "ms_per_token": [round(s.ms_per_token, 2) for s in mine],
            "ttft_ms": [round(s.ttft_s * 1000, 1) for s in mine],
        }
        if pairs:
            by_round["single_ms_per_token"] = [round(p.base_ms_per_token, 2) for p in pairs]
            by_round["tokens_per_s_ratio"] = [
                round(p.base_ms_per_token / p.subject.ms_per_token, 3) for p in pairs
            ]
        out["by_round"] = by_round
        out.update(
            {
                "rss_mib": [round(v / MIB, 1) for v in rss],
                "rss_ratio": [round(v / single_rss, 3) for v in rss],
                "rss_ideal_ratio": [round(v, 3) for v in ideal],
                "runtime_rss_mib": [round(v / MIB, 1) for v in runtime],
                "mlx_active_mib": [
                    round(med(s.mlx_bytes[r] for s in mine) / MIB, 1) for r in ranks
                ],
                "cpu_cores": [round(med(s.cpu_cores[r] for s in mine), 2) for r in ranks],
            }
        )
        tiny = self.runtime[instance.name]
        out["tiny_model"] = {"ms_per_token": round(tiny.ms_per_token, 3)}
        if not pairs:
            return out
        added = med(p.subject.ms_per_token - p.base_ms_per_token for p in pairs)
        out.update(_costs(instance, added, self.settings.shape.layers))
        tiny_added = tiny.ms_per_token - self.runtime[SINGLE.name].ms_per_token
        out["tiny_model"] = {
            "ms_per_token": round(tiny.ms_per_token, 3),
            **_costs(instance, tiny_added, TINY_SHAPE.layers),
        }
        return out

    def all_samples(self) -> list[Sample]:
        return [*self.singles, *(p.subject for ps in self.runs.values() for p in ps)]

    def as_dict(self) -> dict[str, object]:
        shape = self.settings.shape
        runs = self.all_samples()
        reasons = sorted({s.finish_reason for s in runs})
        return {
            "benchmark": "distributed",
            "model": {
                **attrs.asdict(shape),
                "dtype": "float32",
                "files": self.settings.files,
                "weights_mb": round(self.weights_bytes / 1e6, 1),
                "params_m": round(self.weights_bytes / 4 / 1e6, 1),
            },
            "max_tokens": self.settings.max_tokens,
            "rounds": self.settings.rounds,
            "prompt_tokens": runs[0].prompt_tokens,
            "tokens": min(s.tokens for s in runs),
            "finish_reasons": reasons,
            "coalesced_runs": sum(s.coalesced for s in runs),
            "load_average_1m": [round(v, 2) for v in self.load_average],
            "single": self.subject(SINGLE),
            "subjects": {i.name: self.subject(i) for i in SUBJECTS},
            "transfer": self.transfer,
            **({"concurrent": self._concurrent()} if self.concurrent else {}),
        }

    def _concurrent(self) -> dict[str, object]:
        """pipeline-2's aggregate tokens/s by number of concurrent requests (JSON keys)."""
        rates = {n: statistics.median(v) for n, v in self.concurrent.items()}
        base = rates[min(rates)]
        return {
            "instance": "pipeline-2",
            "tokens_per_s": {str(n): round(r, 1) for n, r in rates.items()},
            "ratio": {str(n): round(r / base, 2) for n, r in rates.items()},
            "by_round": {str(n): [round(v, 1) for v in vs] for n, vs in self.concurrent.items()},
        }

    def table(self) -> str:
        s = self.settings.shape
        params = round(self.weights_bytes / 4 / 1e6, 1)
        lines = [
            f"model: {s.family}, {s.layers} layers, hidden {s.hidden_size}, {s.heads} heads "
            f"({s.kv_heads} kv), MLP {s.intermediate_size}, vocab {s.vocab_size}: {params}M "
            f"params, float32; {self.settings.max_tokens} tokens greedy, {self.settings.rounds} "
            f"rounds; load average {self.load_average[0]:.2f} → {self.load_average[1]:.2f}",
        ]
        rows: list[tuple[object, ...]] = [COLUMNS]
        for inst in (SINGLE, *SUBJECTS):
            f = self.subject(inst)
            hop = f.get("per_hop_ms", f.get("per_all_sum_ms", "-"))
            rows.append(
                (inst.name, f["tokens_per_s"], f.get("tokens_per_s_ratio", 1), f["ms_per_token"],
                 f.get("added_ms_per_token", "-"), hop, f["ttft_ms"], f.get("ttft_ratio", 1),
                 *(_slashed(f[k]) for k in ("rss_mib", "rss_ratio", "rss_ideal_ratio",
                                            "runtime_rss_mib", "cpu_cores")))
            )  # fmt: skip
        widths = [max(len(str(row[c])) for row in rows) for c in range(len(COLUMNS))]
        lines += [
            "  ".join(f"{v!s:<{w}}" for v, w in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        lines.append(
            "(by rank: RSS, RSS ratio, ideal, runtime, cores; tensor-2's ms/hop is per all_sum)"
        )
        tiny = []
        for inst in SUBJECTS:
            costs = self.subject(inst)["tiny_model"]
            assert isinstance(costs, dict)
            unit = "hop" if "per_hop_ms" in costs else "all_sum"
            tiny.append(
                f"{inst.name} {costs['added_ms_per_token']:+} ms/token = "
                f"{costs.get('per_hop_ms', costs.get('per_all_sum_ms'))} ms/{unit}"
            )
        lines.append("tiny model (the link without compute): " + ", ".join(tiny))
        t = self.transfer
        lines.append(
            f"peer weight transfer: {t.get('fetch_mb_s')} MB/s over one loopback link vs "
            f"{t.get('copy_mb_s')} MB/s local copy = {t.get('fetch_vs_copy')} "
            f"({t.get('fetch_vs_copy_fsync')} of a copy + fsync at {t.get('copy_fsync_mb_s')} MB/s)"
        )
        if self.concurrent:
            c = self._concurrent()
            rates, ratios = c["tokens_per_s"], c["ratio"]
            assert isinstance(rates, dict) and isinstance(ratios, dict)
            levels = ", ".join(f"{n}: {rates[n]} tok/s ({ratios[n]}x)" for n in rates)
            lines.append(f"pipeline-2 aggregate by concurrent requests: {levels}")
        return "\n".join(lines)


def _costs(instance: Instance, added_ms: float, layers: int) -> dict[str, float | int]:
    """What ``added_ms`` per token costs per hop (pipeline) or per all_sum (tensor)."""
    costs: dict[str, float | int] = {"added_ms_per_token": round(added_ms, 3)}
    if instance.sharding == "pipeline":
        costs["hops"] = instance.world
        costs["per_hop_ms"] = round(added_ms / instance.world, 3)
    else:
        costs["all_sums_per_token"] = 2 * layers
        costs["per_all_sum_ms"] = round(added_ms / (2 * layers), 3)
    return costs


def _ratio(values: Iterable[float]) -> float:
    return round(statistics.median(values), 3)


def _slashed(value: object) -> str:
    return "/".join(map(str, value)) if isinstance(value, list) else str(value)


def run(settings: Settings) -> Result:
    """Generate the model, measure every instance over ``settings.rounds`` rounds, then the
    weight transfer (see the module doc)."""
    from skulk.bench import _transfer
    from skulk.models import ensure_demo_model
    from skulk.models._generated import write_generated_model

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="skulk-bench-distributed-") as tmp:
        root = Path(tmp)
        demo = ensure_demo_model(root / "home")
        model = write_generated_model(
            root / "model", settings.shape, demo, files=settings.files, seed=settings.seed
        )
        weights = sum(f.stat().st_size for f in model.glob("*.safetensors"))
        tiny = None
        if settings.shape != TINY_SHAPE:
            tiny = write_generated_model(root / "tiny", TINY_SHAPE, demo, seed=settings.seed)
        singles, runs, runtime = trio.run(_measure_all, settings, model, tiny)
        concurrent = trio.run(_measure_concurrent, settings, model)
    transfer = _transfer.run(settings.transfer_mib, settings.transfer_rounds)
    load = (load_before, os.getloadavg()[0])
    result = Result(settings, singles, runs, runtime, transfer, weights, load, concurrent)
    if any(s.finish_reason != "length" for s in result.all_samples()):
        print("warning: a run ended before max_tokens; rates are per token", file=sys.stderr)
    return result


async def _measure_all(
    settings: Settings, model: Path, tiny: Path | None
) -> tuple[list[Sample], dict[str, list[Paired]], dict[str, Sample]]:
    """The rounds (see the module doc), and the runtime readings (on ``tiny``; ``None``: the
    model is that tiny shape already, so the first readings of the rounds are the runtime's)."""
    runtime = {}
    if tiny is not None:
        for instance in (SINGLE, *SUBJECTS):
            async with _open(instance, tiny, TINY_SHAPE.layers) as runners:
                runtime[instance.name] = await _time(runners, settings.max_tokens, TINY_REPEATS)
    layers = settings.shape.layers
    runs: dict[str, list[Paired]] = {i.name: [] for i in SUBJECTS}
    async with _open(SINGLE, model, layers) as single:
        singles = [await _time(single, settings.max_tokens)]
        for r in range(settings.rounds):
            for instance in SUBJECTS[r % len(SUBJECTS) :] + SUBJECTS[: r % len(SUBJECTS)]:
                async with _open(instance, model, layers) as runners:
                    sample = await _time(runners, settings.max_tokens)
                singles.append(await _time(single, settings.max_tokens))
                runs[instance.name].append(Paired(singles[-2], sample, singles[-1]))
    if not runtime:
        runtime = {SINGLE.name: singles[0], **{n: ps[0].subject for n, ps in runs.items()}}
    return singles, runs, runtime


async def _measure_concurrent(settings: Settings, model: Path) -> dict[int, list[float]]:
    """``concurrent`` (see the module doc): by level, pipeline-2's aggregate tokens/s."""
    rates: dict[int, list[float]] = {n: [] for n in settings.concurrency}
    if not rates:
        return rates

    async def one(runner: Runner, rid: str, timed: list[_Timed]) -> None:
        timed.append(await _generate(runner, rid, settings.max_tokens))

    async with _open(Instance("pipeline", 2), model, settings.shape.layers) as runners:
        for r in range(settings.rounds):
            for n in settings.concurrency:
                timed: list[_Timed] = []
                start = time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for i in range(n):
                        nursery.start_soon(one, runners[0], f"concurrent-{r}-{n}-{i}", timed)
                wall = time.perf_counter() - start
                rates[n].append(sum(t.tokens for t in timed) / wall)
    return rates


@asynccontextmanager
async def _open(instance: Instance, model: Path, layers: int) -> AsyncIterator[list[Runner]]:
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


async def _time(runners: list[Runner], max_tokens: int, repeats: int = 1) -> Sample:
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
class _Timed:
    ttft_s: float
    ms_per_token: float
    tokens: int
    prompt_tokens: int
    finish_reason: str
    coalesced: bool


async def _generate(runner: Runner, rid: str, max_tokens: int) -> _Timed:
    """One greedy request of :data:`PROMPT`, timed (see ``ms_per_token`` in the module doc)."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    start = time.perf_counter()
    first = finished = 0.0
    tokens = 0
    end: GenerationEnd | None = None
    async with runner.open_request(rid, PROMPT, params) as events:
        async for event in events:
            if isinstance(event, TokenChunk) and event.token_ids:
                first = first or time.perf_counter()
                tokens += len(event.token_ids)
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
    return _Timed(
        first - start,
        per_token * 1000,
        tokens,
        end.usage.prompt_tokens,
        end.finish_reason,
        coalesced,
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


def settings_from(
    *,
    tiny: bool,
    layers: int | None,
    hidden_size: int | None,
    heads: int | None,
    kv_heads: int | None,
    intermediate_size: int | None,
    max_tokens: int,
    rounds: int,
    transfer_mib: int,
    transfer_rounds: int,
    concurrency: Iterable[int] = (),
) -> Settings:
    """Settings from the command line: ``tiny`` starts from :data:`TINY_SHAPE`, any shape
    option given overrides."""
    base = TINY_SHAPE if tiny else DEFAULT_SHAPE
    shape = ModelShape(
        family=base.family,
        layers=base.layers if layers is None else layers,
        hidden_size=base.hidden_size if hidden_size is None else hidden_size,
        heads=base.heads if heads is None else heads,
        kv_heads=base.kv_heads if kv_heads is None else kv_heads,
        intermediate_size=base.intermediate_size
        if intermediate_size is None
        else intermediate_size,
    )
    return Settings(
        shape=shape,
        max_tokens=max_tokens,
        rounds=rounds,
        transfer_mib=transfer_mib,
        transfer_rounds=transfer_rounds,
        concurrency=tuple(concurrency),
    )
