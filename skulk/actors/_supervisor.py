"""One-for-one supervisor: restarts crashed children with backoff, escalates crash loops."""

from __future__ import annotations

import enum
import math
import random
from collections.abc import Awaitable, Callable
from typing import Literal, TypeVarTuple

import attrs
import trio

from ._errors import CrashLoopError
from ._policy import CrashLoopBreaker, RestartPolicy, Trip

__all__ = ["ChildState", "ChildStatistics", "RestartMode", "Supervisor", "SupervisorStatistics"]

PosArgs = TypeVarTuple("PosArgs")

RestartMode = Literal["permanent", "transient", "temporary"]
"""When a child is restarted (Erlang's vocabulary):

* ``"transient"`` (default): restarted after it raises an ``Exception``; a normal return means
  "done" and the child stays stopped.
* ``"permanent"``: restarted after raising *and* after returning normally (a return counts as a
  crash for backoff and for the breaker, so a child that returns at once cannot spin hot).
* ``"temporary"``: never restarted; a crash is recorded in the statistics and that is all.
"""


class ChildState(enum.Enum):
    """Lifecycle of a supervised child."""

    #: started with :meth:`Supervisor.start`, has not yet called ``task_status.started()``
    STARTING = "starting"
    RUNNING = "running"
    #: crashed; waiting out its backoff before the next incarnation
    BACKING_OFF = "backing_off"
    #: returned, crashed without restart, stopped by :meth:`Supervisor.stop_child`, or cancelled
    STOPPED = "stopped"
    #: its breaker tripped; the supervisor escalated with :class:`CrashLoopError`
    FAILED = "failed"


@attrs.frozen
class ChildStatistics:
    """A snapshot of one child (see :meth:`Supervisor.statistics`)."""

    name: str
    state: ChildState
    restart: RestartMode
    #: incarnations started after the first
    restarts: int
    #: exits counted as crashes (exceptions, and normal returns of ``permanent`` children)
    crashes: int
    #: ``repr`` of the most recent exception raised by the child, if any
    last_error: str | None


@attrs.frozen
class SupervisorStatistics:
    """A snapshot of a :class:`Supervisor`: its children and totals."""

    name: str
    running: bool
    children: tuple[ChildStatistics, ...]
    total_restarts: int
    total_crashes: int
    #: children in state RUNNING or STARTING
    children_alive: int

    def child(self, name: str) -> ChildStatistics:
        """The statistics of the child called ``name`` (``KeyError`` if there is none)."""
        for child in self.children:
            if child.name == name:
                return child
        raise KeyError(name)


@attrs.define(eq=False)
class _Child:
    name: str
    thunk: Callable[..., Awaitable[object]]
    wants_task_status: bool
    restart: RestartMode
    breaker: CrashLoopBreaker
    state: ChildState = ChildState.STARTING
    restarts: int = 0
    crashes: int = 0
    last_error: str | None = None
    announced: bool = False
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)

    def statistics(self) -> ChildStatistics:
        return ChildStatistics(
            name=self.name,
            state=self.state,
            restart=self.restart,
            restarts=self.restarts,
            crashes=self.crashes,
            last_error=self.last_error,
        )


class _ChildTaskStatus(trio.TaskStatus[object]):
    """The ``task_status`` handed to every incarnation of a child started with ``start``.

    The first incarnation's ``started(value)`` completes :meth:`Supervisor.start`; later
    incarnations' calls only mark the child RUNNING again.
    """

    def __init__(self, child: _Child, outer: trio.TaskStatus[object]) -> None:
        self._child = child
        self._outer = outer
        self._called = False

    def started(self, value: object = None) -> None:
        if self._called:
            raise RuntimeError("called 'started' twice on the same task status")
        self._called = True
        self._child.state = ChildState.RUNNING
        if not self._child.announced:
            self._child.announced = True
            self._outer.started(value)


class Supervisor:
    """Runs named children one-for-one: a crashed child is restarted alone, after a backoff.

    Usage::

        supervisor = Supervisor(policy=RestartPolicy(...), rng=random.Random(seed))
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            await supervisor.start(actor.run, name="consensus")   # waits for readiness
            supervisor.start_soon(sampler, name="telemetry")

    Restart decisions: a child that raises an ``Exception`` is restarted after
    :meth:`RestartPolicy.backoff` unless its mode is ``"temporary"``; a normal return stops it
    unless its mode is ``"permanent"`` (see :data:`RestartMode`). ``BaseException`` is never a
    reason to restart: ``trio.Cancelled`` from outside (the parent cancelling, :meth:`stop`)
    ends every child for good, and an ``Exception`` a child raises *while* its scope is being
    cancelled propagates instead of restarting it.

    Escalation: each child has its own :class:`CrashLoopBreaker`. When one trips, the child is
    marked FAILED, its siblings are cancelled, and :meth:`run` raises :class:`CrashLoopError`
    (bare, not wrapped in an ``ExceptionGroup``); the parent's nursery then wraps it as usual.

    Jitter comes from ``rng`` (one ``random.Random`` shared by all children); pass a seeded
    one for reproducible delays. Children are tasks of the supervisor's own nursery, so
    :meth:`start`/:meth:`start_soon` may be called from any task while :meth:`run` is running.
    """

    def __init__(
        self,
        *,
        name: str = "supervisor",
        policy: RestartPolicy | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.name = name
        self.policy = RestartPolicy() if policy is None else policy
        self._rng = random.Random() if rng is None else rng
        self._children: dict[str, _Child] = {}
        self._nursery: trio.Nursery | None = None
        self._total_restarts = 0
        self._total_crashes = 0

    def __repr__(self) -> str:
        return f"<Supervisor {self.name!r} children={sorted(self._children)}>"

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Supervise children until cancelled, :meth:`stop`-ped, or a breaker trips.

        Signals readiness (``nursery.start(supervisor.run)``) once children can be started.
        Returns normally after :meth:`stop`; raises :class:`CrashLoopError` on escalation.
        A supervisor object runs at most once at a time.
        """
        if self._nursery is not None:
            raise RuntimeError(f"supervisor {self.name!r} is already running")
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        except BaseExceptionGroup as group:
            only = group.exceptions[0] if len(group.exceptions) == 1 else None
            if isinstance(only, CrashLoopError):
                raise only from only.last_exception
            raise
        finally:
            self._nursery = None
            for child in self._children.values():
                if child.state is not ChildState.FAILED:
                    child.state = ChildState.STOPPED

    def stop(self) -> None:
        """Cancel every child (none is restarted) and make :meth:`run` return."""
        if self._nursery is not None:
            self._nursery.cancel_scope.cancel()

    def stop_child(self, name: str) -> None:
        """Cancel the child ``name`` (its current incarnation or its backoff); no restart.

        A no-op for a child that is already stopped. ``KeyError`` for an unknown name.
        """
        self._children[name].scope.cancel()

    def start_soon(
        self,
        fn: Callable[[*PosArgs], Awaitable[object]],
        *args: *PosArgs,
        name: str,
        restart: RestartMode = "transient",
        policy: RestartPolicy | None = None,
    ) -> None:
        """Start child ``name`` running ``fn(*args)`` (again on every restart), now.

        ``policy`` overrides the supervisor's policy for this child. Raises ``RuntimeError``
        if the supervisor is not running, ``ValueError`` if a live child has that name.
        """
        nursery = self._nursery_or_raise()
        child = self._register(name, lambda: fn(*args), False, restart, policy)
        child.state = ChildState.RUNNING
        nursery.start_soon(self._supervise, child, trio.TASK_STATUS_IGNORED, name=name)

    async def start(
        self,
        fn: Callable[..., Awaitable[object]],
        *args: object,
        name: str,
        restart: RestartMode = "transient",
        policy: RestartPolicy | None = None,
    ) -> object:
        """Start child ``name`` like ``nursery.start``: wait until it calls
        ``task_status.started(value)`` and return ``value``.

        ``fn`` must accept a ``task_status`` keyword argument; every incarnation gets a fresh
        one. If the *first* incarnation raises (or returns) before calling ``started``, the
        error propagates to this call and the child is not restarted or kept; later
        incarnations are restarted like any crash.
        """
        nursery = self._nursery_or_raise()

        def thunk(*, task_status: trio.TaskStatus[object]) -> Awaitable[object]:
            return fn(*args, task_status=task_status)

        child = self._register(name, thunk, True, restart, policy)
        return await nursery.start(self._supervise, child, name=name)

    def statistics(self) -> SupervisorStatistics:
        """A frozen snapshot: per-child state, restarts, crashes, last error; totals."""
        children = tuple(child.statistics() for child in self._children.values())
        alive = sum(c.state in (ChildState.RUNNING, ChildState.STARTING) for c in children)
        return SupervisorStatistics(
            name=self.name,
            running=self._nursery is not None,
            children=children,
            total_restarts=self._total_restarts,
            total_crashes=self._total_crashes,
            children_alive=alive,
        )

    def _nursery_or_raise(self) -> trio.Nursery:
        if self._nursery is None:
            raise RuntimeError(f"supervisor {self.name!r} is not running")
        return self._nursery

    def _register(
        self,
        name: str,
        thunk: Callable[..., Awaitable[object]],
        wants_task_status: bool,
        restart: RestartMode,
        policy: RestartPolicy | None,
    ) -> _Child:
        if restart not in ("permanent", "transient", "temporary"):
            raise ValueError(f"unknown restart mode {restart!r}")
        old = self._children.get(name)
        if old is not None and old.state not in (ChildState.STOPPED, ChildState.FAILED):
            raise ValueError(f"supervisor {self.name!r} already has a live child {name!r}")
        breaker = CrashLoopBreaker(self.policy if policy is None else policy, self._rng)
        child = _Child(name, thunk, wants_task_status, restart, breaker)
        self._children[name] = child
        return child

    async def _supervise(self, child: _Child, task_status: trio.TaskStatus[object]) -> None:
        try:
            with child.scope:
                await self._restart_loop(child, task_status)
        finally:
            if child.state is not ChildState.FAILED:
                child.state = ChildState.STOPPED

    async def _restart_loop(self, child: _Child, task_status: trio.TaskStatus[object]) -> None:
        while True:
            started_at = trio.current_time()
            error: Exception | None = None
            try:
                if child.wants_task_status:
                    await child.thunk(task_status=_ChildTaskStatus(child, task_status))
                else:
                    await child.thunk()
            except Exception as exc:
                error = exc
                child.last_error = repr(exc)
            if child.scope.cancel_called:
                # stop_child(): whatever the incarnation did on its way out, it stays stopped.
                return
            if error is not None and trio.current_effective_deadline() == -math.inf:
                # Cancelled from outside and the child raised while unwinding: never a reason
                # to restart; let the error propagate like any nursery child's would.
                raise error
            if child.wants_task_status and not child.announced:
                # The first incarnation never became ready: report to the starter.
                del self._children[child.name]
                if error is not None:
                    raise error
                raise RuntimeError(f"child {child.name!r} returned before calling started()")
            if error is None and child.restart != "permanent":
                return
            if child.restart == "temporary":
                child.crashes += 1
                self._total_crashes += 1
                return
            child.crashes += 1
            self._total_crashes += 1
            now = trio.current_time()
            decision = child.breaker.record_crash(now, uptime=now - started_at)
            if isinstance(decision, Trip):
                child.state = ChildState.FAILED
                raise CrashLoopError(child.name, decision.crashes, decision.window, error)
            child.state = ChildState.BACKING_OFF
            await trio.sleep(decision.delay)
            child.restarts += 1
            self._total_restarts += 1
            child.state = ChildState.STARTING if child.wants_task_status else ChildState.RUNNING
