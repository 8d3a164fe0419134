"""Worker reconciliation: this node runs exactly the runners the cluster State assigns to it.

:class:`Reconciler` watches the applied State. For every instance with a shard on this node it
keeps one :class:`ModelService` (its own runner supervision: deadlines, relaunch backoff, the
crash-loop breaker, flight recorders) in a cancel scope of its own; an instance the State no
longer assigns here is stopped (cancelling the scope terminates and reaps its runner). Nothing
else starts or stops a runner: a leader change, a lost link or a re-election changes no
assignment, so it never restarts one.

A rank of a pipeline or tensor instance gets its weights first (phase ``fetching``), then reports
``connecting`` and waits (:meth:`Reconciler.wait_group`) until every rank of its instance has
reported at least ``connecting`` before its runner joins the compute group: the group-connect
deadline then measures the group forming, not a peer still fetching its weights.

Each service's phase is reported into the State (``ReportRunner``) whenever it differs from
what the State records for it — only phase changes go through the log, never per-token
traffic; a report that cannot commit now is tried again on the next change or tick.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from skulk.cluster import State
from skulk.wire.cluster import (
    ClusterResult,
    ModelCard,
    ReportRunner,
    RunnerPhase,
    Shard,
    Sharding,
)

from ._model_service import ModelService, ModelStatus

log = logging.getLogger("skulk.worker")

#: How often a running service's phase is compared with what the State records.
REPORT_INTERVAL = 0.2
#: Instances no longer assigned here whose services (flight recorders) are kept.
RETIRED_KEPT = 8


class StateView(Protocol):
    """What the reconciler reads: the applied State and a way to wait for it to change
    (:class:`skulk.control.ClusterControl` is one)."""

    @property
    def state(self) -> State: ...

    @property
    def applied(self) -> int: ...

    async def wait_change(self, seen: int) -> None: ...


Reporter = Callable[[ReportRunner], Awaitable[ClusterResult]]

#: Runner phases at which a rank's weights are here and it can join its compute group.
JOINABLE: frozenset[RunnerPhase] = frozenset({"connecting", "loading", "ready"})


@attrs.frozen
class Assignment:
    """Rank ``rank`` of ``instance`` (a ``sharding`` instance of ``card``'s model, all of
    whose ``shards`` are listed) runs on this node."""

    instance: str
    rank: int
    card: ModelCard
    sharding: Sharding
    shards: tuple[Shard, ...]

    @property
    def shard(self) -> Shard:
        return self.shards[self.rank]


ServiceFactory = Callable[[Assignment], ModelService]
"""The :class:`ModelService` for a new assignment."""


def phase_of(status: ModelStatus) -> tuple[RunnerPhase, str | None]:
    """A model service's state as the runner phase (and failure) the State records."""
    match status.state:
        case "ready":
            return "ready", None
        case "failed":
            return "failed", status.failure_reason or "failed"
        case "stopped":
            return "stopped", None
        case "resolving":
            return "fetching", None
        case "staged" | "connecting":
            return "connecting", None
        case _:  # loading, warming, restarting
            return "loading", None


class Reconciler:
    """See the module doc. ``services`` maps each assigned instance id to its service."""

    def __init__(
        self,
        node_id: str,
        view: StateView,
        report: Reporter,
        make_service: ServiceFactory,
        clock_ms: Callable[[], int],
    ) -> None:
        self.node_id = node_id
        self._view = view
        self._report = report
        self._make = make_service
        self._clock_ms = clock_ms
        self.services: dict[str, ModelService] = {}
        self.retired: deque[tuple[Assignment, ModelService]] = deque(maxlen=RETIRED_KEPT)
        """The last instances this node stopped serving, newest last, with their services:
        their runners' flight recorders stay readable after a re-placement (diagnostics)."""
        self._scopes: dict[str, trio.CancelScope] = {}
        self._assigned: dict[str, Assignment] = {}
        self._broken: dict[str, str] = {}  # instance -> why its service ended with an error
        self._nursery: trio.Nursery | None = None

    def service(self, instance: str) -> ModelService | None:
        """The service running rank 0 of ``instance`` on this node, if any."""
        a = self._assigned.get(instance)
        return self.services.get(instance) if a is not None and a.rank == 0 else None

    def assignments(self) -> dict[str, Assignment]:
        """What the State assigns to this node now (instance id → assignment)."""
        wanted: dict[str, Assignment] = {}
        state = self._view.state
        for instance in state.instances:
            card = state.model(instance.model)
            for shard in instance.shards:
                if shard.node == self.node_id and card is not None:
                    wanted[instance.id] = Assignment(
                        instance.id, shard.rank, card, instance.sharding, instance.shards
                    )
        return wanted

    async def wait_group(self, instance: str) -> None:
        """Return once every rank of ``instance`` has reported at least ``connecting`` (its
        weights are local); while the instance is gone, wait until cancelled (the reconciler
        stops its service)."""
        while True:
            seen = self._view.applied
            state = self._view.state
            ranks = [r for r in state.runners if r.instance == instance]
            if state.instance(instance) is not None and all(r.phase in JOINABLE for r in ranks):
                return
            await self._view.wait_change(seen)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._report_loop)
            task_status.started()
            acted = -1
            while True:
                seen = self._view.applied
                # A State older than one already acted on (storage reopened after a disk
                # failure restores the last snapshot, then catches up) is not acted on: its
                # missing instances were not deleted, and their runners must not restart.
                if seen >= acted:
                    self._reconcile()
                    acted = seen
                await self._view.wait_change(seen)

    def _reconcile(self) -> None:
        wanted = self.assignments()
        for instance in sorted(self._assigned.keys() - wanted.keys()):
            log.info("instance %s is no longer assigned here: stopping its runner", instance)
            self._scopes.pop(instance).cancel()
            gone = self._assigned.pop(instance)
            if (service := self.services.pop(instance, None)) is not None:
                self.retired.append((gone, service))
            self._broken.pop(instance, None)
        for instance, assignment in sorted(wanted.items()):
            if instance in self._assigned:
                continue
            log.info(
                "instance %s of %s assigned here (rank %d): starting its runner",
                instance,
                assignment.card.id,
                assignment.rank,
            )
            service = self._make(assignment)
            scope = trio.CancelScope()
            self._assigned[instance] = assignment
            self._scopes[instance] = scope
            self.services[instance] = service
            assert self._nursery is not None
            self._nursery.start_soon(self._keep, scope, instance, service)

    async def _keep(self, scope: trio.CancelScope, instance: str, service: ModelService) -> None:
        with scope:
            try:
                await service.run()
            except Exception as exc:  # a bug in one instance's service: that instance fails,
                # reported as such (the leader moves it); the node and its others go on
                log.exception("instance %s: its model service failed", instance)
                self._broken[instance] = type(exc).__name__

    async def _report_loop(self) -> None:
        while True:
            for instance, service in list(self.services.items()):
                assignment = self._assigned.get(instance)
                if assignment is not None:
                    await self._report_one(assignment, service)
            await trio.sleep(REPORT_INTERVAL)

    async def _report_one(self, assignment: Assignment, service: ModelService) -> None:
        phase, failure = phase_of(service.status())
        if (broken := self._broken.get(assignment.instance)) is not None:
            phase, failure = "failed", f"service_error_{broken}"[:64].lower()
        if phase == "stopped":
            return  # being stopped: the State no longer assigns it (or soon will not)
        recorded = next(
            (
                r
                for r in self._view.state.runners
                if r.instance == assignment.instance and r.rank == assignment.rank
            ),
            None,
        )
        if recorded is None or (recorded.phase, recorded.failure) == (phase, failure):
            return
        command = ReportRunner(
            assignment.instance, assignment.rank, self.node_id, phase, failure, self._clock_ms()
        )
        try:
            await self._report(command)
        except Exception as exc:  # no quorum now: the next tick tries again
            log.debug("report of %s not committed: %s", assignment.instance, exc)
