"""The state every part of the Raft core shares, and the transitions they all use.

:class:`~skulk.consensus._core.RaftCore` is assembled from this base, :mod:`._election`
(PreVote, votes, leadership transfer on the receiving side) and :mod:`._replication`
(AppendEntries and InstallSnapshot on both sides, commitment). They are one object: the split
is only to keep each file about one part of the protocol.
"""

from __future__ import annotations

import enum
import random

import attrs

from ._log import RaftLog
from ._progress import Progress
from ._types import (
    ConfState,
    Entry,
    HardState,
    LogPosition,
    Message,
    NodeId,
    Payload,
    Recovered,
    Snapshot,
    SnapshotMeta,
)


class Role(enum.Enum):
    FOLLOWER = "follower"
    PRE_CANDIDATE = "pre_candidate"
    CANDIDATE = "candidate"
    LEADER = "leader"


@attrs.frozen
class RaftConfig:
    election_ticks: int = 10
    """Minimum election timeout; each wait is drawn from ``[election_ticks, 2*election_ticks)``."""
    heartbeat_ticks: int = 2
    pre_vote: bool = True
    check_quorum: bool = True
    max_append_entries: int = 64
    max_inflight: int = 8
    snapshot_chunk_bytes: int = 64 * 1024
    learner_catchup_entries: int = 16
    """A learner whose log is within this many entries of the leader's may be promoted."""


@attrs.frozen
class RaftStatistics:
    node_id: NodeId
    role: str
    term: int
    leader: NodeId | None
    commit: int
    applied: int
    last_index: int
    snapshot_index: int
    voters: tuple[NodeId, ...]
    learners: tuple[NodeId, ...]
    elections_started: int


class CoreState:
    """Fields and shared transitions (see the module doc)."""

    def __init__(
        self, node_id: NodeId, config: RaftConfig, rng: random.Random, recovered: Recovered
    ) -> None:
        self.node_id = node_id
        self.config = config
        self._rng = rng
        hs = recovered.hard_state
        snap = recovered.snapshot
        self._snapshot: Snapshot | None = snap
        self.log = RaftLog(snap.meta if snap else None, recovered.entries)
        self.term = hs.term
        self.vote = hs.vote
        self.commit = max(hs.commit, self.log.snapshot_index)
        if self.commit > self.log.last_index:
            raise ValueError(f"commit {self.commit} beyond the log ({self.log.last_index})")
        self.applied = self.log.snapshot_index
        self.role = Role.FOLLOWER
        self.leader: NodeId | None = None
        self.elections_started = 0
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = self._random_timeout()
        self._votes: dict[NodeId, bool] = {}
        self._progress: dict[NodeId, Progress] = {}
        self._last_active: set[NodeId] = set()
        """Voters that answered during the last CheckQuorum period (leader only)."""
        self._pending_conf_index = 0
        self._transfer_target: NodeId | None = None
        self._transfer_elapsed = 0
        self._incoming: tuple[SnapshotMeta, bytearray] | None = None
        # what the next Ready carries
        self._persisted_hs = HardState(hs.term, hs.vote, self.commit)
        self._out_messages: list[Message] = []
        self._out_entries: list[Entry] = []
        self._out_snapshot: Snapshot | None = None
        self._out_restore = False
        self._proposed: LogPosition | None = None

    @property
    def conf(self) -> ConfState:
        return self.log.conf

    def _send(self, dst: NodeId, payload: Payload) -> None:
        self._out_messages.append(Message(self.node_id, dst, payload))

    def _note_truncation(self, index: int) -> None:
        self._out_entries = [e for e in self._out_entries if e.index < index]

    def _random_timeout(self) -> int:
        e = self.config.election_ticks
        return self._rng.randrange(e, 2 * e)

    def _promotable(self) -> bool:
        """May this node campaign? A voter of the latest membership, or of the committed one:
        a leader whose own removal is appended but not committed must still be able to
        campaign, or a two-voter cluster would wait forever for its vote."""
        if self.node_id in self.conf.voters:
            return True
        return self.node_id in self.log.conf_at(self.commit).voters

    def _reset(self, term: int) -> None:
        if term != self.term:
            self.term = term
            self.vote = None
        self.leader = None
        self._election_elapsed = 0
        self._heartbeat_elapsed = 0
        self._timeout = self._random_timeout()
        self._votes = {}
        self._progress = {}
        self._last_active = set()
        self._transfer_target = None

    def _become_follower(self, term: int, leader: NodeId | None) -> None:
        self._reset(term)
        self.role = Role.FOLLOWER
        self.leader = leader

    def _become_leader(self) -> None:
        raise NotImplementedError  # RaftCore's
