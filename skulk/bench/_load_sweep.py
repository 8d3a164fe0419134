"""``bench load --modes sharegpt``: the sampled workload (:mod:`skulk.bench._load_workload`)
against every server given, in a fixed-concurrency sweep (``--levels``) and a Poisson rate
sweep (``--rates``).

Each round draws a new workload (``--requests`` requests, seeded by the setting and the round:
no prompt is sent twice to one server, so no prefix cache serves a round from an earlier one)
and sends it to each server in turn, the order alternating by round. Every figure is the median
over rounds of that run's figure; each ratio is the median over rounds of the per-round ratio
to the last server (``mlx_lm.server``). The headline ratios: output tokens/s, TTFT p99 and
goodput per second.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import attrs
import httpx
import trio

from skulk.bench._load_client import Stream, chat_body, http_client, stream
from skulk.bench._load_servers import Server
from skulk.bench._load_workload import (
    SHAREGPT,
    Outcome,
    Request,
    Slo,
    poisson_offsets,
    summarize,
    workload,
)

#: The SLOs goodput counts against (seconds): stated here, reported with the figures.
SLO = Slo(ttft_s=1.0, tpot_s=0.1)


def _body(server: Server, request: Request) -> dict[str, object]:
    messages = [{"role": "user", "content": request.prompt}]
    return chat_body(server, messages, request.max_tokens, SHAREGPT.temperature, request.seed)


def _outcome(s: Stream) -> Outcome:
    return Outcome(s.sent, s.chunks, s.end, s.tokens)


async def closed_loop(
    client: httpx.AsyncClient, server: Server, requests: Sequence[Request], concurrency: int
) -> tuple[list[Outcome], float]:
    """``concurrency`` clients, each sending its next request when its last one ended."""
    todo = list(reversed(requests))
    done: list[Outcome] = []

    async def worker() -> None:
        while todo:
            done.append(_outcome(await stream(client, server.url, _body(server, todo.pop()))))

    start = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(concurrency):
            nursery.start_soon(worker)
    return done, time.perf_counter() - start


async def open_loop(
    client: httpx.AsyncClient, server: Server, requests: Sequence[Request], offsets: Sequence[float]
) -> tuple[list[Outcome], float]:
    """Each request sent at its offset (seconds from the start), whatever is still running."""
    done: list[Outcome] = []
    start = trio.current_time()
    began = time.perf_counter()

    async def one(request: Request, at: float) -> None:
        await trio.sleep_until(start + at)
        done.append(_outcome(await stream(client, server.url, _body(server, request))))

    async with trio.open_nursery() as nursery:
        for request, at in zip(requests, offsets, strict=True):
            nursery.start_soon(one, request, at)
    return done, time.perf_counter() - began


def _median(runs: Sequence[dict[str, object]]) -> dict[str, object]:
    """The median of each figure over ``runs`` (nested dicts figure by figure)."""
    out: dict[str, object] = {}
    for key, value in runs[0].items():
        if isinstance(value, dict):
            out[key] = _median([r[key] for r in runs])  # type: ignore[misc]
        elif isinstance(value, int | float):
            out[key] = round(statistics.median(float(r[key]) for r in runs), 3)  # type: ignore[arg-type]
    return out


def _ratio(ours: dict[str, object], theirs: dict[str, object], *path: str) -> float:
    a: object = ours
    b: object = theirs
    for key in path:
        assert isinstance(a, dict) and isinstance(b, dict)
        a, b = a[key], b[key]
    assert isinstance(a, int | float) and isinstance(b, int | float)
    return float(a) / float(b) if b else float("nan")


async def sharegpt(
    servers: Sequence[Server], levels: Sequence[int], rates: Sequence[float], rounds: int,
    requests: int,
) -> dict[str, object]:  # fmt: skip
    """The sweep over ``levels`` then ``rates`` (see the module doc)."""
    baseline = servers[-1]
    settings = [("concurrency", float(c)) for c in levels] + [("rate", r) for r in rates]
    figures: dict[str, object] = {
        "shape": attrs.asdict(SHAREGPT),
        "slo": {"ttft_s": SLO.ttft_s, "tpot_s": SLO.tpot_s},
        "requests": requests,
        "baseline": baseline.name,
    }
    async with http_client(max([*levels, requests])) as client:
        for server in servers:  # warm-up: compile, allocate, fill nothing that is measured
            await closed_loop(client, server, workload(-1, 4), 4)
        for index, (kind, x) in enumerate(settings):
            runs: dict[str, list[dict[str, object]]] = {s.name: [] for s in servers}
            for r in range(rounds):
                batch = workload(1000 * (index + 1) + r, requests)
                for server in servers if r % 2 == 0 else servers[::-1]:
                    if kind == "concurrency":
                        outcomes, wall = await closed_loop(client, server, batch, int(x))
                    else:
                        offsets = poisson_offsets(r, x, len(batch))
                        outcomes, wall = await open_loop(client, server, batch, offsets)
                    runs[server.name].append(summarize(outcomes, wall, SLO))
            entry: dict[str, object] = {name: _median(rs) for name, rs in runs.items()}
            for server in servers[:-1]:
                ours, theirs = runs[server.name], runs[baseline.name]
                entry[f"{server.name}_vs_{baseline.name}"] = {
                    what: round(statistics.median(
                        _ratio(a, b, *path) for a, b in zip(ours, theirs, strict=True)
                    ), 3)
                    for what, path in (
                        ("output_tokens_per_s", ("output_tokens_per_s",)),
                        ("ttft_p99", ("ttft_ms", "p99")),
                        ("goodput_per_s", ("goodput_per_s",)),
                    )
                }  # fmt: skip
            key = f"c{int(x)}" if kind == "concurrency" else f"rate{x:g}"
            figures[key] = entry
    return figures
