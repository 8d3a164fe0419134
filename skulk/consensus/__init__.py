"""Consensus: a Raft replicated log (sans-IO core), its durable storage and its Trio driver.

The core::

    from skulk.consensus import RaftCore, RaftConfig, Recovered, Tick, Receive, Propose

    core = RaftCore("n1", RaftConfig(), random.Random(seed), recovered)
    ready = core.initial_ready()     # state to restore, committed entries to re-apply
    ready = core.step(Tick())        # persist, then send, then apply: see Ready

See :mod:`skulk.consensus._core` for the protocol, :mod:`skulk.consensus._types` for the
values and ``specs/consensus.md`` for the normative description.

Around it: :class:`Storage` (durable log and snapshots over a :class:`OsDisk`), the Trio
:class:`RaftDriver` (persist, then send, then apply; submissions from any node), the
:class:`StateMachine` interface with exactly-once :class:`Sessions`, transports
(:class:`MeshTransport` over federation links, :class:`MemoryNetwork` for tests) and the
:class:`ConsensusService` that ``serve`` runs.
"""

from ._core import NotLeader, ProposalRefused, RaftConfig, RaftCore, RaftStatistics, Role
from ._driver import DriverConfig, DriverStatistics, RaftDriver
from ._errors import (
    ConsensusError,
    NoQuorum,
    SnapshotCorrupt,
    SubmitTimeout,
    Unavailable,
    UnavailableReason,
)
from ._log import LogConflict
from ._machine import Sessions, StateMachine, pack, unpack, unpack_as
from ._osdisk import OsDisk
from ._service import ConsensusService
from ._storage import Storage, StorageCorrupt, StorageError
from ._transport import SUBMIT_METHOD, MemoryNetwork, MeshTransport, Transport
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
    "SUBMIT_METHOD",
    "AppendReply",
    "AppendRequest",
    "Compact",
    "ConfChange",
    "ConfState",
    "ConsensusError",
    "ConsensusService",
    "DriverConfig",
    "DriverStatistics",
    "Entry",
    "EntryKind",
    "HardState",
    "Input",
    "LogConflict",
    "LogPosition",
    "MemoryNetwork",
    "MeshTransport",
    "Message",
    "NoQuorum",
    "NodeId",
    "NotLeader",
    "OsDisk",
    "Payload",
    "ProposalRefused",
    "Propose",
    "ProposeConfChange",
    "RaftConfig",
    "RaftCore",
    "RaftDriver",
    "RaftStatistics",
    "Ready",
    "Receive",
    "Recovered",
    "Role",
    "Sessions",
    "Snapshot",
    "SnapshotChunk",
    "SnapshotCorrupt",
    "SnapshotMeta",
    "SnapshotReply",
    "StateMachine",
    "Storage",
    "StorageCorrupt",
    "StorageError",
    "SubmitTimeout",
    "Tick",
    "TimeoutNow",
    "TransferLeadership",
    "Transport",
    "Unavailable",
    "UnavailableReason",
    "VoteReply",
    "VoteRequest",
    "pack",
    "unpack",
    "unpack_as",
]
