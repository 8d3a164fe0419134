"""The state every part of the Raft driver shares, and the stepping they all use.

:class:`~skulk.consensus._driver.RaftDriver` is assembled from this base,
:mod:`._driverstorage` (persisting batches, then sending and applying; storage failure and
reopening) and :mod:`._submitting` (client submissions: proposing on the leader, forwarding
from a follower, deadlines). They are one object: the split keeps each file about one part of
the driver (see :mod:`._driver` for the whole).
"""

from __future__ import annotations

import collections
import math
import random
import time
from collections.abc import Sequence
from typing import Generic

import trio

from ._batch import Batch, CommitQueue, WaiterTable
from ._core import RaftCore, Role
from ._driverconfig import DriverConfig, Storage, StorageOpener
from ._errors import UnavailableReason
from ._machine import S, Sessions, SessionState, StateMachine
from ._transport import Transport
from ._types import Entry, HardState, Input, NodeId, Ready, Snapshot


class DriverBase(Generic[S]):
    """The driver's fields and its stepping (see the module doc)."""

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
        self._leader_changes = 0  # leaders (term, node) this node came to know
        self._known_leader: tuple[int, NodeId] | None = None
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
        self._entries_applied = self._snapshot_bytes = 0
        self._apply_seconds = self._snapshot_seconds = 0.0

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

    def _note_change(self) -> None:
        core = self._core
        seen = (core.role, core.leader, core.term) if core is not None else None
        if seen == self._seen:
            return
        old = self._seen
        if seen is not None and seen[1] is not None and self._known_leader != (seen[2], seen[1]):
            self._known_leader = (seen[2], seen[1])
            self._leader_changes += 1
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
            started = time.perf_counter()
            self._state, results = self._sessions.apply_all(self._state, entries)
            self._apply_seconds += time.perf_counter() - started
            self._entries_applied += len(entries)
            for entry, result in zip(entries, results, strict=True):
                self._waiters.committed(entry.index, entry.term, result)
            self._applied = entries[-1].index
        if restored is not None or entries:
            self._applied_changed.set()
            self._applied_changed = trio.Event()
        core, every = self._core, self._config.snapshot_every
        if core is not None and every > 0 and self._applied - core.first_index + 1 >= every:
            self._compact_due = True
