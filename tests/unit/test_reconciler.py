"""The worker reconciler: runs exactly the instances the State assigns to this node, reports
their phases, and starts or stops nothing for a change that does not touch its assignments."""

from __future__ import annotations

from typing import Any

import trio

from skulk.cluster import State, apply
from skulk.wire.cluster import (
    Applied,
    Architecture,
    ClusterCommand,
    ClusterResult,
    DeleteInstance,
    ModelCard,
    NodeStatusChanged,
    PathSource,
    PlaceInstance,
    RegisterModel,
    ReportRunner,
    Shard,
    UpsertNode,
)
from skulk.worker import Assignment, ModelStatus, Reconciler

CARD = ModelCard("m", PathSource("/m"), Architecture("llama", 2, 8, 2, 2, 10), 1, 64)


class FakeControl:
    """A State that commands change, with the wait a watcher needs."""

    def __init__(self) -> None:
        self.state = State()
        self.applied = 0
        self.reports: list[ReportRunner] = []
        self._changed = trio.Event()

    def commit(self, *commands: ClusterCommand) -> None:
        for command in commands:
            self.state, result = apply(self.state, command)
            assert result == Applied(), result
            self.applied += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_change(self, seen: int) -> None:
        while self.applied == seen:
            await self._changed.wait()

    async def report(self, command: ReportRunner) -> ClusterResult:
        self.reports.append(command)
        self.commit(command)
        return Applied()


class FakeService:
    def __init__(self, name: str) -> None:
        self.name = name
        self.state = "loading"
        self.runs = 0
        self.cancelled = False

    def status(self) -> ModelStatus:
        return ModelStatus(self.name, self.state)  # type: ignore[arg-type]

    async def run(self) -> None:
        self.runs += 1
        try:
            await trio.sleep_forever()
        finally:
            self.cancelled = True


def place(instance: str, node: str) -> PlaceInstance:
    return PlaceInstance(instance, "m", "single", (Shard(0, node, 0, 2),), 0)


async def test_runs_what_is_assigned_reports_phases_and_stops_what_is_not(
    autojump_clock: Any,
) -> None:
    control = FakeControl()
    control.commit(UpsertNode("me", "a", "f", 0), UpsertNode("other", "a", "f", 0),
                   RegisterModel(CARD))  # fmt: skip
    made: dict[str, FakeService] = {}

    def make(a: Assignment) -> Any:
        made[a.instance] = FakeService(a.card.id)
        return made[a.instance]

    reconciler = Reconciler("me", control, control.report, make, lambda: 42)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        control.commit(place("i1", "me"), place("i2", "other"))
        await trio.sleep(1)
        assert set(made) == {"i1"} and made["i1"].runs == 1  # only its own
        assert reconciler.service("i1") is made["i1"] and reconciler.service("i2") is None
        assert [(r.instance, r.phase) for r in control.reports] == [("i1", "loading")]
        made["i1"].state = "ready"
        await trio.sleep(1)
        assert control.reports[-1] == ReportRunner("i1", 0, "me", "ready", None, 42)
        # A change that does not touch its assignment (another node down, a leader change:
        # nothing in the State at all) starts and stops nothing.
        control.commit(NodeStatusChanged("other", "down", 1))
        await trio.sleep(1)
        assert made["i1"].runs == 1 and not made["i1"].cancelled
        made["i1"].state = "failed"
        await trio.sleep(1)
        assert control.reports[-1].phase == "failed" and control.reports[-1].failure == "failed"
        control.commit(DeleteInstance("i1"))
        await trio.sleep(1)
        assert made["i1"].cancelled and reconciler.service("i1") is None
        # Its service (flight recorders) stays readable for diagnostics, for a while.
        assert [(a.instance, svc) for a, svc in reconciler.retired] == [("i1", made["i1"])]
        nursery.cancel_scope.cancel()


class BrokenService(FakeService):
    async def run(self) -> None:
        self.runs += 1
        raise OSError("too many open files")


async def test_a_service_that_raises_fails_its_instance_only(autojump_clock: Any) -> None:
    control = FakeControl()
    control.commit(UpsertNode("me", "a", "f", 0), RegisterModel(CARD))
    made: dict[str, FakeService] = {}

    def make(a: Assignment) -> Any:
        made[a.instance] = (BrokenService if a.instance == "bad" else FakeService)(a.card.id)
        return made[a.instance]

    reconciler = Reconciler("me", control, control.report, make, lambda: 42)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        control.commit(place("bad", "me"), place("good", "me"))
        await trio.sleep(1)
        phases = {r.instance: (r.phase, r.failure) for r in control.reports}
        assert phases["bad"] == ("failed", "service_error_oserror")
        assert phases["good"] == ("loading", None) and not made["good"].cancelled
        nursery.cancel_scope.cancel()


async def test_a_state_rewound_to_an_older_index_stops_nothing(autojump_clock: Any) -> None:
    control = FakeControl()
    control.commit(UpsertNode("me", "a", "f", 0), RegisterModel(CARD))
    before = (control.state, control.applied)
    made: dict[str, FakeService] = {}

    def make(a: Assignment) -> Any:
        made[a.instance] = FakeService(a.card.id)
        return made[a.instance]

    reconciler = Reconciler("me", control, control.report, make, lambda: 42)  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        control.commit(place("i1", "me"))
        await trio.sleep(1)
        after = (control.state, control.applied)
        control.state, control.applied = before  # storage reopened: back to an old snapshot
        control.commit()  # wake the watcher
        await trio.sleep(1)
        assert not made["i1"].cancelled and made["i1"].runs == 1
        control.state, control.applied = after  # caught up again
        control.commit()
        await trio.sleep(1)
        assert made["i1"].runs == 1 and reconciler.service("i1") is made["i1"]
        nursery.cancel_scope.cancel()


async def test_a_rank_waits_for_every_rank_of_its_group_to_have_its_weights(
    autojump_clock: Any,
) -> None:
    control = FakeControl()
    control.commit(UpsertNode("me", "a", "f", 0), UpsertNode("other", "a", "f", 0),
                   RegisterModel(CARD))  # fmt: skip
    made: dict[str, FakeService] = {}
    assignments: list[Assignment] = []

    def make(a: Assignment) -> Any:
        assignments.append(a)
        made[a.instance] = FakeService(a.card.id)
        made[a.instance].state = "staged"
        return made[a.instance]

    reconciler = Reconciler("me", control, control.report, make, lambda: 42)  # type: ignore[arg-type]
    shards = (Shard(0, "other", 0, 1, "h:1"), Shard(1, "me", 1, 2, "h:2"))
    gate_open = trio.Event()

    async def gate() -> None:
        await reconciler.wait_group("p")
        gate_open.set()

    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        control.commit(PlaceInstance("p", "m", "pipeline", shards, 0))
        nursery.start_soon(gate)
        await trio.sleep(1)
        assert [(a.rank, a.sharding, a.shard.address) for a in assignments] == [
            (1, "pipeline", "h:2")
        ]
        assert control.reports[-1] == ReportRunner("p", 1, "me", "connecting", None, 42)
        assert not gate_open.is_set()  # rank 0 (on "other") is still pending
        control.commit(ReportRunner("p", 0, "other", "fetching", None, 43))
        await trio.sleep(1)
        assert not gate_open.is_set()
        control.commit(ReportRunner("p", 0, "other", "connecting", None, 44))
        await trio.sleep(1)
        assert gate_open.is_set()
        nursery.cancel_scope.cancel()
