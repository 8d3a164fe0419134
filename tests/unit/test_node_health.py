"""Node health (issue 21): the pure derivation (every code, its level, the worst of them), the
readings it reads on the wire (serving runners, disk, failed fetches), the node-side bookkeeping
that fills them (fetch failures, tokens/s, times to first token) and the rows of
``GET /v1/cluster/nodes``."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import cbor2
import cddl_verifier
import pytest
import trio
import trio.testing

from skulk.api import create_app
from skulk.api._node_health import add_health
from skulk.cluster import (
    LATE_AFTER_S,
    HealthReason,
    State,
    apply,
    down_after_s,
    node_health,
)
from skulk.cluster._health import DISK_ERROR_BYTES, worst
from skulk.routing import Admission, Router
from skulk.runner._recorder import FlightRecorder
from skulk.runner._request_table import RECENT_TTFTS, RequestTable
from skulk.telemetry import FetchBoard, sample_readings
from skulk.telemetry._fetchboard import FETCH_FAILURE_KEPT
from skulk.wire import Codec, SchemaError
from skulk.wire.cluster import NodeStatusChanged, PlaceInstance, Shard
from skulk.wire.runner import EngineStats, TokenChunk
from skulk.wire.telemetry import (
    MAX_FETCH_FAILURES,
    MAX_SERVING,
    DiskReading,
    FetchFailure,
    NodeReadings,
    RunnerReading,
    TelemetryEntry,
    TelemetryFrame,
    TelemetryPush,
)
from skulk.worker import ModelStatus, ServingSampler

from .test_control_placement import GIB, LLAMA, cluster, readings

CODEC: Codec[TelemetryFrame] = Codec(TelemetryFrame)
SPEC_PATH = Path(__file__).resolve().parents[2] / "specs" / "wire.cddl"
BIG = 64 * GIB


def node(name: str = "a", free: int = BIG, **changes: Any) -> NodeReadings:
    changes.setdefault("disk", DiskReading("/srv/skulk/models", 500 * GIB, 1000 * GIB))
    return attrs.evolve(readings(name, free), **changes)


def run(instance: str = "i1", **changes: Any) -> RunnerReading:
    base = RunnerReading(instance, "m", 0, "ready", 1, 0, 100, 1000, 12.5, 0.05)
    return attrs.evolve(base, **changes)


def placed(state: State, instance: str, on: str) -> State:
    state, _ = apply(state, PlaceInstance(instance, "m", "single", (Shard(0, on, 0, 4),), 1))
    return state


def codes(health: Any) -> list[tuple[str, str]]:
    return [(r.code, r.level) for r in health.reasons]


# ---- the derivation ------------------------------------------------------------------------------


def test_a_fresh_node_with_room_is_ok_with_no_reasons() -> None:
    health = node_health("a", node(), 0.4, cluster(LLAMA))
    assert health.level == "ok" and health.reasons == ()
    assert health.to_json() == {"level": "ok", "reasons": []}


def test_a_member_the_cluster_committed_down_is_down_whatever_its_last_readings() -> None:
    state, _ = apply(cluster(LLAMA), NodeStatusChanged("b", "down", 5))
    health = node_health("b", node("b"), 0.1, state)
    assert health.level == "error" and codes(health) == [("down", "error")]
    reason = health.reasons[0]
    assert "--node-down-after" in reason.message
    assert "DELETE /v1/cluster/nodes/b" in reason.remedy and "--home" in reason.remedy


def test_a_member_without_telemetry_or_silent_past_the_deadline_is_down() -> None:
    state = cluster(LLAMA)
    deadline = down_after_s(state.config)
    assert deadline == 5.0  # the cluster's node_down_after_ms (--node-down-after)
    assert codes(node_health("c", None, None, state)) == [("down", "error")]
    assert "for 42.0 s" in node_health("c", None, 42.0, state).reasons[0].message
    silent = node_health("c", node("c"), deadline, state)
    assert codes(silent) == [("down", "error")] and "5.0 s" in silent.reasons[0].message
    # Down hides the rest: its readings are stale (here a full disk and a cool-down).
    stale = node("c", disk=DiskReading("/x", 0, GIB), serving=(run(retry_in_s=9.0),))
    assert codes(node_health("c", stale, deadline + 1, state)) == [("down", "error")]


def test_late_telemetry_warns_before_the_deadline() -> None:
    state = cluster(LLAMA)
    assert node_health("a", node(), LATE_AFTER_S - 0.1, state).level == "ok"
    late = node_health("a", node(), LATE_AFTER_S, state)
    assert codes(late) == [("late_heartbeats", "warn")] and late.level == "warn"
    assert "3.0 s old" in late.reasons[0].message and "links" in late.reasons[0].remedy
    # A cluster configured to call nodes down sooner than "late" never shows late.
    quick = attrs.evolve(state, config=attrs.evolve(state.config, node_down_after_ms=2000))
    assert codes(node_health("a", node(), 2.5, quick)) == [("down", "error")]


def test_disk_low_warns_below_the_largest_model_and_errs_below_the_floor() -> None:
    state = cluster(LLAMA)  # the largest model takes 2 GiB
    path = "/srv/skulk/models"
    ok = node(disk=DiskReading(path, 2 * GIB, 100 * GIB))
    assert node_health("a", ok, 0.0, state).level == "ok"
    low = node_health("a", node(disk=DiskReading(path, 2 * GIB - 1, 100 * GIB)), 0.0, state)
    assert codes(low) == [("disk_low", "warn")]
    assert "model m" in low.reasons[0].message and path in low.reasons[0].remedy
    full = node_health("a", node(disk=DiskReading(path, DISK_ERROR_BYTES - 1, GIB)), 0.0, state)
    assert codes(full) == [("disk_low", "error")] and full.level == "error"
    assert "Raft log" in full.reasons[0].message
    assert node_health("a", node(disk=None), 0.0, state).level == "ok"  # not read: no verdict
    # With no model in the cluster only the floor counts.
    empty = cluster()
    assert (
        node_health("a", node(disk=DiskReading(path, DISK_ERROR_BYTES, GIB)), 0, empty).level
        == "ok"
    )


def test_a_runner_in_crash_loop_cool_down_warns_with_the_retry_route() -> None:
    r = run(phase="failed", failure="crash_loop", retry_in_s=29.6, running=0)
    health = node_health("a", node(serving=(r, run("i2"))), 0.0, cluster(LLAMA))
    assert codes(health) == [("runner_cooldown", "warn")]
    reason = health.reasons[0]
    assert "i1" in reason.message and "crash_loop" in reason.message and "30 s" in reason.message
    assert "POST /v1/diagnostics/node/retry" in reason.remedy
    failed_for_good = run(phase="failed", failure="model_not_found", retry_in_s=None)
    assert node_health("a", node(serving=(failed_for_good,)), 0.0, cluster(LLAMA)).level == "ok"


def test_failed_fetches_warn_and_a_full_disk_fetch_errs_one_reason_per_model_and_cause() -> None:
    failures = (
        FetchFailure("i1", 0, "m", "no_holder_reachable", "no node holding m could send", 1.0),
        FetchFailure("i2", 0, "m", "no_holder_reachable", "again", 2.0),
        FetchFailure("i3", 1, "g", "disk_full", "not enough disk space", 3.0),
        FetchFailure("i4", 0, "g", "manifest_mismatch", "no holder has the manifest", 4.0),
        FetchFailure("i5", 0, "g", "no_manifest", "not on this node", 5.0),
        FetchFailure("i6", 0, "g", "fetch_failed", "EIO", 6.0),
    )
    health = node_health("a", node(fetch_failures=failures), 0.0, cluster(LLAMA))
    assert health.level == "error"
    assert (
        codes(health)
        == [("fetch_failed", "warn"), ("fetch_failed", "error")] + [("fetch_failed", "warn")] * 3
    )
    first = health.reasons[0]
    assert "i2" in first.message and "again" in first.message  # the newest of the two
    assert "/v1/cluster/links" in first.remedy
    assert "/srv/skulk/models" in health.reasons[1].remedy  # the disk's path, from the readings
    assert len({r.remedy for r in health.reasons}) == 5  # a remedy for each cause


def test_memory_low_when_no_placed_model_share_fits_the_node() -> None:
    state = cluster(LLAMA)
    assert node_health("a", node(free=GIB), 0.0, state).level == "ok"  # nothing placed
    state = placed(state, "i1", "b")
    health = node_health("a", node(free=GIB), 0.0, state)
    assert codes(health) == [("memory_low", "warn")]
    assert "model m" in health.reasons[0].message and "--memory-limit" in health.reasons[0].remedy
    assert node_health("a", node(free=3 * GIB), 0.0, state).level == "ok"  # 2.4 GiB + floor fits
    # The node serving it counts what its own instance holds as room: not low.
    assert node_health("b", node("b", free=GIB), 0.0, state).level == "ok"


def test_the_level_is_the_worst_of_the_reasons() -> None:
    warn = HealthReason("late_heartbeats", "warn", "", "")
    error = HealthReason("disk_low", "error", "", "")
    assert worst(()).level == "ok"
    assert worst((warn,)).level == "warn"
    assert worst((warn, error, warn)).level == "error"
    assert worst((error, warn)).reasons == (error, warn)
    mixed = node(disk=DiskReading("/m", 0, GIB), serving=(run(phase="failed", retry_in_s=3.0),))
    health = node_health("a", mixed, LATE_AFTER_S + 1, cluster(LLAMA))
    assert health.level == "error"
    assert [c for c, _ in codes(health)] == ["late_heartbeats", "disk_low", "runner_cooldown"]


# ---- the readings on the wire --------------------------------------------------------------------


def full_readings() -> NodeReadings:
    return sample_readings(
        "n1",
        ["ws://127.0.0.1:1"],
        "http://127.0.0.1:2",
        serving=(run(), run("i2", ttft_p50_s=None, phase="failed", retry_in_s=1.5, failure="x")),
        models_dir=Path("/nonexistent/skulk/models"),  # read from its nearest existing parent
        fetch_failures=[FetchFailure("i", 0, "m", "disk_full", "full", 1.0)],
    )


def test_health_readings_round_trip_the_strict_codec_and_match_the_spec() -> None:
    r = full_readings()
    assert r.disk is not None and r.disk.path == "/nonexistent/skulk/models"
    assert 0 <= r.disk.free_bytes <= r.disk.total_bytes and r.disk.total_bytes > 0
    push = TelemetryPush((TelemetryEntry("n1", 1, 1, r),))
    body = CODEC.encode(push)
    assert CODEC.decode(body) == push
    validator = cddl_verifier.Validator(SPEC_PATH.read_text(encoding="utf-8"))
    assert validator.validate(body, root_type="TelemetryFrame").valid
    # Readings of a node that publishes none of the new fields still decode (all optional).
    plain = CODEC.unstructure(push)
    for key in ("serving", "disk", "fetch_failures"):
        del plain["entries"][0]["readings"][key]
    old = CODEC.decode(cbor2.dumps(plain))
    assert isinstance(old, TelemetryPush)
    got = old.entries[0].readings
    assert got.serving == () and got.disk is None and got.fetch_failures == ()
    assert validator.validate(cbor2.dumps(plain), root_type="TelemetryFrame").valid


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("serving", 0, "rank"), "0"),
        (("serving", 0, "tokens_per_s"), float("nan")),
        (("serving", 0, "ttft_p50_s"), "fast"),
        (("serving", 0, "extra"), 1),
        (("disk", "free_bytes"), 1.5),
        (("fetch_failures", 0, "at"), None),
    ],
)
def test_the_codec_refuses_bad_health_readings_naming_the_field(
    path: tuple[Any, ...], value: object
) -> None:
    plain = CODEC.unstructure(TelemetryPush((TelemetryEntry("n1", 1, 1, full_readings()),)))
    target = plain["entries"][0]["readings"]
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    with pytest.raises(SchemaError) as error:
        CODEC.decode(cbor2.dumps(plain))
    assert f"readings.{path[0]}" in str(error.value)


def test_the_readings_bound_runners_and_failures() -> None:
    many = [run(f"i{n:03d}") for n in range(MAX_SERVING + 5)]
    failures = [FetchFailure(f"i{n}", 0, "m", "x", "", float(n)) for n in range(20)]
    r = sample_readings("n1", [], "", serving=many, fetch_failures=failures)
    assert len(r.serving) == MAX_SERVING
    assert [f.instance for f in r.fetch_failures] == [f"i{n}" for n in range(12, 20)]
    assert r.disk is None  # no models dir given: not read


def test_the_fetch_board_keeps_recent_failures_until_the_model_is_fetched() -> None:
    board = FetchBoard()
    board.failed("i1", 0, "m", "no_holder_reachable", "x" * 1000, at=100.0)
    board.failed("i2", 1, "g", "disk_full", "full", at=200.0)
    got = board.failures(now=200.0)
    assert [f.instance for f in got] == ["i1", "i2"] and len(got[0].message) == 300
    assert [f.instance for f in board.failures(now=100.0 + FETCH_FAILURE_KEPT + 1)] == ["i2"]
    board.fetched("m")
    assert [f.model for f in board.failures(now=200.0)] == ["g"]
    for n in range(MAX_FETCH_FAILURES + 3):
        board.failed(f"x{n}", 0, "z", "fetch_failed", "", at=300.0 + n)
    listed = board.failures(now=400.0)
    assert len(listed) == MAX_FETCH_FAILURES and listed[-1].instance == f"x{MAX_FETCH_FAILURES + 2}"


# ---- the node side: tokens/s and time to first token ---------------------------------------------


class FakeRunner:
    def __init__(self, incarnation: int) -> None:
        self.incarnation = incarnation
        self.tokens = 0
        self.ttfts: tuple[float, ...] = ()
        self.engine: EngineStats | None = EngineStats(0, 0, 0, 0, 0, 0, 0, 0, 4096, 1024, 2, 3)

    def statistics(self) -> Any:
        return SimpleNamespace(tokens_out=self.tokens)

    def engine_statistics(self) -> EngineStats | None:
        return self.engine

    def recent_ttfts(self) -> tuple[float, ...]:
        return self.ttfts


class FakeService:
    def __init__(self, runner: FakeRunner, state: str = "ready", **status: Any) -> None:
        self.model_id = "m"
        self.runners = [runner]
        self._status = ModelStatus("m", state, **status)  # type: ignore[arg-type]

    def status(self) -> ModelStatus:
        return self._status

    def recent_runners(self) -> tuple[FakeRunner, ...]:
        return tuple(self.runners)


def test_the_sampler_reports_tokens_per_second_over_the_window_and_the_median_ttft() -> None:
    sampler = ServingSampler(window=10.0)
    runner = FakeRunner(1)
    services: dict[str, Any] = {"i1": FakeService(runner)}
    assignments: dict[str, Any] = {"i1": SimpleNamespace(rank=0)}
    first = sampler.sample(assignments, services, 0.0)
    assert first == (RunnerReading("i1", "m", 0, "ready", 2, 3, 1024, 4096, 0.0, None, None, None),)
    for t in range(1, 21):  # 10 tokens a second for 20 s
        runner.tokens += 10
        row = sampler.sample(assignments, services, float(t))[0]
    assert row.tokens_per_s == pytest.approx(10.0)
    runner.ttfts = (0.3, 0.1, 0.2)
    for t in range(21, 32):  # then idle: the window forgets the burst
        row = sampler.sample(assignments, services, float(t))[0]
    assert row.tokens_per_s == 0.0 and row.ttft_p50_s == pytest.approx(0.2)
    # A relaunched runner counts from zero again (no negative rate from its reset counter).
    services["i1"].runners.append(FakeRunner(2))
    assert sampler.sample(assignments, services, 32.0)[0].tokens_per_s == 0.0


def test_the_sampler_reports_phase_failure_and_cool_down_and_forgets_gone_instances() -> None:
    sampler = ServingSampler()
    services: dict[str, Any] = {
        "i1": FakeService(FakeRunner(1), "failed", failure_reason="crash_loop", retry_in=12.0),
        "i2": FakeService(FakeRunner(1), "resolving"),
    }
    rows = sampler.sample({"i2": SimpleNamespace(rank=1)}, services, 0.0)
    assert [(r.instance, r.rank, r.phase) for r in rows] == [
        ("i1", 0, "failed"),
        ("i2", 1, "fetching"),
    ]
    assert rows[0].failure == "crash_loop" and rows[0].retry_in_s == 12.0
    assert rows[0].running == 0 and rows[0].kv_capacity_bytes == 0  # not ready: no engine figures
    assert sampler.sample({}, {}, 1.0) == () and not sampler._history


def test_the_request_table_keeps_each_requests_time_to_first_token() -> None:
    async def main(clock: trio.testing.MockClock) -> tuple[float, ...]:
        table = RequestTable(FlightRecorder())
        for n in range(RECENT_TTFTS + 2):
            rid = f"r{n}"
            table.open(rid)
            table.start(rid)
            clock.jump(0.25 if n else 1.0)
            table.deliver(TokenChunk(rid, "a", (1,), ()))  # the first token
            clock.jump(5.0)
            table.deliver(TokenChunk(rid, "b", (2,), ()))  # not a first token
        table.open("never")
        table.start("never")
        table.forget("never")  # a request never sent leaves no time
        return tuple(table.ttfts)

    clock = trio.testing.MockClock()
    got = trio.run(main, clock, clock=clock)
    assert len(got) == RECENT_TTFTS and set(got) == {0.25}


# ---- GET /v1/cluster/nodes -----------------------------------------------------------------------


class FakeGossip:
    def __init__(self, seen: Mapping[str, NodeReadings], ages: Mapping[str, float]) -> None:
        self.seen, self.ages = seen, ages

    @property
    def store(self) -> Any:
        return SimpleNamespace(view={n: SimpleNamespace(readings=r) for n, r in self.seen.items()})

    def nodes_json(self) -> dict[str, object]:
        return {"nodes": [{"node_id": n, "age_s": self.ages[n], "hostname": r.hostname}
                          for n, r in self.seen.items()]}  # fmt: skip

    def last_seen_age(self, node_id: str) -> float | None:
        return self.ages.get(node_id)


SERVING_KEYS = {"instance_id", "model", "rank", "phase", "running", "waiting", "kv_used_bytes",
                "kv_capacity_bytes", "tokens_per_s", "ttft_p50_s"}  # fmt: skip


async def test_the_nodes_route_gives_every_member_health_and_serving() -> None:
    state = placed(cluster(LLAMA), "i1", "a")
    seen = {"a": node("a", serving=(run(),)), "b": node("b", serving=(run("old"),))}
    ages = {"a": 0.2, "b": 7.5, "c": 40.0}  # c: expired from the store, a member still
    router = Router("a", lambda: state, lambda i: None, lambda p: False, None, Admission())  # type: ignore[arg-type]
    control = SimpleNamespace(state=state)
    app = create_app(
        router,
        SimpleNamespace(services={}),
        control=control,
        gossip=FakeGossip(seen, ages),  # type: ignore[arg-type]
    )
    async with app.test_app() as test_app:
        response = await test_app.test_client().get("/v1/cluster/nodes")
        assert response.status_code == 200
        rows = {r["node_id"]: r for r in (await response.get_json())["nodes"]}
    assert set(rows) == {"a", "b", "c"}
    a, b, c = rows["a"], rows["b"], rows["c"]
    assert a["health"] == {"level": "ok", "reasons": []} and a["status"] == "up"
    assert [set(s) for s in a["serving"]] == [SERVING_KEYS]
    assert a["serving"][0] == {
        "instance_id": "i1", "model": "m", "rank": 0, "phase": "ready", "running": 1,
        "waiting": 0, "kv_used_bytes": 100, "kv_capacity_bytes": 1000, "tokens_per_s": 12.5,
        "ttft_p50_s": 0.05,
    }  # fmt: skip
    # b: silent past the deadline; c: no readings left, its last-seen age kept.
    assert b["health"]["level"] == "error" and b["health"]["reasons"][0]["code"] == "down"
    assert b["serving"] == []  # a down node's stale runners are not shown
    assert c["age_s"] == 40.0 and c["health"]["level"] == "error" and c["serving"] == []
    for row in rows.values():
        for reason in row["health"]["reasons"]:
            assert set(reason) == {"code", "level", "message", "remedy"}
    json.dumps(rows)


def test_add_health_takes_rows_without_an_age_and_drops_removed_dead_nodes() -> None:
    rows: list[dict[str, object]] = [
        {"node_id": "a", "age_s": None},
        {"node_id": "b", "age_s": 0},
        {"node_id": "gone", "age_s": 20.0},  # removed from the cluster, not expired yet
        {"node_id": "new", "age_s": 0.5},  # gossiping, not in the State yet
    ]
    view: Any = {n: SimpleNamespace(readings=node("a", node_id=n)) for n in ("a", "gone", "new")}
    kept = add_health(rows, view, cluster(LLAMA))
    assert [r["node_id"] for r in kept] == ["a", "b", "new"]
    assert kept[0]["health"] == {"level": "ok", "reasons": []}
    assert kept[1]["health"]["level"] == "error"  # type: ignore[index]  # no readings at all
    assert kept[2]["health"]["level"] == "ok"  # type: ignore[index]
    # Before any State (no members known) nothing is dropped.
    assert len(add_health([{"node_id": "gone", "age_s": 20.0}], view, State())) == 1


def test_following_a_fetch_lists_its_progress_keeps_its_failure_and_clears_on_success() -> None:
    class NoHolder(Exception):
        reason = "no_holder_reachable"

    board = FetchBoard()

    async def main() -> None:
        async def works(progress: Any) -> str:
            progress(5, 10)
            assert [(f.instance, f.bytes_done) for f in board.snapshot()] == [("i1", 5)]
            return "/models/m"

        async def fails(progress: Any) -> str:
            raise NoHolder("nobody has m")

        async def breaks(progress: Any) -> str:
            raise OSError("EIO")

        with pytest.raises(NoHolder):
            await board.follow("i1", 0, "m", fails)
        with pytest.raises(OSError, match="EIO"):
            await board.follow("i2", 1, "m", breaks)
        listed = board.failures(now=time.time())
        assert [(f.instance, f.reason, f.message) for f in listed] == [
            ("i1", "no_holder_reachable", "nobody has m"),
            ("i2", "fetch_failed", "EIO"),
        ]
        assert board.snapshot() == ()  # a failed fetch is not listed as in progress
        assert await board.follow("i1", 0, "m", works) == "/models/m"
        assert board.snapshot() == () and board.failures(now=time.time()) == ()

    trio.run(main)
