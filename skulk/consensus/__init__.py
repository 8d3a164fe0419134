"""Consensus: a Raft replicated log (sans-IO core), its durable storage and its Trio driver.

The core::

    from skulk.consensus import RaftCore, RaftConfig, Recovered, Tick, Receive, Propose

    core = RaftCore("n1", RaftConfig(), random.Random(seed), recovered)
    ready = core.initial_ready()     # state to restore, committed entries to re-apply
    ready = core.step(Tick())        # persist, then send, then apply: see Ready

See :mod:`skulk.consensus._core` for the protocol, :mod:`skulk.consensus._types` for the
values and ``specs/consensus.md`` for the normative description.
"""

from ._core import NotLeader, ProposalRefused, RaftConfig, RaftCore, RaftStatistics, Role
from ._log import LogConflict
from ._types import (
    AppendReply,
    AppendRequest,
    Compact,
    ConfChange,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Input,
    LogPosition,
    Message,
    NodeId,
    Payload,
    Propose,
    ProposeConfChange,
    Ready,
    Receive,
    Recovered,
    Snapshot,
    SnapshotChunk,
    SnapshotMeta,
    SnapshotReply,
    Tick,
    TimeoutNow,
    TransferLeadership,
    VoteReply,
    VoteRequest,
)

__all__ = [
    "AppendReply",
    "AppendRequest",
    "Compact",
    "ConfChange",
    "ConfState",
    "Entry",
    "EntryKind",
    "HardState",
    "Input",
    "LogConflict",
    "LogPosition",
    "Message",
    "NodeId",
    "NotLeader",
    "Payload",
    "ProposalRefused",
    "Propose",
    "ProposeConfChange",
    "RaftConfig",
    "RaftCore",
    "RaftStatistics",
    "Ready",
    "Receive",
    "Recovered",
    "Role",
    "Snapshot",
    "SnapshotChunk",
    "SnapshotMeta",
    "SnapshotReply",
    "Tick",
    "TimeoutNow",
    "TransferLeadership",
    "VoteReply",
    "VoteRequest",
]
