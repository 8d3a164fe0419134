"""The Raft driver's side of durable storage: persisting batches, then sending and applying.

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

**Disk failures.** ``DiskFull``/``DiskError`` from storage discard the core (nothing of the
failed batch or after it is sent or acknowledged), fail the waiting submitters with
:class:`Unavailable`, report the node unhealthy (:meth:`RaftDriver.statistics`) and reopen
storage with an exponential backoff; once it opens, a new core is built from what is on disk
and the node rejoins. Any other exception from the core or the storage ends
:meth:`RaftDriver.run` (let it crash: a supervisor restarts it; recovery is the same path as
a process restart).
"""

from __future__ import annotations

import collections
import functools
import logging
import math
import time
from collections.abc import Callable, Sequence

import attrs
import trio

from ._batch import Batch, CommitQueue
from ._core import RaftCore
from ._disk import DiskError, DiskFull
from ._driverbase import DriverBase
from ._driverconfig import Storage
from ._errors import Unavailable, UnavailableReason
from ._machine import S
from ._types import ConfState, Message, Recovered, Snapshot, SnapshotMeta

log = logging.getLogger("skulk.consensus.driver")


_PROBE_INLINE_EVERY = 32
"""While persists go to a worker thread, every this many one runs inline again, to time the
disk afresh (a thread's own timing includes its waits for the GIL held by a busy loop)."""


def _timed(persist: Callable[..., None], **kwargs: object) -> float:
    """Run ``persist(**kwargs)``; the seconds it spent waiting for the disk (wall time less
    this thread's CPU time: encoding costs the loop as much in a worker thread, under the GIL,
    as inline; only the wait is what a worker thread would hide)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    persist(**kwargs)
    return max(0.0, (time.perf_counter() - wall) - (time.thread_time() - cpu))


class DriverStorage(DriverBase[S]):
    """Persisting, sending and applying in order; reopening failed storage (see the module
    doc)."""

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
