"""``python -m skulk.bench pipeline``: what a pipeline-2 rank costs while it waits for the other
rank, and what the instance serves, in three variants (:data:`VARIANTS`): ``overlap`` as
shipped (the doorbell, :mod:`skulk.engine._doorbell`: a waiting rank sleeps; and two decode
micro-batches in flight, :mod:`skulk.engine._sharded_forward`), ``turns`` (the doorbell, one
batch: ``SKULK_PIPELINE_OVERLAP=off``, the ranks take turns) and ``spin`` (neither:
``SKULK_RING_DOORBELL=off``, a waiting rank spins in mlx's ring receive, as before both).

Every instance is a real :func:`~skulk.runner.open_local_group` on loopback (two runner
processes). Each round measures every variant, in an order rotated every round; the medians
over rounds are reported (``by_round`` has every round's figures).

* ``waiting`` (``overlap`` and ``spin`` only; the tiny model, 4 layers, hidden 64: compute
  is negligible): the *other* rank is made slow (the ``slow@decode:SLOW`` fault hook sleeps
  ``--slow`` seconds at each decode step, on that rank only), so the rank under test spends
  the request waiting: rank 0 for rank 1's half of each pass (``rank0_waits``), or rank 1 for
  rank 0's next message (``rank1_waits``). The figure is the waiting rank's *cores*: CPU
  seconds of its process (all threads, from ``/proc``) ÷ the request's wall time (goal:
  < 0.1). ``idle`` is both ranks' cores over ``--idle`` seconds with no request (the first
  group, after its request).
* ``streams`` (the default model of ``bench distributed``, 12 layers, hidden 512: a decode
  step is compute-bound): one group per variant and round serves each level's N concurrent
  greedy requests (``--streams``, default 1 and 8) of ``--max-tokens`` tokens:
  ``tokens_per_s`` = every request's tokens ÷ the wall time from the first request to the
  last ``Finished``; ``cores`` by rank = the rank's CPU seconds ÷ that wall time, i.e. how
  busy it kept a core (with the doorbell a waiting rank costs nothing, so this is the rank's
  busy fraction; without it, waiting counts as busy). ``overlap_vs_turns`` and
  ``overlap_vs_spin``: tokens/s ratios (medians of the rounds' ratios).
  ``same_text``: every request's text is the same in every variant (prompts are numbered by
  level and stream, the same in each).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from skulk.bench._distributed_measure import BenchmarkFailed, Timed, _cpu_seconds, timed_request
from skulk.bench._distributed_setup import CONFIG, DEFAULT_SHAPE, PROMPT, TINY_SHAPE
from skulk.bench._load import never_end
from skulk.engine import DOORBELL_ENV, OVERLAP_ENV
from skulk.models import ModelShape
from skulk.runner import LocalGroup, loopback_hosts, open_local_group, shard_specs
from skulk.wire.runner import SamplingParams, TextPrompt

#: What serves: as shipped (the doorbell, micro-batches overlapping), the doorbell with one
#: batch (the ranks take turns), and neither (a waiting rank spins in mlx's receive).
VARIANTS = ("overlap", "turns", "spin")
#: The variants whose waiting ranks are measured (overlap and turns wait alike).
WAITING = ("overlap", "spin")
_ENV = {"overlap": {}, "turns": {OVERLAP_ENV: "off"}, "spin": {DOORBELL_ENV: "off"}}
#: Tokens of a ``waiting`` request (each decode step waits ``--slow`` seconds).
WAIT_TOKENS = 12


@attrs.frozen
class Settings:
    rounds: int = 3
    streams: tuple[int, ...] = (1, 8)
    max_tokens: int = 64
    slow: float = 0.1
    idle: float = 3.0
    shape: ModelShape = DEFAULT_SHAPE


@contextmanager
def variant(name: str) -> Iterator[None]:
    """Runners started inside inherit the variant's environment (see :data:`VARIANTS`)."""
    old = {key: os.environ.pop(key, None) for key in (DOORBELL_ENV, OVERLAP_ENV)}
    os.environ.update(_ENV[name])
    try:
        yield
    finally:
        for key, value in old.items():
            os.environ.pop(key, None)
            if value is not None:
                os.environ[key] = value


def _cores(group: LocalGroup) -> tuple[list[int | None], list[float]]:
    pids = [r.statistics().pid for r in group.runners]
    return pids, [_cpu_seconds(p) for p in pids]


def _since(pids: list[int | None], before: list[float], wall: float) -> list[float]:
    return [round((_cpu_seconds(p) - b) / wall, 3) for p, b in zip(pids, before, strict=True)]


def _params(max_tokens: int) -> SamplingParams:
    return SamplingParams(0.0, max_tokens=max_tokens)


async def measure_waiting(settings: Settings, tiny: Path, name: str) -> dict[str, Any]:
    """One round of ``waiting`` for variant ``name`` (see the module doc)."""
    out: dict[str, Any] = {}
    for waiting in (0, 1):
        specs = shard_specs("pipeline", loopback_hosts(2), TINY_SHAPE.layers)
        faults = {1 - waiting: f"slow@decode:{settings.slow}"}
        with variant(name):
            async with open_local_group("tiny", str(tiny), specs, CONFIG, faults=faults) as group:
                rank0 = group.runners[0]
                await timed_request(rank0, "warm-up", TextPrompt("warm"), _params(2))
                pids, before = _cores(group)
                start = time.perf_counter()
                prompt = TextPrompt(f"wait {waiting}. {PROMPT.text}")
                await timed_request(rank0, "waiting", prompt, _params(WAIT_TOKENS))
                out[f"rank{waiting}_waits"] = _since(pids, before, time.perf_counter() - start)[
                    waiting
                ]
                if waiting == 0:
                    pids, before = _cores(group)
                    start = time.perf_counter()
                    await trio.sleep(settings.idle)
                    out["idle"] = _since(pids, before, time.perf_counter() - start)
    return out


async def measure_streams(
    settings: Settings, model: Path, name: str
) -> tuple[dict[int, dict[str, Any]], dict[str, str]]:
    """One round of ``streams`` for variant ``name``: by level, its figures; and every
    request's text by its prompt."""
    figures: dict[int, dict[str, Any]] = {}
    texts: dict[str, str] = {}
    specs = shard_specs("pipeline", loopback_hosts(2), settings.shape.layers)
    with variant(name):
        async with open_local_group("bench", str(model), specs, CONFIG) as group:
            rank0 = group.runners[0]
            await timed_request(rank0, "warm-up", TextPrompt("warm"), _params(4))
            for n in settings.streams:
                timed: dict[str, Timed] = {}

                async def one(i: int, n: int = n, timed: dict[str, Timed] = timed) -> None:
                    prompt = f"{n}-{i}. {PROMPT.text}"
                    timed[prompt] = await timed_request(
                        rank0, f"s{n}-{i}", TextPrompt(prompt), _params(settings.max_tokens)
                    )

                pids, before = _cores(group)
                start = time.perf_counter()
                async with trio.open_nursery() as nursery:
                    for i in range(n):
                        nursery.start_soon(one, i)
                wall = time.perf_counter() - start
                figures[n] = {
                    "tokens_per_s": round(sum(t.tokens for t in timed.values()) / wall, 2),
                    "cores": _since(pids, before, wall),
                }
                texts.update({p: t.text for p, t in timed.items()})
    return figures, texts


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


async def measure(settings: Settings, model: Path, tiny: Path) -> dict[str, Any]:
    rounds: list[dict[str, Any]] = []
    texts: dict[str, dict[str, str]] = {v: {} for v in VARIANTS}
    for r in range(settings.rounds):
        one: dict[str, Any] = {}
        k = r % len(VARIANTS)
        for name in VARIANTS[k:] + VARIANTS[:k]:
            waiting = await measure_waiting(settings, tiny, name) if name in WAITING else {}
            streams, seen = await measure_streams(settings, model, name)
            texts[name].update(seen)
            one[name] = {"waiting": waiting, "streams": streams}
        rounds.append(one)
    return summarize(settings, rounds, texts)


def summarize(
    settings: Settings, rounds: list[dict[str, Any]], texts: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """The medians over ``rounds`` (see the module doc)."""
    waiting: dict[str, Any] = {}
    for name in WAITING:
        got = [r[name]["waiting"] for r in rounds]
        waiting[name] = {
            "rank0_waits": _median([g["rank0_waits"] for g in got]),
            "rank1_waits": _median([g["rank1_waits"] for g in got]),
            "idle": [_median([g["idle"][k] for g in got]) for k in (0, 1)],
        }
    streams: dict[str, Any] = {}
    for n in settings.streams:
        level: dict[str, Any] = {}
        for name in VARIANTS:
            got = [r[name]["streams"][n] for r in rounds]
            level[name] = {
                "tokens_per_s": _median([g["tokens_per_s"] for g in got]),
                "cores": [_median([g["cores"][k] for g in got]) for k in (0, 1)],
            }
        for base in ("turns", "spin"):
            ratios = [
                r["overlap"]["streams"][n]["tokens_per_s"] / r[base]["streams"][n]["tokens_per_s"]
                for r in rounds
            ]
            level[f"overlap_vs_{base}"] = _median(ratios)
        streams[str(n)] = level
    shape = settings.shape
    return {
        "model": f"llama, {shape.layers} layers, hidden {shape.hidden_size}",
        "rounds": settings.rounds,
        "max_tokens": settings.max_tokens,
        "slow_s": settings.slow,
        "waiting": waiting,
        "streams": streams,
        "same_text": texts["overlap"] == texts["turns"] == texts["spin"],
        "by_round": rounds,
    }


def run(settings: Settings) -> dict[str, Any]:
    from skulk.models import ensure_demo_model, write_generated_model

    with tempfile.TemporaryDirectory(prefix="skulk-bench-pipeline-") as tmp:
        root = Path(tmp)
        demo = ensure_demo_model(root / "home")
        model = write_generated_model(root / "model", settings.shape, demo, seed=1)
        tiny = write_generated_model(root / "tiny", TINY_SHAPE, demo, seed=1)
        for m in (model, tiny):
            never_end(m)
        result = trio.run(measure, settings, model, tiny)
    if not result["same_text"]:
        raise BenchmarkFailed("the variants wrote different texts")
    return result


def table(result: dict[str, Any]) -> str:
    lines = [
        f"pipeline-2, {result['model']}; {result['rounds']} rounds (medians); "
        f"the other rank slowed {result['slow_s']} s a step while one waits",
        f"{'':<10}{'rank 0 waits':>14}{'rank 1 waits':>14}{'idle r0/r1':>14}",
    ]
    for name in WAITING:
        w = result["waiting"][name]
        idle = f"{w['idle'][0]}/{w['idle'][1]}"
        lines.append(f"{name:<10}{w['rank0_waits']:>14}{w['rank1_waits']:>14}{idle:>14}")
    lines.append("(cores: CPU seconds of the rank's process ÷ wall time)")
    lines.append(f"{'streams':<10}{'variant':<10}{'tok/s':>10}{'cores r0/r1':>14}{'overlap ÷':>12}")
    for n, level in result["streams"].items():
        for name in VARIANTS:
            v = level[name]
            cores = f"{v['cores'][0]}/{v['cores'][1]}"
            ratio = str(level.get(f"overlap_vs_{name}", ""))
            lines.append(f"{n:<10}{name:<10}{v['tokens_per_s']:>10}{cores:>14}{ratio:>12}")
    lines.append(f"same text in every variant: {result['same_text']}")
    return "\n".join(lines)


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "pipeline", help="pipeline-2: a waiting rank's CPU; overlap, turns, spin"
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--streams", default="1,8", help="concurrent requests (default 1,8)")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--slow", type=float, default=0.1, help="the other rank's s a step")
    parser.add_argument("--idle", type=float, default=3.0, help="seconds measured idle")
    parser.add_argument("--tiny", action="store_true", help="streams on the tiny model too")


def main(args: argparse.Namespace) -> int:
    settings = Settings(
        rounds=args.rounds,
        streams=tuple(int(n) for n in args.streams.split(",") if n),
        max_tokens=args.max_tokens,
        slow=args.slow,
        idle=args.idle,
        shape=TINY_SHAPE if args.tiny else DEFAULT_SHAPE,
    )
    result = run(settings)
    if args.json:
        print(json.dumps(result))
    else:
        print(table(result))
        print(json.dumps({k: v for k, v in result.items() if k != "by_round"}, indent=2))
    return 0
