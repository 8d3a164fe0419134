"""Configuration, statistics and storage interface of the Raft driver.

- :class:`Storage`: the protocol the driver needs of durable storage (one ``persist`` = one
  fsync), and :data:`StorageOpener`, which opens and recovers it.
- :class:`DriverConfig`: timings and bounds of a :class:`~skulk.consensus._driver.RaftDriver`.
- :class:`DriverStatistics`: a snapshot of a driver's state and counters.

Re-exported by :mod:`skulk.consensus._driver`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from ._core import RaftConfig
from ._types import Entry, HardState, NodeId, Recovered, Snapshot


class Storage(Protocol):
    """What the driver needs of :class:`~skulk.consensus._storage.Storage`."""

    def persist(
        self,
        *,
        snapshot: Snapshot | None = None,
        entries: Sequence[Entry] = (),
        hard_state: HardState | None = None,
        restore: bool = False,
    ) -> None:
        """Write and fsync (once); raises ``DiskFull`` / ``DiskError``. ``restore``: the
        snapshot is a leader's (the whole log is replaced)."""
        ...


StorageOpener = Callable[[], tuple[Storage, Recovered]]
"""Opens storage and recovers it (blocking I/O: the driver runs it in a worker thread)."""


@attrs.frozen
class DriverConfig:
    """Timings and bounds of a :class:`RaftDriver` (times in seconds)."""

    tick_seconds: float = 0.05
    """Wall time of one core :class:`Tick` (election timeout = ``raft.election_ticks`` ticks)."""
    raft: RaftConfig = RaftConfig()  # noqa: RUF009 - frozen, so sharing is safe
    snapshot_every: int = 10_000
    """Snapshot the state machine (and compact the log) every this many applied entries
    (0: never)."""
    max_batch: int = 1024
    """Inputs folded into one batch at most."""
    max_pending: int = 4096
    """Submissions waiting for their commit on this node at most."""
    retry_interval: float = 0.02
    """Pause before retrying a submission that found no leader or a stale one."""
    reopen_initial: float = 0.1
    reopen_max: float = 5.0
    """Backoff between attempts to reopen failed storage (doubling, capped)."""
    max_sessions: int = 4096
    inline_persist_below: float = 0.005
    """Persist in the Trio thread (no worker-thread hand-back) while recent persists waited less
    than this many seconds for the disk; slower disks, and snapshots, go to a worker thread
    (0: always)."""
    busy_loop_tasks: int = 64
    """A batch whose AppendRequests were just sent (a leader's) is persisted inline at once
    while at least this many Trio tasks are runnable (a worker thread's hand-back would wait
    behind them all); other batches whenever the disk is fast."""
    quiet_loop_tasks: int = 4
    """Such a batch is persisted inline too while at most this many tasks are runnable (an
    idle leader), once the transport has written those AppendRequests out (waiting at most
    :attr:`send_wait`): a worker thread's hand-off and hand-back cost more than the fsync.
    In between, it goes to a worker thread (the loop serves clients during the fsync)."""
    send_wait: float = 0.002
    """How long a quiet leader waits for its AppendRequests to be written before an inline
    fsync; past it (a stalled link), the fsync goes to a worker thread."""


@attrs.frozen
class DriverStatistics:
    """A snapshot of a :class:`RaftDriver`. ``healthy`` is False while storage is failed
    (``unavailable`` says why) or the driver is not running."""

    node_id: NodeId
    healthy: bool
    unavailable: str | None
    role: str | None
    term: int
    leader: NodeId | None
    commit: int
    applied: int
    last_index: int
    snapshot_index: int
    #: core steps (inputs), batches the persister took, the most inputs in one batch
    inputs: int
    batches: int
    largest_batch: int
    persists: int
    entries_persisted: int
    #: wall time spent waiting for persists (fsyncs), seconds
    persist_seconds: float
    #: persists run in the Trio thread (the rest ran in a worker thread)
    inline_persists: int
    messages_sent: int
    messages_received: int
    proposals: int
    forwards: int
    pending: int
    snapshots: int
    disk_failures: int
    reopen_attempts: int
    #: leaders this node came to know: one per term that had a leader here (the first too)
    leader_changes: int = 0
    #: committed entries applied to the state machine here, and the seconds applying them took
    #: (the state machine's ``apply`` alone, wall time)
    entries_applied: int = 0
    apply_seconds: float = 0.0
    #: seconds the state machine's ``snapshot`` took for this node's compactions, and the
    #: size of the last image (bytes; 0 before the first)
    snapshot_seconds: float = 0.0
    snapshot_bytes: int = 0
