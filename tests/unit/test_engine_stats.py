"""A runner's engine counters: accumulated per request (sans-IO), carried by the ``EngineStats``
frame, kept by the node's :class:`~skulk.runner.Runner` and shown by ``/v1/diagnostics/node``."""

from __future__ import annotations

import json
import socket
from typing import Any

from skulk.engine._link import Link
from skulk.engine._speculation_control import SpeculationStatistics
from skulk.engine._stats import EngineTotals, SpeculationTotals
from skulk.engine.protocol import FROM_RUNNER
from skulk.runner import LoadFailed, Runner
from skulk.wire.runner import EngineStats, Heartbeat
from tests.unit.test_api_edge import FakeService, app_for, call
from tests.unit.test_runner_link import NEVER, chunk, start, written


def stats(spec: SpeculationTotals, hits: int = 2) -> EngineStats:
    """A frame as the runner builds it: ``spec`` and fixed prefix-cache / KV readings."""
    return EngineStats(
        speculation_verify_steps=spec.verify_steps,
        speculation_plain_steps=spec.plain_steps,
        speculation_drafted=spec.drafted,
        speculation_accepted=spec.accepted,
        prefix_hits=hits,
        prefix_reused_tokens=40,
        prefix_bytes=4096,
        prefix_entries=1,
        kv_capacity_bytes=1 << 20,
        kv_reserved_bytes=512,
        running=1,
        queued=0,
    )


def spec(verify: int, plain: int, drafted: int, accepted: int) -> SpeculationStatistics:
    return SpeculationStatistics(verify, plain, drafted, accepted, None, None)


def test_requests_that_left_add_up_and_running_ones_count_once() -> None:
    totals = EngineTotals()
    totals.request_left(spec(3, 10, 6, 4))
    totals.request_left(None)  # a request that never ran alone: nothing to add
    totals.request_left(spec(1, 2, 2, 0))
    running = spec(5, 1, 8, 8)
    now = totals.with_running([running])
    assert now == SpeculationTotals(verify_steps=9, plain_steps=13, drafted=16, accepted=12)
    assert stats(now).acceptance_rate == 12 / 16
    # A running request's counters are not kept: only a request that left adds to the totals.
    assert totals.with_running([]).drafted == 8
    totals.request_left(running)
    assert totals.with_running([]) == now


def test_only_a_change_is_sent() -> None:
    totals = EngineTotals()
    first = stats(totals.with_running([]))
    assert totals.changed(first) == first
    assert totals.changed(stats(totals.with_running([]))) is None  # the same: nothing to send
    assert totals.changed(stats(totals.with_running([]), hits=3)) is not None  # a gauge moved
    totals.request_left(spec(1, 0, 1, 1))
    moved = stats(totals.with_running([]))
    assert totals.changed(moved) == moved
    assert totals.changed(moved) is None


def test_acceptance_rate_is_null_until_something_was_drafted() -> None:
    assert stats(SpeculationTotals()).acceptance_rate is None
    assert stats(SpeculationTotals(drafted=4)).acceptance_rate == 0.0


def test_the_frame_round_trips() -> None:
    frame = stats(EngineTotals().with_running([spec(2, 3, 4, 1)]))
    assert FROM_RUNNER.decode(FROM_RUNNER.encode(frame)) == frame


def test_the_link_sends_changed_stats_with_a_heartbeat_after_held_chunks() -> None:
    runner_end, node_end = socket.socketpair()
    node_end.setblocking(False)
    with runner_end, node_end:
        link = Link(runner_end, heartbeat_interval=0.0, hold=NEVER)  # a heartbeat every beat
        totals = EngineTotals()
        current = [stats(SpeculationTotals())]
        link.stats = lambda: totals.changed(current[0])
        start(link, node_end, "a")
        link.send(chunk("a", 9))  # held: the stats frame must not overtake it
        link.beat()
        frames = written(node_end)
        assert frames[0] == chunk("a", 9)
        assert isinstance(frames[1], Heartbeat) and frames[2] == current[0]
        link.beat()  # nothing changed: a heartbeat alone
        assert [type(f) for f in written(node_end)] == [Heartbeat]
        current[0] = stats(SpeculationTotals(drafted=1))
        link.beat()
        assert written(node_end)[1:] == [current[0]]


class RunnerService(FakeService):
    """A service whose recent runner is a real (never started) :class:`Runner`."""

    def __init__(self, runner: Runner) -> None:
        super().__init__()
        self.runner = runner

    def recent_runners(self) -> tuple[Runner]:  # type: ignore[override]
        return (self.runner,)


async def diagnostics(runner: Runner) -> dict[str, Any]:
    async with app_for(RunnerService(runner)).test_app() as test_app:
        response = await call(test_app.test_client(), "GET", "/v1/diagnostics/node")
        assert response.status_code == 200
        body: dict[str, Any] = json.loads(await response.get_data())
    [shown] = body["runners"]
    assert isinstance(shown, dict)
    return shown


async def test_the_diagnostics_route_shows_the_latest_engine_stats() -> None:
    runner = Runner("org/fake-model", "/m")
    assert (await diagnostics(runner))["engine"] is None  # nothing sent yet
    for frame in (stats(SpeculationTotals(1, 1, 2, 0)), stats(SpeculationTotals(4, 2, 10, 7))):
        # As from the runner's socket: a background frame, accepted in any phase.
        assert runner._pump.background(FROM_RUNNER.decode(FROM_RUNNER.encode(frame)), LoadFailed)
    engine = (await diagnostics(runner))["engine"]
    assert engine["speculation_drafted"] == 10
    assert engine["speculation_accepted"] == 7
    assert engine["acceptance_rate"] == 0.7
    assert engine["prefix_hits"] == 2
    assert engine["kv_capacity_bytes"] == 1 << 20
    assert engine["queued"] == 0
    assert isinstance(runner.engine_statistics(), EngineStats)
