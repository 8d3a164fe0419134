"""The sans-IO Raft core: ``RaftCore.step(input) -> Ready``.

No clock, no I/O, no randomness but the injected ``random.Random``. Time is :class:`Tick`\\ s;
the driver (or the simulator) persists what a :class:`Ready` asks before sending its messages
and applies committed entries afterwards (see :class:`Ready`).

Implemented per the Raft paper and Ongaro's dissertation: randomized election timeout, PreVote
(§9.6), CheckQuorum and leader stickiness (§6.2, §4.2.3), a no-op on election with commitment
only through current-term entries (§5.4.2), fast log backtracking (§5.3), snapshots with
chunked InstallSnapshot (§7), single-server membership changes with learners that catch up
before promotion (§4.1-4.2), step-down of a removed leader, and leadership transfer (§3.10).
``specs/consensus.md`` is the normative description.

The methods whose names start with ``_rule_`` are single safety rules, kept apart so that the
simulator's negative controls (``skulk.sim`` mutants) can break exactly one of them.
"""

from __future__ import annotations

import enum
import random

import attrs

from ._errors import NotLeader as NotLeader
from ._errors import ProposalRefused as ProposalRefused
from ._log import RaftLog
from ._progress import Progress, Replication
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


class RaftCore:
    """One Raft node's protocol state. Build it from what storage recovered, take
    :meth:`initial_ready` once, then feed it inputs with :meth:`step`."""

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

    # --- introspection ---------------------------------------------------------------------

    @property
    def conf(self) -> ConfState:
        return self.log.conf

    @property
    def last_index(self) -> int:
        return self.log.last_index

    @property
    def first_index(self) -> int:
        return self.log.first_index

    @property
    def snapshot_meta(self) -> SnapshotMeta | None:
        return self._snapshot.meta if self._snapshot else None

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def term_at(self, index: int) -> int | None:
        return self.log.term_at(index)

    def entries(self, lo: int, hi: int) -> tuple[Entry, ...]:
        return self.log.slice(lo, hi)

    def progress(self, peer: NodeId) -> Progress | None:
        return self._progress.get(peer)

    def statistics(self) -> RaftStatistics:
        conf = self.conf
        return RaftStatistics(
            node_id=self.node_id,
            role=self.role.value,
            term=self.term,
            leader=self.leader,
            commit=self.commit,
            applied=self.applied,
            last_index=self.last_index,
            snapshot_index=self.log.snapshot_index,
            voters=conf.voters,
            learners=conf.learners,
            elections_started=self.elections_started,
        )

    # --- entry points ----------------------------------------------------------------------

    def initial_ready(self) -> Ready:
        """The state machine to start from (the recovered snapshot, ``restore=True``) and the
        recovered committed entries to re-apply. Persists nothing new."""
        self._out_restore = self._snapshot is not None
        ready = self._ready()
        # The snapshot is already on disk: hand it over for restoring only.
        return attrs.evolve(ready, snapshot=self._snapshot)

    def step(self, inp: Input) -> Ready:
        """Advance by one input; see :class:`Ready` for what the caller must then do.
        Raises :class:`NotLeader` / :class:`ProposalRefused` for proposals that cannot be
        taken (nothing changes then)."""
        if isinstance(inp, Tick):
            self._tick()
        elif isinstance(inp, Receive):
            self._receive(inp.message)
        elif isinstance(inp, Propose):
            self._propose(inp)
        elif isinstance(inp, ProposeConfChange):
            self._propose_conf(inp.change)
        elif isinstance(inp, TransferLeadership):
            self._transfer(inp.target)
        elif isinstance(inp, Compact):
            self._compact(inp)
        else:  # pragma: no cover - exhaustive
            raise TypeError(f"unknown input {inp!r}")
        return self._ready()

    # --- Ready assembly --------------------------------------------------------------------

    def _ready(self) -> Ready:
        hs = HardState(self.term, self.vote, self.commit)
        changed_hs = hs if hs != self._persisted_hs else None
        self._persisted_hs = hs
        limit = self._rule_apply_limit()
        committed: tuple[Entry, ...] = ()
        if limit > self.applied:
            committed = self.log.slice(self.applied + 1, limit)
            self.applied = limit
        ready = Ready(
            hard_state=changed_hs,
            snapshot=self._out_snapshot,
            restore=self._out_restore,
            entries=tuple(self._out_entries),
            messages=tuple(self._out_messages),
            committed=committed,
            proposed=self._proposed,
        )
        self._out_messages = []
        self._out_entries = []
        self._out_snapshot = None
        self._out_restore = False
        self._proposed = None
        return ready

    def _send(self, dst: NodeId, payload: Payload) -> None:
        self._out_messages.append(Message(self.node_id, dst, payload))

    def _append_local(self, entries: list[Entry]) -> None:
        self.log.extend(entries)
        self._out_entries.extend(entries)

    def _note_truncation(self, index: int) -> None:
        self._out_entries = [e for e in self._out_entries if e.index < index]

    # --- timing ----------------------------------------------------------------------------

    def _random_timeout(self) -> int:
        e = self.config.election_ticks
        return self._rng.randrange(e, 2 * e)

    def _tick(self) -> None:
        if self.role is Role.LEADER:
            self._tick_leader()
            return
        self._election_elapsed += 1
        if self._election_elapsed >= self._timeout and self._promotable():
            self._campaign(transfer=False)

    def _tick_leader(self) -> None:
        self._heartbeat_elapsed += 1
        self._election_elapsed += 1
        if self._transfer_target is not None:
            self._transfer_elapsed += 1
            if self._transfer_elapsed >= self.config.election_ticks:
                self._transfer_target = None  # took longer than an election timeout: abort
        if self._election_elapsed >= self.config.election_ticks:
            self._election_elapsed = 0
            if self.config.check_quorum and not self._quorum_active():
                self._become_follower(self.term, None)
                return
        if self._heartbeat_elapsed >= self.config.heartbeat_ticks:
            self._heartbeat_elapsed = 0
            for peer, pr in self._progress.items():
                pr.on_heartbeat()
                self._send_append(peer, heartbeat=True)

    def _quorum_active(self) -> bool:
        voters = self.conf.voters
        active = sum(
            1
            for v in voters
            if v == self.node_id or (v in self._progress and self._progress[v].recent_active)
        )
        for pr in self._progress.values():
            pr.recent_active = False
        return active * 2 > len(voters)

    def _promotable(self) -> bool:
        return self.node_id in self.conf.voters

    # --- role changes ----------------------------------------------------------------------

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
        self._transfer_target = None

    def _become_follower(self, term: int, leader: NodeId | None) -> None:
        self._reset(term)
        self.role = Role.FOLLOWER
        self.leader = leader

    def _campaign(self, transfer: bool) -> None:
        """Start an election: first a PreVote round (unless disabled or asked for by a
        leader transferring leadership), which changes no term and so cannot disrupt a
        cluster that still has a leader."""
        self.elections_started += 1
        if self.config.pre_vote and not transfer:
            self._reset(self.term)
            self.role = Role.PRE_CANDIDATE
            self._votes[self.node_id] = True
            if self._won():
                self._real_campaign(transfer)
                return
            request = VoteRequest(
                self.term + 1, self.log.last_index, self.log.last_term, pre_vote=True
            )
            self._send_to_voters(request)
        else:
            self._real_campaign(transfer)

    def _real_campaign(self, transfer: bool) -> None:
        self._reset(self.term + 1)
        self.role = Role.CANDIDATE
        self.vote = self.node_id
        self._votes[self.node_id] = True
        if self._won():
            self._become_leader()
            return
        request = VoteRequest(self.term, self.log.last_index, self.log.last_term, transfer=transfer)
        self._send_to_voters(request)

    def _send_to_voters(self, payload: Payload) -> None:
        for v in self.conf.voters:
            if v != self.node_id:
                self._send(v, payload)

    def _won(self) -> bool:
        voters = self.conf.voters
        granted = sum(1 for v in voters if self._votes.get(v) is True)
        return granted * 2 > len(voters)

    def _lost(self) -> bool:
        voters = self.conf.voters
        refused = sum(1 for v in voters if self._votes.get(v) is False)
        return refused * 2 >= len(voters) and len(voters) > 0

    def _become_leader(self) -> None:
        self._reset(self.term)
        self.role = Role.LEADER
        self.leader = self.node_id
        last = self.log.last_index
        for peer in self.conf.members():
            if peer != self.node_id:
                self._progress[peer] = Progress(match=0, next=last + 1, recent_active=True)
        self._pending_conf_index = last
        self._append_local([Entry(last + 1, self.term, EntryKind.NOOP)])
        self._maybe_commit()
        self._broadcast()

    # --- receiving -------------------------------------------------------------------------

    def _receive(self, m: Message) -> None:
        p = m.payload
        if p.term > self.term:
            if not self._on_higher_term(m):
                return
        elif p.term < self.term:
            self._on_lower_term(m)
            return
        if isinstance(p, VoteRequest):
            self._on_vote_request(m.src, p)
        elif isinstance(p, VoteReply):
            self._on_vote_reply(m.src, p)
        elif isinstance(p, AppendRequest):
            self._on_append(m.src, p)
        elif isinstance(p, AppendReply):
            self._on_append_reply(m.src, p)
        elif isinstance(p, SnapshotChunk):
            self._on_snapshot_chunk(m.src, p)
        elif isinstance(p, SnapshotReply):
            self._on_snapshot_reply(m.src, p)
        elif isinstance(p, TimeoutNow):
            self._on_timeout_now()

    def _in_lease(self) -> bool:
        """Leader stickiness: we heard from a live leader less than an election timeout ago,
        so a vote request from a higher term is ignored (it comes from a node that is
        partitioned, removed, or simply impatient)."""
        return (
            self.config.check_quorum
            and self.leader is not None
            and self._election_elapsed < self.config.election_ticks
        )

    def _on_higher_term(self, m: Message) -> bool:
        """Returns whether to go on handling ``m`` (at the term we are now in)."""
        p = m.payload
        if isinstance(p, VoteRequest):
            if not p.transfer and self._in_lease():
                return False
            if p.pre_vote:
                return True  # answered at its term without changing ours
            self._become_follower(p.term, None)
            return True
        if (
            isinstance(p, VoteReply)
            and p.pre_vote
            and p.granted
            and self.role is Role.PRE_CANDIDATE
            and p.term == self.term + 1
        ):
            return True  # a grant for the term we asked about, which nobody is in yet
        if isinstance(p, (AppendRequest, SnapshotChunk, TimeoutNow)):
            self._become_follower(p.term, m.src)
        else:
            self._become_follower(p.term, None)
        return True

    def _on_lower_term(self, m: Message) -> None:
        p = m.payload
        if isinstance(p, (AppendRequest, SnapshotChunk)):
            # A stale leader: tell it our term so it steps down (needed with CheckQuorum and
            # PreVote, where it may otherwise never hear a higher term).
            self._send(m.src, AppendReply(self.term, False, 0))
        elif isinstance(p, VoteRequest) and p.pre_vote:
            self._send(m.src, VoteReply(self.term, False, pre_vote=True))
        elif isinstance(p, VoteReply):
            self._on_vote_reply(m.src, p)

    # votes

    def _on_vote_request(self, src: NodeId, p: VoteRequest) -> None:
        up_to_date = self.log.is_up_to_date(p.last_index, p.last_term)
        if p.pre_vote:
            can = p.term > self.term or (self.vote in (None, src) and self.leader is None)
            if can and up_to_date:
                self._send(src, VoteReply(p.term, True, pre_vote=True))
            else:  # with our own term, so a pre-candidate behind us learns it
                self._send(src, VoteReply(self.term, False, pre_vote=True))
            return
        can = self.vote == src or (self.vote is None and self.leader is None)
        if can and up_to_date:
            self.vote = src
            self._election_elapsed = 0
            self._send(src, VoteReply(self.term, True))
        else:
            self._send(src, VoteReply(self.term, False))

    def _rule_vote_reply_counts(self, p: VoteReply) -> bool:
        """Only a reply for the election under way counts (its term, its kind)."""
        if p.pre_vote:
            return self.role is Role.PRE_CANDIDATE and p.term == self.term + 1
        return self.role is Role.CANDIDATE and p.term == self.term

    def _on_vote_reply(self, src: NodeId, p: VoteReply) -> None:
        if self.role not in (Role.PRE_CANDIDATE, Role.CANDIDATE):
            return
        if not self._rule_vote_reply_counts(p):
            return
        self._votes.setdefault(src, p.granted)
        if self._won():
            if self.role is Role.PRE_CANDIDATE:
                self._real_campaign(transfer=False)
            else:
                self._become_leader()
        elif self._lost():
            self._become_follower(self.term, None)

    def _on_timeout_now(self) -> None:
        if self._promotable():
            self._campaign(transfer=True)

    # replication: follower side

    def _heard_from_leader(self, src: NodeId) -> None:
        if self.role is not Role.FOLLOWER or self.leader != src:
            self._become_follower(self.term, src)
        self._election_elapsed = 0

    def _on_append(self, src: NodeId, p: AppendRequest) -> None:
        self._heard_from_leader(src)
        if self._snapshot is None:  # never initialised: it starts from a snapshot
            self._send(src, AppendReply(self.term, False, p.prev_index, needs_snapshot=True))
            return
        if p.prev_index < self.commit:
            self._send(src, AppendReply(self.term, True, self.commit))
            return
        if self.log.term_at(p.prev_index) != p.prev_term:
            hint = min(p.prev_index, self.log.last_index)
            hint_index, hint_term = self.log.find_conflict_by_term(hint, p.prev_term)
            self._send(src, AppendReply(self.term, False, p.prev_index, hint_index, hint_term))
            return
        conflict, added = self.log.merge(p.entries, self.commit)
        if conflict:
            self._note_truncation(conflict)
        self._out_entries.extend(added)
        last_new = p.prev_index + len(p.entries)
        self.commit = max(self.commit, min(p.commit, last_new))
        self._send(src, AppendReply(self.term, True, last_new))

    def _on_snapshot_chunk(self, src: NodeId, p: SnapshotChunk) -> None:
        self._heard_from_leader(src)
        meta = p.meta
        if meta.index <= self.commit and self._snapshot is not None:
            self._incoming = None
            self._send(src, SnapshotReply(self.term, meta.index, p.offset + len(p.data), True))
            return
        if p.offset == 0 or self._incoming is None or self._incoming[0] != meta:
            self._incoming = (meta, bytearray())
        buf = self._incoming[1]
        if p.offset != len(buf):
            self._send(src, SnapshotReply(self.term, meta.index, len(buf), False))
            return
        buf += p.data
        if not p.done:
            self._send(src, SnapshotReply(self.term, meta.index, len(buf), False))
            return
        self._incoming = None
        self._install(Snapshot(meta, bytes(buf)))
        self._send(src, SnapshotReply(self.term, meta.index, len(buf), True))

    def _install(self, snap: Snapshot) -> None:
        self.log.restore(snap.meta)
        self._snapshot = snap
        self.commit = snap.meta.index
        self.applied = snap.meta.index
        self._out_snapshot = snap
        self._out_restore = True
        # Storage drops its whole log when it installs a leader's snapshot; re-persist what
        # we kept after it.
        self._out_entries = list(self.log.slice(snap.meta.index + 1, self.log.last_index))

    # replication: leader side

    def _broadcast(self) -> None:
        for peer in self._progress:
            self._send_append(peer)

    def _send_append(self, peer: NodeId, heartbeat: bool = False) -> None:
        pr = self._progress.get(peer)
        if pr is None:  # no longer leader, or the peer was removed
            return
        if pr.state is Replication.SNAPSHOT:
            self._send_snapshot_chunk(peer, pr)
            return
        if pr.state is Replication.PROBE and pr.probe_sent:
            return
        if pr.state is Replication.REPLICATE and len(pr.inflight) >= self.config.max_inflight:
            if heartbeat and self.log.term_at(pr.match) is not None:
                # keep the follower's lease and commit index fresh without touching its log
                self._send_entries(peer, pr.match, ())
            return
        prev = pr.next - 1
        if self.log.term_at(prev) is None:
            assert self._snapshot is not None, "log compacted without a snapshot"
            pr.become_snapshot(self._snapshot)
            self._send_snapshot_chunk(peer, pr)
            return
        last = min(self.log.last_index, prev + self.config.max_append_entries)
        entries = self.log.slice(prev + 1, last)
        if not entries and not heartbeat and pr.state is Replication.REPLICATE:
            return
        self._send_entries(peer, prev, entries)
        if pr.state is Replication.PROBE:
            pr.probe_sent = True
        elif entries:
            pr.inflight.append(entries[-1].index)
            pr.next = entries[-1].index + 1

    def _send_entries(self, peer: NodeId, prev: int, entries: tuple[Entry, ...]) -> None:
        prev_term = self.log.term_at(prev)
        assert prev_term is not None
        # The follower commits only up to what it verified matches: sending ours is safe.
        self._send(peer, AppendRequest(self.term, prev, prev_term, entries, self.commit))

    def _send_snapshot_chunk(self, peer: NodeId, pr: Progress) -> None:
        if pr.snapshot_waiting:
            return
        snap = pr.snapshot
        assert snap is not None
        start = pr.snapshot_offset
        chunk = snap.data[start : start + self.config.snapshot_chunk_bytes]
        done = start + len(chunk) >= len(snap.data)
        self._send(peer, SnapshotChunk(self.term, snap.meta, start, chunk, done))
        pr.snapshot_waiting = True

    def _on_append_reply(self, src: NodeId, p: AppendReply) -> None:
        pr = self._progress.get(src)
        if self.role is not Role.LEADER or pr is None:
            return
        pr.recent_active = True
        if p.success:
            if pr.acknowledge(p.index):
                if pr.state is Replication.PROBE:
                    pr.become_replicate()
                self._maybe_commit()
                if src == self._transfer_target and pr.match == self.log.last_index:
                    self._send(src, TimeoutNow(self.term))
            elif pr.state is Replication.PROBE:
                pr.become_replicate()
            self._send_append(src)
            return
        if p.needs_snapshot:
            if pr.state is not Replication.SNAPSHOT and self._snapshot is not None:
                pr.become_snapshot(self._snapshot)
                self._send_snapshot_chunk(src, pr)
            return
        if p.index <= pr.match or pr.state is Replication.SNAPSHOT:
            return  # stale rejection
        if pr.state is Replication.PROBE and p.index != pr.next - 1:
            return  # stale rejection of an earlier probe
        probe, _ = self.log.find_conflict_by_term(p.hint_index, p.hint_term)
        pr.become_probe()
        pr.next = max(min(p.index, probe + 1), pr.match + 1)
        self._send_append(src)

    def _on_snapshot_reply(self, src: NodeId, p: SnapshotReply) -> None:
        pr = self._progress.get(src)
        if self.role is not Role.LEADER or pr is None:
            return
        pr.recent_active = True
        if pr.state is not Replication.SNAPSHOT or pr.snapshot is None:
            if p.done and pr.acknowledge(p.index):
                self._maybe_commit()
            return
        if p.index != pr.snapshot.meta.index:
            return
        if p.done:
            pr.acknowledge(p.index)
            pr.become_probe()
            self._maybe_commit()
            self._send_append(src)
            return
        pr.snapshot_offset = p.offset
        pr.snapshot_waiting = False
        self._send_snapshot_chunk(src, pr)

    # --- commitment ------------------------------------------------------------------------

    def _rule_can_commit(self, index: int) -> bool:
        """Raft §5.4.2: a leader commits by counting replicas only entries of its own term."""
        return self.log.term_at(index) == self.term

    def _rule_apply_limit(self) -> int:
        """Entries are applied only once committed."""
        return self.commit

    def _maybe_commit(self) -> None:
        voters = self.conf.voters
        if not voters:
            return
        matches = sorted(
            (self.log.last_index if v == self.node_id else self._match_of(v) for v in voters),
            reverse=True,
        )
        candidate = matches[len(voters) // 2]
        if candidate > self.commit and self._rule_can_commit(candidate):
            self.commit = candidate
            self._on_commit_advanced()

    def _match_of(self, peer: NodeId) -> int:
        pr = self._progress.get(peer)
        return pr.match if pr else 0

    def _on_commit_advanced(self) -> None:
        if self.node_id not in self.conf.members() and self.log.last_conf_index() <= self.commit:
            # Our removal is committed: hand the cluster over by stepping down (§4.2.2).
            self._become_follower(self.term, None)
            return
        self._broadcast()

    # --- proposals -------------------------------------------------------------------------

    def _check_leader(self) -> None:
        if self.role is not Role.LEADER:
            raise NotLeader(self.leader)
        if self._transfer_target is not None:
            raise ProposalRefused("transfer_in_progress", f"to {self._transfer_target}")

    def _append_new(self, entry: Entry) -> None:
        self._append_local([entry])
        self._proposed = LogPosition(entry.index, entry.term)
        self._maybe_commit()
        self._broadcast()

    def _propose(self, p: Propose) -> None:
        self._check_leader()
        index = self.log.last_index + 1
        self._append_new(Entry(index, self.term, EntryKind.COMMAND, p.data, p.client_id, p.seq))

    def _propose_conf(self, change: ConfChange) -> None:
        self._check_leader()
        if self._pending_conf_index > self.commit:
            raise ProposalRefused("conf_change_pending", "wait for the last change to commit")
        conf = self.conf
        node = change.node
        if change.op == "add_learner" and node in conf.members():
            raise ProposalRefused("invalid_conf_change", f"{node} is already a member")
        if change.op == "promote":
            if node not in conf.learners:
                raise ProposalRefused("invalid_conf_change", f"{node} is not a learner")
            if self._match_of(node) + self.config.learner_catchup_entries < self.log.last_index:
                raise ProposalRefused("learner_not_caught_up", node)
        if change.op == "remove":
            if node not in conf.members():
                raise ProposalRefused("invalid_conf_change", f"{node} is not a member")
            if conf.voters == (node,):
                raise ProposalRefused("invalid_conf_change", "cannot remove the last voter")
        index = self.log.last_index + 1
        self._append_new(Entry(index, self.term, EntryKind.CONF, conf=change))
        self._pending_conf_index = self.log.last_index
        self._sync_progress()

    def _sync_progress(self) -> None:
        """Follow the membership: track new members, forget removed ones."""
        members = set(self.conf.members())
        for peer in list(self._progress):
            if peer not in members:
                del self._progress[peer]
        for peer in sorted(members):
            if peer != self.node_id and peer not in self._progress:
                self._progress[peer] = Progress(next=self.log.last_index, recent_active=True)
                self._send_append(peer)

    def _transfer(self, target: NodeId) -> None:
        self._check_leader()
        if target == self.node_id or target not in self.conf.voters:
            raise ProposalRefused("invalid_transfer", f"{target} is not another voter")
        self._transfer_target = target
        self._transfer_elapsed = 0
        if self._match_of(target) == self.log.last_index:
            self._send(target, TimeoutNow(self.term))
        else:
            self._send_append(target)

    # --- compaction ------------------------------------------------------------------------

    def _compact(self, c: Compact) -> None:
        if c.index <= self.log.snapshot_index:
            return
        if c.index > self.applied:
            raise ValueError(f"cannot compact through {c.index}: applied only {self.applied}")
        term = self.log.term_at(c.index)
        assert term is not None
        meta = SnapshotMeta(c.index, term, self.log.conf_at(c.index))
        snap = Snapshot(meta, c.data)
        self.log.compact(meta)
        self._snapshot = snap
        self._out_snapshot = snap
