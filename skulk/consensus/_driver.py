"""The Raft driver: a Trio actor around :class:`RaftCore`, durable storage and a transport.

Usage (under a nursery)::

    driver = RaftDriver("n1", voters=("n1", "n2", "n3"), machine=Counter(),
                        open_storage=lambda: Storage.open(OsDisk(path)), transport=transport)
    await nursery.start(driver.run)
    result = await driver.submit(b"incr", client_id="api-1", seq=7, timeout=2.0)

**Stepping and persisting.** The core is stepped synchronously (never across an ``await``) by
whoever has an input: the transport's task that received a message (the transport offers it,
:meth:`Transport.offer_to`: no task switch; one that cannot be stepped at once is queued for the
driver's reader task, and so are the ones after it), the ticker (a :class:`Tick` every
``tick_seconds``; late ticks are dropped, which only lengthens timeouts), and submitters
(proposals). Each :class:`Ready` is folded into the *open batch*. One persister task takes the
batches in order: one ``storage.persist`` (one fsync; inline or in a worker thread, see below),
*then* the batch's messages are sent. Until the persister takes the next batch, steps go on
filling it, so under load many commands share one fsync, and consecutive AppendRequests to a peer
are folded into one message. A batch that only moves the commit index is not synced first
(Raft keeps the commit index volatile; it is written with the next sync). A ready carrying a
snapshot starts a batch of its own.

**Inline persists.** Handing an fsync to a worker thread and back costs ~0.1-0.3 ms idle --
as much as the fsync on a local SSD -- and, under load, the hand-back waits behind every
runnable task (tens of ms with a thousand clients). So while recent inline persists waited
less than :attr:`DriverConfig.inline_persist_below` for the disk (a moving average), a batch
is persisted in the Trio thread, blocking it for that long. A batch whose AppendRequests (a
leader's, below) were just handed to the transport is special: its tasks write them out only
when the loop runs. On a quiet loop (at most :attr:`DriverConfig.quiet_loop_tasks` runnable
tasks) the persister waits until they are written (:meth:`Transport.wait_sent`, at most
:attr:`DriverConfig.send_wait`), then persists inline; on a loop with clients to serve the
fsync goes to the worker thread and runs beside replication while the loop serves clients and
replies; and a loop with at least :attr:`DriverConfig.busy_loop_tasks` runnable tasks, where
the hand-back would wait longer than the fsync, persists inline at once. A slow disk, and any
batch holding a snapshot, use the worker thread, so the loop is never blocked for long (the
worst cases inline: one segment rotation, which compresses the closed 4 MiB segment, and one
timing probe in 32 persists on a slow disk).

**A leader replicates while it syncs** (Ongaro's dissertation §10.2.1): a batch's
AppendRequests go out when the persister takes the batch, *before* its fsync, unless the batch
changes the term or vote, holds a snapshot or appends a membership change
(:meth:`Batch.take_early`). Votes and acknowledgements still wait for the fsync. The core
counts the leader's own log when it decides what is committed, so the driver makes nothing of
a commit visible until this node's copy is durable too: committed entries wait in a
:class:`CommitQueue` until the node's durable log covers them, then are applied (in order)
and their submitters answered; and the commit index an AppendRequest carries is lowered to
that durable index. One idle commit therefore costs the follower round trip and the
follower's fsync, with the leader's fsync beside them rather than before them.

**Submissions** work on every node: the leader proposes them; a follower forwards them to the
leader over the transport, under the caller's deadline, retrying across leader changes and
lost proposals until the deadline. Each command carries ``(client_id, seq)`` and the state
machine is wrapped in :class:`Sessions`, so retries apply at most once. Errors are typed
(:mod:`skulk.consensus._errors`).

**Disk failures.** ``DiskFull``/``DiskError`` from storage discard the core (nothing of the
failed batch or after it is sent or acknowledged), fail the waiting submitters with
:class:`Unavailable`, report the node unhealthy (:meth:`RaftDriver.statistics`) and reopen
storage with an exponential backoff; once it opens, a new core is built from what is on disk
and the node rejoins. Any other exception from the core or the storage ends
:meth:`RaftDriver.run` (let it crash: a supervisor restarts it; recovery is the same path as
a process restart).

Bounded: the open batch takes ``max_batch`` inputs (then steppers wait for the persister;
messages back up into the transport's bounded inbox, which drops); at most ``max_pending``
submissions wait on this node (beyond: :class:`Unavailable` ``overloaded``); every wait has the
caller's deadline. A persist cannot be abandoned half-way: cancelling :meth:`RaftDriver.run`
waits for the fsync in flight.
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from typing import Generic

import attrs
import trio

from ._batch import Batch, CommitQueue, Retry, Waiter, WaiterTable
from ._core import RaftCore, Role
from ._disk import DiskError, DiskFull
from ._driverconfig import DriverConfig as DriverConfig
from ._driverconfig import DriverStatistics as DriverStatistics
from ._driverconfig import Storage, StorageOpener
from ._errors import (
    NoQuorum,
    NotLeader,
    ProposalRefused,
    SubmitTimeout,
    Unavailable,
    UnavailableReason,
)
from ._machine import S, Sessions, SessionState, StateMachine
from ._transport import SubmitRequest, Transport
from ._types import (
    Compact,
    ConfChange,
    ConfState,
    Entry,
    HardState,
    Input,
    Message,
    NodeId,
    Propose,
    ProposeConfChange,
    Ready,
    Receive,
    Recovered,
    Snapshot,
    SnapshotMeta,
    Tick,
    TransferLeadership,
)

log = logging.getLogger("skulk.consensus.driver")


_PROBE_INLINE_EVERY = 32
"""While persists go to a worker thread, every this many one runs inline again, to time the
disk afresh (a thread's own timing includes its waits for the GIL held by a busy loop)."""


async def _reraise(exc: Exception) -> None:
    """Raise ``exc`` (caught in a foreign task) in the task this is started in."""
    raise exc


def _timed(persist: Callable[..., None], **kwargs: object) -> float:
    """Run ``persist(**kwargs)``; the seconds it spent waiting for the disk (wall time less
    this thread's CPU time: encoding costs the loop as much in a worker thread, under the GIL,
    as inline; only the wait is what a worker thread would hide)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    persist(**kwargs)
    return max(0.0, (time.perf_counter() - wall) - (time.thread_time() - cpu))


class RaftDriver(Generic[S]):
    """One node's Raft: see the module doc. ``voters`` is the initial membership, used when
    storage holds no snapshot (a new cluster: every node must be given the same voters); with
    no voters, a node with empty storage joins an existing cluster (the leader adds it).
    ``machine`` is wrapped in :class:`Sessions`; :attr:`state` is its current state."""

    def __init__(
        self,
        node_id: NodeId,
        *,
        voters: Sequence[NodeId],
        machine: StateMachine[S],
        open_storage: StorageOpener,
        transport: Transport,
        config: DriverConfig = DriverConfig(),  # noqa: B008 - frozen, so sharing is safe
        rng: random.Random | None = None,
    ) -> None:
        if transport.node_id != node_id:
            raise ValueError(f"transport of {transport.node_id!r} given to node {node_id!r}")
        if not (math.isfinite(config.tick_seconds) and config.tick_seconds > 0):
            raise ValueError(f"tick_seconds must be finite and > 0, not {config.tick_seconds}")
        self.node_id = node_id
        self._voters = tuple(sorted(set(voters)))
        self._sessions = Sessions(machine, max_sessions=config.max_sessions)
        self._open_storage = open_storage
        self._transport = transport
        self._config = config
        self._rng = rng if rng is not None else random.Random()
        self._state: SessionState[S] = self._sessions.initial()
        self._core: RaftCore | None = None
        self._storage: Storage | None = None
        self._unavailable: UnavailableReason | None = UnavailableReason.STOPPED
        self._started = self._running = False
        self._waiters = WaiterTable()
        self._expiry = trio.CancelScope()  # the sleep of _expire_waiters
        self._changed = trio.Event()
        self._applied_changed = trio.Event()
        self._seen: tuple[Role, NodeId | None, int] | None = None
        self._queue: collections.deque[Batch] = collections.deque([Batch()])
        self._work = trio.Event()  # the open batch got something
        self._nursery: trio.Nursery | None = None  # run's: an offered message's crash ends it
        self._progress = trio.Event()  # the persister took a batch
        self._generation = 0  # bumped when storage fails: batches of the old core are void
        self._synced = HardState()  # the hard state on disk
        self._carried: HardState | None = None  # a newer commit index, written with the next sync
        self._commits = CommitQueue()  # committed entries waiting to be durable here
        self._applied = 0
        self._compact_due = False
        self._backoff = 0.0
        self._persist_time = 0.0
        self._persist_ewma = 0.0  # recent inline persists' waits for the disk (s)
        self._inline_persists = self._threaded_in_row = 0
        self._batches = self._inputs = self._largest = self._persists = self._persisted = 0
        self._sent = self._received = self._proposals = self._forwards = 0
        self._snapshots = self._disk_failures = self._reopens = 0

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
        )

    async def submit(
        self,
        command: bytes,
        *,
        client_id: str,
        seq: int,
        timeout: float,  # noqa: ASYNC109 - it travels with forwarded submissions
        forward: bool = True,
    ) -> bytes:
        """Replicate ``command`` and return the state machine's result for it.

        ``(client_id, seq)``: ``client_id`` is non-empty and stable across retries; ``seq``
        grows with each new command of that client (``>= 1``); a retry reuses it and applies at
        most once. Works on any node: a follower forwards to the leader (unless ``forward`` is
        False: then :class:`NotLeader` on a non-leader). Waits at most ``timeout`` seconds.

        Raises :class:`NoQuorum` (no reachable leader before the deadline),
        :class:`SubmitTimeout` (a leader took it; no commit seen: outcome unknown),
        :class:`Unavailable` (this node's storage failed, it is stopped, or overloaded) and
        :class:`NotLeader` (``forward=False`` only).
        """
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be finite and > 0, not {timeout!r}")
        if not client_id or seq < 1:
            raise ValueError("a submission needs a client_id and a seq >= 1")
        request = SubmitRequest(command, client_id, seq, 0)
        return await self._submit(request, trio.current_time() + timeout, forward, timeout)

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

    # ---- submissions ----

    async def _serve_forwarded(self, request: SubmitRequest, deadline: float) -> bytes:
        timeout = max(deadline - trio.current_time(), 1e-6)
        return await self._submit(request, deadline, False, timeout)

    async def _submit(
        self,
        request: SubmitRequest,
        deadline: float,
        forward: bool,
        timeout: float,  # noqa: ASYNC109 - for the error message only
    ) -> bytes:
        reached = False  # a leader took (or may have taken) the command
        seen = "no leader"
        while True:
            if not self._running or self._unavailable is not None or self._core is None:
                raise Unavailable(self._unavailable or UnavailableReason.STOPPED)
            if trio.current_time() >= deadline:
                raise SubmitTimeout(timeout) if reached else NoQuorum(seen)
            core = self._core
            pause = self._config.retry_interval
            if core.role is Role.LEADER:
                reached = True
                proposed = await self._propose(core, request, deadline)
                if not isinstance(proposed, Retry):
                    return proposed
                pause = proposed.pause
            elif core.leader is not None and core.leader != self.node_id:
                if not forward:
                    raise NotLeader(core.leader)
                reached, result, seen = await self._forward(core.leader, request, deadline, reached)
                if result is not None:
                    return result
            elif not forward:
                raise NotLeader(None)
            with trio.move_on_at(min(deadline, trio.current_time() + pause)):
                await self._changed.wait()

    async def _forward(
        self, leader: NodeId, request: SubmitRequest, deadline: float, reached: bool
    ) -> tuple[bool, bytes | None, str]:
        """One forwarding attempt: (reached a leader?, result or None to retry, last seen)."""
        self._forwards += 1
        try:
            return True, await self._transport.forward(leader, request, deadline), ""
        except SubmitTimeout:
            return True, None, f"{leader} did not answer"
        except NotLeader as exc:
            return reached, None, f"{leader} does not lead (hint: {exc.leader})"
        except (NoQuorum, Unavailable) as exc:
            return reached, None, str(exc)
        except Exception as exc:  # ForwardFailed and friends: the peer cannot be reached now
            return reached, None, f"{leader} unreachable: {exc}"

    async def _propose(
        self, core: RaftCore, request: SubmitRequest, deadline: float
    ) -> bytes | Retry:
        if len(self._waiters) >= self._config.max_pending:
            raise Unavailable(UnavailableReason.OVERLOADED, f"{len(self._waiters)} pending")
        waiter = Waiter(deadline=deadline)
        self._waiters.add(waiter)
        if deadline < self._expiry.deadline:
            self._expiry.deadline = deadline
        try:
            if self._queue[-1].inputs >= self._config.max_batch:
                with trio.move_on_at(deadline):
                    await self._admit(core)
            if self._core is not core or trio.current_time() >= deadline:
                return Retry(0.0)  # the core was discarded, or the deadline: the caller decides
            proposal = Propose(request.command, request.client_id, request.seq)
            try:
                ready = self._step(core, proposal)
            except NotLeader:
                return Retry(0.0)
            except ProposalRefused:  # a transfer or conf change under way: try again soon
                return Retry(self._config.retry_interval)
            self._proposals += 1
            if ready.proposed is not None:
                self._waiters.place(waiter, ready.proposed.index, ready.proposed.term)
            await waiter.event.wait()  # finished by a commit, a failure or _expire_waiters
            if isinstance(waiter.outcome, Exception):
                raise waiter.outcome
            assert waiter.outcome is not None
            return waiter.outcome
        finally:
            self._waiters.discard(waiter)

    async def _expire_waiters(self) -> None:
        """Finish submissions whose deadline passed (see :class:`WaiterTable`); a proposal with
        an earlier deadline than the one slept for moves this task's deadline forward."""
        while True:
            self._waiters.expire(trio.current_time())
            self._expiry = trio.CancelScope(deadline=self._waiters.next_deadline())
            with self._expiry:
                await trio.sleep_forever()

    def _note_change(self) -> None:
        core = self._core
        seen = (core.role, core.leader, core.term) if core is not None else None
        if seen == self._seen:
            return
        old = self._seen
        if (
            old is not None
            and old[0] is Role.LEADER
            and (seen is None or seen[0] is not Role.LEADER or seen[2] != old[2])
        ):
            # Our proposals may or may not commit under the next leader: retry them there
            # (sessions make a second copy harmless).
            self._waiters.retry_all()
        self._seen = seen
        self._changed.set()
        self._changed = trio.Event()

    # ---- stepping ----

    async def _admit(self, core: RaftCore) -> bool:
        """Wait while the open batch is full; False if ``core`` was discarded meanwhile."""
        while self._queue[-1].inputs >= self._config.max_batch and self._core is core:
            await self._progress.wait()
        return self._core is core

    def _step(self, core: RaftCore, inp: Input) -> Ready:
        """Step ``core`` and fold the ready into the open batch (never awaits).

        Committed entries already durable here are applied at once (an answer does not wait
        behind this node's next fsync); the rest wait in the :class:`CommitQueue` for the
        persist that covers them. A leader's snapshot is restored at once: it holds only
        committed state (and it replaces whatever was waiting)."""
        ready = core.step(inp)
        self._inputs += 1
        batch = self._queue[-1]
        if not batch.add(ready):  # a snapshot starts a batch of its own
            batch = Batch()
            batch.add(ready)
            self._queue.append(batch)
        batch.inputs += 1
        self._commit(ready.snapshot if ready.restore else None, ready.committed)
        self._work.set()
        self._note_change()
        return ready

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
                self._step(core, Compact(self._applied, self._sessions.snapshot(self._state)))

    # ---- persisting, sending, applying ----

    async def _persister(self) -> None:
        """Take the oldest batch; persist it if it needs a sync; then send its messages and
        apply its committed entries. Steps go on meanwhile and fill the next batch."""
        while True:
            while self._queue[0].empty():
                await self._work.wait()
                self._work = trio.Event()
            batch = self._queue.popleft()
            if not self._queue:
                self._queue.append(Batch())
            self._batches += 1
            self._largest = max(self._largest, batch.inputs)
            await self._flush(batch)
            self._progress.set()
            self._progress = trio.Event()

    async def _flush(self, batch: Batch) -> None:
        storage, generation = self._storage, self._generation
        assert storage is not None
        hard_state = batch.hard_state
        if batch.needs_sync(self._synced):
            early = batch.take_early(self._synced)
            self._send_all(early)
            hard_state = hard_state or self._carried
            persist = functools.partial(
                _timed,
                storage.persist,
                snapshot=batch.snapshot,
                entries=tuple(batch.entries),
                hard_state=hard_state,
                restore=batch.restore,
            )
            inline = await self._inline(batch, bool(early))
            started = trio.current_time()
            try:
                took = persist() if inline else await trio.to_thread.run_sync(persist)
            except DiskFull as exc:
                self._degrade(UnavailableReason.DISK_FULL, exc)
                return
            except DiskError as exc:
                self._degrade(UnavailableReason.DISK_ERROR, exc)
                return
            self._persist_time += trio.current_time() - started
            if inline:  # timed without a worker thread fighting the loop for the GIL
                self._persist_ewma += (took - self._persist_ewma) / 8
                self._inline_persists += 1
                self._threaded_in_row = 0
            else:
                self._threaded_in_row += 1
            self._persists += 1
            self._persisted += len(batch.entries)
            self._backoff = 0.0
            self._synced = hard_state or self._synced
            self._carried = None
            self._commits.durable = batch.last_index_after(self._commits.durable)
        elif hard_state is not None:
            self._carried = hard_state  # only the commit index moved: no fsync needed first
        if generation != self._generation:  # pragma: no cover - degraded meanwhile
            return
        self._send_all(batch.messages)
        self._apply_ready(None, self._commits.take())
        await trio.lowlevel.checkpoint()  # an inline persist never yielded: let the loop run

    async def _inline(self, batch: Batch, sent_early: bool) -> bool:
        """Whether to persist ``batch`` in the Trio thread (see the module doc); with
        AppendRequests just sent on a quiet loop, first waits (briefly) until they are out."""
        config = self._config
        if batch.snapshot is not None or config.inline_persist_below <= 0:
            return False
        if self._persist_ewma >= config.inline_persist_below:
            return self._threaded_in_row >= _PROBE_INLINE_EVERY  # time the disk afresh
        if not sent_early:
            return True
        # AppendRequests just went to the transport, whose tasks write them out only when the
        # loop runs: blocking it now would hold them back for the whole fsync. On a quiet loop
        # they are out after a few task switches: wait for that, then persist inline (a worker
        # thread's hand-off and hand-back cost more than the fsync itself). On a loop with
        # clients to serve, a worker thread lets them go and the loop work meanwhile -- unless
        # the loop is so busy that the hand-back would wait longer than the fsync.
        runnable = trio.lowlevel.current_statistics().tasks_runnable
        if runnable >= config.busy_loop_tasks:
            return True
        if runnable > config.quiet_loop_tasks:
            return False
        with trio.move_on_after(config.send_wait):
            await self._transport.wait_sent()
            return True
        return False  # not out in time (a stalled link?): let the loop run during the fsync

    def _send_all(self, messages: Sequence[Message]) -> None:
        commits = self._commits
        for message in messages:
            self._transport.send(commits.cap(message))
        self._sent += len(messages)

    def _commit(self, restored: Snapshot | None, entries: Sequence[Entry]) -> None:
        """Take what a step reports: restore ``restored`` now (the entries waiting are in it),
        queue ``entries`` and apply those already durable here."""
        if restored is not None:
            self._commits.clear()
        self._commits.push(entries)
        self._apply_ready(restored, self._commits.take())

    def _apply_ready(self, restored: Snapshot | None, entries: Sequence[Entry]) -> None:
        """Restore the state machine from ``restored`` (if any), then apply ``entries``."""
        if restored is not None:
            self._state = self._sessions.restore(restored.data)
            self._applied = restored.meta.index
            self._waiters.retry_through(self._applied)
        if entries:
            self._state, results = self._sessions.apply_all(self._state, entries)
            for entry, result in zip(entries, results, strict=True):
                self._waiters.committed(entry.index, entry.term, result)
            self._applied = entries[-1].index
        if restored is not None or entries:
            self._applied_changed.set()
            self._applied_changed = trio.Event()
        core, every = self._core, self._config.snapshot_every
        if core is not None and every > 0 and self._applied - core.first_index + 1 >= every:
            self._compact_due = True

    # ---- storage failure and recovery ----

    def _degrade(self, reason: UnavailableReason, exc: BaseException) -> None:
        self._disk_failures += 1
        log.warning("raft %s: storage failed (%s): %s; reopening", self.node_id, reason.value, exc)
        self._core = None
        self._storage = None
        self._generation += 1
        self._queue = collections.deque([Batch()])
        self._commits.clear()  # never applied: the next core re-applies from disk
        self._unavailable = reason
        self._back_off()
        self._waiters.fail_all(Unavailable(reason, str(exc)[:200]))
        self._progress.set()  # steppers waiting for room see the core gone
        self._progress = trio.Event()
        self._note_change()

    async def _recover(self, attempts: float = math.inf) -> None:
        """Open storage and build a core from it, retrying with backoff (at most ``attempts``
        times). Meanwhile messages are dropped and submissions fail ``unavailable``."""
        while attempts > 0:
            attempts -= 1
            await trio.sleep(self._backoff)
            self._reopens += 1
            try:
                storage, recovered = await trio.to_thread.run_sync(self._open_storage)
                await self._start(storage, recovered)
                return
            except DiskFull as exc:
                self._unavailable = UnavailableReason.DISK_FULL
                log.warning("raft %s: storage does not open: %s", self.node_id, exc)
            except DiskError as exc:
                self._unavailable = UnavailableReason.DISK_ERROR
                log.warning("raft %s: storage does not open: %s", self.node_id, exc)
            self._back_off()

    def _back_off(self) -> None:
        """Double the pause before the next reopen (a persist that succeeds resets it)."""
        config = self._config
        self._backoff = min(max(self._backoff * 2, config.reopen_initial), config.reopen_max)

    async def _start(self, storage: Storage, recovered: Recovered) -> None:
        if recovered.snapshot is None and self._voters:
            # A new cluster: its initial membership and empty state, made durable at once so
            # that a later start with other arguments cannot change them.
            meta = SnapshotMeta(0, 0, ConfState(self._voters))
            image = self._sessions.snapshot(self._sessions.initial())
            boot = Snapshot(meta, image)
            await trio.to_thread.run_sync(functools.partial(storage.persist, snapshot=boot))
            recovered = attrs.evolve(recovered, snapshot=boot)
        # Without voters and a snapshot, this node joins a running cluster: it waits, empty,
        # until the leader adds it and sends it a snapshot.
        core = RaftCore(self.node_id, self._config.raft, self._rng, recovered)
        ready = core.initial_ready()
        self._state, self._applied = self._sessions.initial(), 0
        self._core, self._storage, self._unavailable = core, storage, None
        self._commits = CommitQueue(durable=core.last_index)  # all it recovered is on disk
        self._commit(ready.snapshot if ready.restore else None, ready.committed)
        self._synced, self._carried = recovered.hard_state, ready.hard_state
        self._note_change()
        log.info("raft %s: started at term %d, commit %d", self.node_id, core.term, core.commit)
