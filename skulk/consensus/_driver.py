"""The Raft driver: a Trio actor around :class:`RaftCore`, durable storage and a transport.

Usage (under a nursery)::

    driver = RaftDriver("n1", voters=("n1", "n2", "n3"), machine=Counter(),
                        open_storage=lambda: Storage.open(OsDisk(path)), transport=transport)
    await nursery.start(driver.run)
    result = await driver.submit(b"incr", client_id="api-1", seq=7, timeout=2.0)

The driver is one object assembled from parts (:mod:`._driverbase`: its fields and stepping;
:mod:`._driverstorage`: persisting, sending and applying, and failed storage;
:mod:`._submitting`: client submissions); each part's module says how it works.

**Stepping and persisting.** The core is stepped synchronously (never across an ``await``) by
whoever has an input: the transport's task that received a message (the transport offers it,
:meth:`Transport.offer_to`: no task switch; one that cannot be stepped at once is queued for the
driver's reader task, and so are the ones after it), the ticker (a :class:`Tick` every
``tick_seconds``; late ticks are dropped, which only lengthens timeouts), and submitters
(proposals). Each :class:`Ready` is folded into the *open batch*. One persister task takes the
batches in order: one ``storage.persist`` (one fsync; inline or in a worker thread, see
:mod:`._driverstorage`), *then* the batch's messages are sent. Until the persister takes the
next batch, steps go on filling it, so under load many commands share one fsync, and consecutive
AppendRequests to a peer are folded into one message. A batch that only moves the commit index
is not synced first (Raft keeps the commit index volatile; it is written with the next sync). A
ready carrying a snapshot starts a batch of its own.

Bounded: the open batch takes ``max_batch`` inputs (then steppers wait for the persister;
messages back up into the transport's bounded inbox, which drops); at most ``max_pending``
submissions wait on this node (beyond: :class:`Unavailable` ``overloaded``); every wait has the
caller's deadline. A persist cannot be abandoned half-way: cancelling :meth:`RaftDriver.run`
waits for the fsync in flight.
"""

from __future__ import annotations

import time

import trio

from ._core import Role
from ._driverconfig import DriverConfig as DriverConfig
from ._driverconfig import DriverStatistics as DriverStatistics
from ._driverstorage import DriverStorage, log
from ._errors import NoQuorum, NotLeader, ProposalRefused, Unavailable, UnavailableReason
from ._machine import S
from ._submitting import Submitting
from ._types import (
    Compact,
    ConfChange,
    ConfState,
    Message,
    NodeId,
    ProposeConfChange,
    Receive,
    Tick,
    TransferLeadership,
)


async def _reraise(exc: Exception) -> None:
    """Raise ``exc`` (caught in a foreign task) in the task this is started in."""
    raise exc


class RaftDriver(Submitting[S], DriverStorage[S]):
    """One node's Raft: see the module doc. ``voters`` is the initial membership, used when
    storage holds no snapshot (a new cluster: every node must be given the same voters); with
    no voters, a node with empty storage joins an existing cluster (the leader adds it).
    ``machine`` is wrapped in :class:`Sessions`; :attr:`state` is its current state."""

    # ---- public surface ----

    @property
    def state(self) -> S:
        """The state machine's state after the last applied entry."""
        return self._state.state

    @property
    def role(self) -> Role | None:
        """This node's role (``None`` while storage is failed or the driver is stopped)."""
        return self._core.role if self._core is not None else None

    @property
    def leader(self) -> NodeId | None:
        """Who this node believes leads (``None``: nobody known)."""
        return self._core.leader if self._core is not None else None

    @property
    def healthy(self) -> bool:
        return self._unavailable is None

    def statistics(self) -> DriverStatistics:
        core = self._core
        stats = core.statistics() if core is not None else None
        return DriverStatistics(
            node_id=self.node_id,
            healthy=self._unavailable is None,
            unavailable=self._unavailable.value if self._unavailable else None,
            role=stats.role if stats else None,
            term=stats.term if stats else 0,
            leader=stats.leader if stats else None,
            commit=stats.commit if stats else 0,
            applied=self._applied,
            last_index=stats.last_index if stats else 0,
            snapshot_index=stats.snapshot_index if stats else 0,
            inputs=self._inputs,
            batches=self._batches,
            largest_batch=self._largest,
            persists=self._persists,
            entries_persisted=self._persisted,
            persist_seconds=self._persist_time,
            inline_persists=self._inline_persists,
            messages_sent=self._sent,
            messages_received=self._received,
            proposals=self._proposals,
            forwards=self._forwards,
            pending=len(self._waiters),
            snapshots=self._snapshots,
            disk_failures=self._disk_failures,
            reopen_attempts=self._reopens,
            leader_changes=self._leader_changes,
            entries_applied=self._entries_applied,
            apply_seconds=self._apply_seconds,
            snapshot_seconds=self._snapshot_seconds,
            snapshot_bytes=self._snapshot_bytes,
        )

    @property
    def applied(self) -> int:
        """The index of the last entry applied to :attr:`state`."""
        return self._applied

    async def wait_applied(self, seen: int) -> None:
        """Wait until the applied index is no longer ``seen`` (an entry was applied or a
        snapshot restored). No deadline of its own: a watcher loops on it."""
        while self._applied == seen:
            await self._applied_changed.wait()

    async def wait_leader(self, timeout: float) -> NodeId:  # noqa: ASYNC109
        """The leader, once one is known (waits at most ``timeout`` s; :class:`NoQuorum`)."""
        with trio.move_on_after(timeout):
            while self.leader is None:
                await self._changed.wait()
            assert self.leader is not None
            return self.leader
        raise NoQuorum(f"no leader known to {self.node_id} within {timeout} s")

    async def transfer_leadership(self, *, timeout: float = 2.0) -> NodeId | None:  # noqa: ASYNC109
        """If this node leads, hand leadership to the most up-to-date other voter (graceful
        shutdown) and wait up to ``timeout`` s for another node to lead. Returns the leader
        then known (``None``, or this node, if the handover did not happen in time)."""
        core = self._core
        if core is None or core.role is not Role.LEADER:
            return self.leader

        def match(peer: NodeId) -> int:
            progress = core.progress(peer)
            return progress.match if progress is not None else -1

        others = [v for v in core.conf.voters if v != self.node_id]
        target = max(others, key=lambda p: (match(p), p), default=None)
        if target is None:
            return self.leader
        try:
            self._step(core, TransferLeadership(target))
        except (NotLeader, ProposalRefused) as exc:
            log.info("raft %s: no leadership transfer to %s: %s", self.node_id, target, exc)
            return self.leader
        with trio.move_on_after(timeout):
            while self._core is not None and self.leader in (None, self.node_id):
                await self._changed.wait()
        return self.leader

    @property
    def conf(self) -> ConfState | None:
        """The effective membership (``None`` while storage is failed or stopped)."""
        return self._core.conf if self._core is not None else None

    def caught_up(self, peer: NodeId) -> bool:
        """On the leader: whether ``peer``'s log is close enough to ours to promote it."""
        core = self._core
        progress = core.progress(peer) if core is not None else None
        if core is None or progress is None:
            return False
        return progress.match + core.config.learner_catchup_entries >= core.last_index

    def propose_conf_change(self, change: ConfChange) -> None:
        """On the leader: append one membership change (it takes effect once appended; see
        ``specs/consensus.md`` §6). Raises :class:`NotLeader` elsewhere, and
        :class:`~skulk.consensus.ProposalRefused` when the leader cannot take it now."""
        core = self._core
        if core is None:
            raise Unavailable(self._unavailable or UnavailableReason.STOPPED)
        self._step(core, ProposeConfChange(change))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the node until cancelled; started once storage was opened (or failed to open:
        then it keeps retrying, unhealthy). A driver runs once."""
        if self._started:
            raise RuntimeError("a RaftDriver runs once")
        self._started = self._running = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                await self._recover(attempts=1)
                nursery.start_soon(self._read_messages)
                nursery.start_soon(self._persister)
                nursery.start_soon(self._expire_waiters)
                self._transport.serve_submissions(self._serve_forwarded)
                self._transport.offer_to(self._offered)
                task_status.started()
                await self._tick_loop()
        finally:
            self._running = False
            self._unavailable = UnavailableReason.STOPPED
            self._transport.offer_to(None)
            self._nursery = None
            self._transport.serve_submissions(None)
            self._core = None
            self._waiters.fail_all(Unavailable(UnavailableReason.STOPPED))
            self._note_change()

    # ---- the tasks that step the core ----

    async def _read_messages(self) -> None:
        async for message in self._transport.inbound:
            core = self._core
            if core is None or not await self._admit(core):
                continue  # storage failed: drop it (the sender retries)
            self._received += 1
            self._step(core, Receive(message))

    def _offered(self, message: Message) -> bool:
        """A message offered by the transport in the task that received it (see
        :meth:`Transport.offer_to`): stepped at once, saving the switch to
        :meth:`_read_messages`, when that task is idle (parked on the empty inbound channel:
        it holds no earlier message, not even one just taken) and the open batch has room;
        otherwise refused (it is queued for that task, keeping the order). An exception from
        the core ends :meth:`run`, as it would from :meth:`_read_messages`."""
        core = self._core
        if (
            core is None
            or self._nursery is None
            or self._queue[-1].inputs >= self._config.max_batch
            or not self._transport.inbound.statistics().tasks_waiting_receive
        ):
            return False
        self._received += 1
        try:
            self._step(core, Receive(message))
        except Exception as exc:
            self._nursery.start_soon(_reraise, exc)
        return True

    async def _tick_loop(self) -> None:
        tick = self._config.tick_seconds
        next_tick = trio.current_time() + tick
        while True:
            core = self._core
            if core is None:
                await self._recover()
                next_tick = trio.current_time() + tick
                continue
            await trio.sleep_until(next_tick)
            if self._core is not core:
                continue
            next_tick = max(next_tick + tick, trio.current_time())
            self._step(core, Tick())
            if self._compact_due:
                self._compact_due = False
                self._snapshots += 1
                started = time.perf_counter()
                image = self._sessions.snapshot(self._state)
                self._snapshot_seconds += time.perf_counter() - started
                self._snapshot_bytes = len(image)
                self._step(core, Compact(self._applied, image))
