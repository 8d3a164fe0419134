"""Values of the consensus layer: log entries, hard state, snapshots, messages, inputs, Ready.

Everything here is a frozen attrs value. The wire values (entries, memberships, the
:data:`Payload` messages) live in :mod:`skulk.wire.raft` and are re-exported here; a
:class:`Message` is a payload with its sender and receiver, which on a federation link are the
link's two ends.
"""

from __future__ import annotations

import attrs

from ..wire.raft import (
    AppendReply,
    AppendRequest,
    ConfChange,
    ConfOp,
    ConfState,
    Entry,
    EntryKind,
    NodeId,
    RaftPayload,
    SnapshotChunk,
    SnapshotMeta,
    SnapshotReply,
    TimeoutNow,
    VoteReply,
    VoteRequest,
)

Payload = RaftPayload

__all__ = [
    "AppendReply",
    "AppendRequest",
    "ConfChange",
    "ConfOp",
    "ConfState",
    "Entry",
    "EntryKind",
    "NodeId",
    "Payload",
    "SnapshotChunk",
    "SnapshotMeta",
    "SnapshotReply",
    "TimeoutNow",
    "VoteReply",
    "VoteRequest",
]


@attrs.frozen
class HardState:
    """What must survive a crash besides the log: current term, vote in it, commit index.
    Written atomically (one checksummed record) and synced before any message that depends
    on it is sent."""

    term: int = 0
    vote: NodeId | None = None
    commit: int = 0


@attrs.frozen
class Snapshot:
    """A state-machine image (opaque bytes) standing for the log up to ``meta.index``."""

    meta: SnapshotMeta
    data: bytes


# --- messages -----------------------------------------------------------------------------


@attrs.frozen
class Message:
    """One consensus message from ``src`` to ``dst``."""

    src: NodeId
    dst: NodeId
    payload: Payload


# --- inputs to the core -----------------------------------------------------------------------


@attrs.frozen
class Tick:
    """One unit of logical time (the driver maps it to wall time)."""


@attrs.frozen
class Receive:
    message: Message


@attrs.frozen
class Propose:
    """Append a client command (leader only)."""

    data: bytes
    client_id: str = ""
    seq: int = 0


@attrs.frozen
class ProposeConfChange:
    """Append a membership change (leader only; one uncommitted change at a time)."""

    change: ConfChange


@attrs.frozen
class TransferLeadership:
    """Hand leadership to ``target`` (a caught-up voter), e.g. on graceful shutdown."""

    target: NodeId


@attrs.frozen
class Compact:
    """The state machine's image ``data`` at applied index ``index``: keep it as the local
    snapshot and drop the log up to ``index``."""

    index: int
    data: bytes


Input = Tick | Receive | Propose | ProposeConfChange | TransferLeadership | Compact


@attrs.frozen
class LogPosition:
    index: int
    term: int


@attrs.frozen
class Ready:
    """What the driver must do after a step, in this order:

    1. persist ``snapshot`` (if any; the log up to its index is then discarded), then
       ``entries`` (an entry whose index is at or below the last stored index first truncates
       the stored log from that index), then ``hard_state`` (if any) -- and sync;
    2. only then send ``messages``;
    3. if ``restore``, replace the state machine with ``snapshot.data``; then apply
       ``committed`` in order.

    ``proposed`` is where a :class:`Propose` / :class:`ProposeConfChange` landed.

    (One exception, taken by :class:`~skulk.consensus.RaftDriver`: a leader's AppendRequests
    may go out before the sync when nothing is applied, and no commit index told, beyond what
    is durable on the leader; ``specs/consensus.md`` §1.)
    """

    hard_state: HardState | None = None
    snapshot: Snapshot | None = None
    restore: bool = False
    entries: tuple[Entry, ...] = ()
    messages: tuple[Message, ...] = ()
    committed: tuple[Entry, ...] = ()
    proposed: LogPosition | None = None

    def must_persist(self) -> bool:
        return self.hard_state is not None or self.snapshot is not None or bool(self.entries)


@attrs.frozen
class Recovered:
    """What storage hands the core at start-up: the durable hard state, latest snapshot (if
    any) and the log entries after it, in index order."""

    hard_state: HardState
    snapshot: Snapshot | None
    entries: tuple[Entry, ...]
