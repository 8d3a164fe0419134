"""Consensus: a Raft replicated log (sans-IO core), its durable storage and its Trio driver.

The core (pure: no I/O, no clock; the simulator and the driver feed it inputs)::

    from skulk.consensus import RaftCore, RaftConfig, Recovered, Tick, Receive, Propose

    core = RaftCore("n1", RaftConfig(), random.Random(seed), recovered)
    ready = core.initial_ready()     # state to restore, committed entries to re-apply
    ready = core.step(Tick())        # persist, then send, then apply: see Ready

See :mod:`skulk.consensus._core` for the protocol, :mod:`skulk.consensus._types` for the
values and ``specs/consensus.md`` for the normative description.

Durable storage: :class:`Storage` keeps the log, hard state and snapshots on a :class:`Disk`
(:class:`OsDisk` is a real directory; the simulator brings its own). The Trio driver around
core and storage (persist, then send, then apply; submissions from any node are forwarded to
the leader) applies committed entries to a :class:`StateMachine`, exactly once per
``(client_id, seq)`` (:class:`Sessions`)::

    driver = RaftDriver("n1", voters=("n1", "n2", "n3"), machine=Counter(),
                        open_storage=lambda: Storage.open(OsDisk(path)),
                        transport=MeshTransport(mesh), config=DriverConfig())
    await nursery.start(driver.run)
    result = await driver.submit(b"incr", client_id="c1", seq=1, timeout=5.0)

Its typed failures are :class:`ConsensusError`\\ s (:class:`NoQuorum`, :class:`SubmitTimeout`,
:class:`Unavailable`, ...). Transports: :class:`MeshTransport` over federation links (its rpc
method is :data:`SUBMIT_METHOD`), :class:`MemoryNetwork` for tests. :class:`ConsensusService`
is what ``serve`` runs: storage, driver and membership upkeep for one node. Snapshot images use
:func:`skulk.wire.pack`.
"""

from ._core import NotLeader, ProposalRefused, RaftConfig, RaftCore, Role
from ._disk import Disk, DiskError, DiskFull
from ._driver import DriverConfig, RaftDriver
from ._errors import ConsensusError, NoQuorum, SubmitTimeout, Unavailable, UnavailableReason
from ._machine import Counter, Sessions, SessionState, StateMachine
from ._meshtransport import SUBMIT_METHOD, MeshTransport
from ._osdisk import OsDisk
from ._service import ConsensusService
from ._storage import (
    DEFAULT_SEGMENT_BYTES,
    Storage,
    StorageCorrupt,
    StorageFailed,
    verified_regions,
)
from ._transport import MemoryNetwork
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
    "DEFAULT_SEGMENT_BYTES",
    "SUBMIT_METHOD",
    "AppendReply",
    "AppendRequest",
    "Compact",
    "ConfChange",
    "ConfState",
    "ConsensusError",
    "ConsensusService",
    "Counter",
    "Disk",
    "DiskError",
    "DiskFull",
    "DriverConfig",
    "Entry",
    "EntryKind",
    "HardState",
    "Input",
    "LogPosition",
    "MemoryNetwork",
    "MeshTransport",
    "Message",
    "NoQuorum",
    "NotLeader",
    "OsDisk",
    "Payload",
    "ProposalRefused",
    "Propose",
    "ProposeConfChange",
    "RaftConfig",
    "RaftCore",
    "RaftDriver",
    "Ready",
    "Receive",
    "Recovered",
    "Role",
    "SessionState",
    "Sessions",
    "Snapshot",
    "SnapshotChunk",
    "SnapshotMeta",
    "SnapshotReply",
    "StateMachine",
    "Storage",
    "StorageCorrupt",
    "StorageFailed",
    "SubmitTimeout",
    "Tick",
    "TimeoutNow",
    "TransferLeadership",
    "Unavailable",
    "UnavailableReason",
    "VoteReply",
    "VoteRequest",
    "verified_regions",
]
