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

import attrs

from ._corestate import RaftConfig as RaftConfig
from ._corestate import RaftStatistics as RaftStatistics
from ._corestate import Role as Role
from ._election import Election
from ._errors import NotLeader as NotLeader
from ._errors import ProposalRefused as ProposalRefused
from ._progress import Progress
from ._replication import Replicator
from ._types import (
    AppendReply,
    AppendRequest,
    Compact,
    ConfChange,
    Entry,
    EntryKind,
    HardState,
    Input,
    LogPosition,
    Message,
    NodeId,
    Propose,
    ProposeConfChange,
    Ready,
    Receive,
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


class RaftCore(Election, Replicator):
    """One Raft node's protocol state. Build it from what storage recovered, take
    :meth:`initial_ready` once, then feed it inputs with :meth:`step`."""

    # --- introspection ---------------------------------------------------------------------

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

    def _append_local(self, entries: list[Entry]) -> None:
        self.log.extend(entries)
        self._out_entries.extend(entries)

    # --- timing ----------------------------------------------------------------------------

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
        """CheckQuorum: did a majority of voters answer during the period now ending?"""
        self._last_active = self._active_now()
        for pr in self._progress.values():
            pr.recent_active = False
        voters = self.conf.voters
        return sum(1 for v in voters if v in self._last_active) * 2 > len(voters)

    def _active_now(self) -> set[NodeId]:
        heard = {peer for peer, pr in self._progress.items() if pr.recent_active}
        return heard | {self.node_id}

    # --- role changes ----------------------------------------------------------------------

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

    def _rule_apply_limit(self) -> int:
        """Entries are applied only once committed."""
        return self.commit

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
        # The new voters must have a live majority, or the change could never commit (it takes
        # effect when appended) and the cluster would stall (etcd's StrictReconfigCheck).
        voters = conf.apply(change).voters
        active = self._last_active | self._active_now()
        if voters and sum(1 for v in voters if v in active) * 2 <= len(voters):
            raise ProposalRefused("would_lose_quorum", f"too few of {voters} answer the leader")
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
