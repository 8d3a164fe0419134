"""Safety invariants, checked incrementally after every step of every node.

:class:`Checker` is told (through the :class:`~skulk.sim._node.NodeObserver` calls the world
forwards) what each node persisted, recovered, applied and became, and keeps:

* per node, a *mirror* of its durable log as a hash chain (``chain[i] = H(chain[i-1], entry
  i)``), its last persisted hard state and its in-memory term/commit/applied;
* globally, the chain hash of every ``(index, term)`` ever appended anywhere, the leader of
  every term, the committed prefix as first observed, the entry and state-machine hash at every
  applied index (the *oracle*).

From these it checks, raising :class:`ViolationFound` with a :class:`Violation` on the first
failure:

============================  =================================================================
``election_safety``           at most one leader per term, ever
``double_vote``               a persisted vote never changes within a term
``leader_append_only``        a leader never truncates or overwrites its log during its term
``log_matching``              same index and term => same entry and same prefix (hash chain)
``leader_completeness``       a new leader of term T holds every entry seen committed in a
                              term below T (or has it in its snapshot)
``state_machine_safety``      one entry and one state hash per applied index; one entry per
                              committed index
``monotonic_term`` / ``_commit`` / ``_applied``
                              never decrease, within a life and across restarts
``durability``                after a crash between writes, storage recovers exactly what
                              was persisted
``unpersisted_state``         after a step the core's term/vote/log equal what is on disk
``apply_beyond_commit``       only committed entries are applied, in order (``apply_gap``)
``restore_mismatch``          a snapshot's image is the state at the snapshot's index
``prevote_discipline``        a real candidacy follows pre-vote grants from a quorum (or a
                              TimeoutNow)
``replay_mismatch`` / ``ack_lost`` / ``applied_twice`` / ``ack_result``
                              at the end: replaying the oracle log from scratch gives every
                              recorded state hash, and every acknowledged command is in it,
                              effective exactly once, and answered its client what its
                              effective application answered
============================  =================================================================

The state compared at each applied index is the whole :class:`~skulk.sim._statemachine.SmState`:
the real cluster State (so equal applied index => equal :func:`skulk.cluster.state_hash` on every
replica; values are compared, which is the same thing for a canonical encoding, and both hashes
are reported on a mismatch), the sessions with their cached results, and the digest chain; the
result bytes of each index are compared too. After every applied entry on every replica, the
cluster oracles of :mod:`skulk.sim._clusterchecks` also run on the State before and after it
(``rejected_changed_state``, ``placement_discipline``, ``placed_on_unavailable_node``,
``runner_records``, ``state_shape``); an entry that did not take effect (a no-op, a membership
change, a retry) must leave the cluster State as it was (``noop_changed_state``), and a result
must decode (``bad_result``).

Everything is keyed by ints and node ids; nothing depends on hash-ordered iteration.

:class:`Checker` is one object in three files: its records and the per-node tracks
(:mod:`._checkstate`), the state-machine and end-of-run checks (:mod:`._applychecks`) and, here,
the Raft checks on deliveries, storage and each step.
"""

from __future__ import annotations

from collections.abc import Iterable

from skulk.consensus import (
    Entry,
    Input,
    Message,
    Ready,
    Receive,
    Recovered,
    Role,
    TimeoutNow,
    VoteReply,
)
from skulk.sim._applychecks import ApplyChecks
from skulk.sim._checkstate import NodeTrack, Violation, ViolationFound, chain_hash

__all__ = ["Checker", "Violation", "ViolationFound"]


class Checker(ApplyChecks):
    """The invariant checker. ``clock`` returns the current tick (for violation reports);
    ``require_pre_vote`` enables ``prevote_discipline`` (set from the simulation's intended
    configuration, not the possibly-mutated core's); ``machine`` replays the log at the end
    (the nodes' own, so that only impurity, not a mutant's semantics, makes a replay differ)."""

    # --- deliveries ---------------------------------------------------------------------

    def on_deliver(self, message: Message) -> None:
        """Before ``message`` is handed to its destination's core."""
        p = message.payload
        if isinstance(p, VoteReply) and p.pre_vote and p.granted:
            tr = self.track(message.dst)
            tr.prevote_grants.setdefault(p.term, set()).add(message.src)

    # --- storage ------------------------------------------------------------------------

    def on_recovered(self, node: str, rec: Recovered, clean: bool) -> None:
        tr = self.track(node)
        hs = rec.hard_state
        if tr.started:
            old = tr.hs
            if hs.term < old.term:
                self.fail("monotonic_term", node, f"restarted at term {hs.term} < {old.term}")
            if hs.commit < old.commit:
                self.fail(
                    "monotonic_commit", node, f"restarted at commit {hs.commit} < {old.commit}"
                )
            if hs.term == old.term and old.vote is not None and hs.vote != old.vote:
                self.fail(
                    "durability", node, f"vote for {old.vote} in term {old.term} lost ({hs.vote})"
                )
            if clean:
                self._check_recovered_exactly(node, tr, rec)
        tr.started = True
        tr.hs = hs
        tr.log = {}
        if rec.snapshot is not None:
            meta = rec.snapshot.meta
            tr.snap_index, tr.snap_term = meta.index, meta.term
            tr.snap_chain = self._snapshot_chain(node, meta.index, meta.term)
        else:
            tr.snap_index, tr.snap_term, tr.snap_chain = 0, 0, None
        tr.last = tr.snap_index
        self._append(node, tr, rec.entries, leader=False)
        tr.life_term = hs.term
        tr.life_commit = max(hs.commit, tr.snap_index)
        tr.applied = 0
        tr.leader_term = 0
        tr.role = None
        tr.prevote_grants = {}

    def _check_recovered_exactly(self, node: str, tr: NodeTrack, rec: Recovered) -> None:
        snap = (rec.snapshot.meta.index, rec.snapshot.meta.term) if rec.snapshot else None
        mine = (tr.snap_index, tr.snap_term) if tr.snap_chain is not None else None
        got = [(e.index, e.term) for e in rec.entries]
        want = [(i, tr.log[i][0]) for i in range(tr.snap_index + 1, tr.last + 1)]
        if rec.hard_state != tr.hs or snap != mine or got != want:
            self.fail(
                "durability",
                node,
                f"recovered hs={rec.hard_state} snapshot={snap} log={_span(got)}; persisted "
                f"hs={tr.hs} snapshot={mine} log={_span(want)}",
            )

    def _snapshot_chain(self, node: str, index: int, term: int) -> bytes:
        chain = self.chains.get((index, term))
        if chain is None:
            self.fail("log_matching", node, f"snapshot at {index}@{term}: no such entry anywhere")
        assert chain is not None
        return chain

    def on_persisted(self, node: str, ready: Ready, role: Role, term: int) -> None:
        """``ready`` is durable; ``role``/``term`` are the core's after the step."""
        tr = self.track(node)
        still_leader = role is Role.LEADER and tr.leader_term == term
        snap = ready.snapshot
        if snap is not None:
            meta = snap.meta
            if ready.restore and still_leader:
                self.fail("leader_append_only", node, f"leader installed snapshot {meta.index}")
            chain = self._snapshot_chain(node, meta.index, meta.term)
            if ready.restore:
                tr.log = {}
                tr.last = meta.index
            else:
                have = tr.term_at(meta.index)
                if have is not None and have != meta.term:
                    self.fail(
                        "log_matching", node, f"compacted {meta.index}@{meta.term} over @{have}"
                    )
                for i in range(tr.snap_index + 1, min(meta.index, tr.last) + 1):
                    tr.log.pop(i, None)
                tr.last = max(tr.last, meta.index)
            tr.snap_index, tr.snap_term, tr.snap_chain = meta.index, meta.term, chain
        if ready.entries:
            self._append(node, tr, ready.entries, leader=still_leader)
        hs = ready.hard_state
        if hs is not None:
            old = tr.hs
            if hs.term < old.term:
                self.fail("monotonic_term", node, f"persisted term {hs.term} < {old.term}")
            if hs.term == old.term and old.vote is not None and hs.vote != old.vote:
                self.fail("double_vote", node, f"term {hs.term}: voted {old.vote}, now {hs.vote}")
            if hs.commit < old.commit:
                self.fail("monotonic_commit", node, f"persisted commit {hs.commit} < {old.commit}")
            tr.hs = hs

    def _append(self, node: str, tr: NodeTrack, entries: Iterable[Entry], leader: bool) -> None:
        for e in entries:
            i = e.index
            if i <= tr.snap_index:
                self.fail("log_matching", node, f"entry {i} at or below snapshot {tr.snap_index}")
            if i <= tr.last:
                if leader:
                    self.fail(
                        "leader_append_only", node, f"leader rewrote {i}..{tr.last} of its log"
                    )
                tr.truncations += 1
                for k in range(i, tr.last + 1):
                    tr.log.pop(k, None)
                tr.last = i - 1
            if i != tr.last + 1:
                self.fail("log_matching", node, f"entry {i} does not follow {tr.last}")
            prev = tr.chain_at(i - 1)
            if prev is None:
                self.fail("log_matching", node, f"entry {i} follows an unknown prefix")
            assert prev is not None
            chain = chain_hash(prev, e)
            known = self.chains.setdefault((i, e.term), chain)
            if known != chain:
                self.fail("log_matching", node, f"entry {i}@{e.term} differs from another node's")
            tr.log[i] = (e.term, chain)
            tr.last = i

    # --- after each step ------------------------------------------------------------------

    def on_stepped(
        self,
        node: str,
        inp: Input | None,
        *,
        role: Role,
        term: int,
        vote: str | None,
        commit: int,
        first_index: int,
        last_index: int,
        last_term: int | None,
        voters: tuple[str, ...],
    ) -> None:
        """After a fully handled step (``inp`` None: start-up); the keywords are the core's."""
        tr = self.track(node)
        if term < tr.life_term:
            self.fail("monotonic_term", node, f"term {term} < {tr.life_term}")
        if commit < tr.life_commit:
            self.fail("monotonic_commit", node, f"commit {commit} < {tr.life_commit}")
        if term != tr.hs.term or vote != tr.hs.vote:
            self.fail(
                "unpersisted_state",
                node,
                f"core at term {term} vote {vote}, disk at term {tr.hs.term} vote {tr.hs.vote}",
            )
        if last_index != tr.last or first_index != tr.snap_index + 1:
            self.fail(
                "unpersisted_state",
                node,
                f"core log {first_index}..{last_index}, disk {tr.snap_index + 1}..{tr.last}",
            )
        if last_term != tr.term_at(last_index):
            self.fail("unpersisted_state", node, f"core last term {last_term} differs from disk")
        if inp is None and tr.applied < tr.max_applied:
            self.fail(
                "monotonic_applied",
                node,
                f"restarted applying up to {tr.applied}, had applied {tr.max_applied}",
            )
        if commit > tr.life_commit:
            self._observe_commit(node, tr, tr.life_commit, commit, term)
        tr.life_term, tr.life_commit = term, commit
        if (
            role is Role.CANDIDATE
            and (tr.role is not Role.CANDIDATE or tr.life_term != term)
            and self.require_pre_vote
            and not (isinstance(inp, Receive) and isinstance(inp.message.payload, TimeoutNow))
        ):
            self._check_prevote(node, tr, term, voters)
        if role is Role.LEADER:
            holder = self.leaders.setdefault(term, node)
            if holder != node:
                self.fail("election_safety", node, f"{holder} and {node} both lead term {term}")
            if tr.leader_term != term:
                self._check_completeness(node, tr, term)
                tr.leader_term = term
        else:
            tr.leader_term = 0
        tr.role = role
        if tr.prevote_grants and min(tr.prevote_grants) <= term:
            tr.prevote_grants = {t: g for t, g in tr.prevote_grants.items() if t > term}

    def _observe_commit(self, node: str, tr: NodeTrack, old: int, new: int, term: int) -> None:
        for i in range(max(old + 1, tr.snap_index), new + 1):
            chain = tr.chain_at(i)
            if chain is None:
                continue
            known = self.committed.setdefault(i, chain)
            if known != chain:
                self.fail("state_machine_safety", node, f"committed a different entry at index {i}")
        if new > self.commit_by_term.get(term, 0):
            self.commit_by_term[term] = new

    def _check_prevote(self, node: str, tr: NodeTrack, term: int, voters: tuple[str, ...]) -> None:
        grants = set(tr.prevote_grants.get(term, ()))
        grants.add(node)
        count = sum(1 for v in voters if v in grants)
        if count * 2 <= len(voters):
            self.fail(
                "prevote_discipline",
                node,
                f"became candidate for term {term} with pre-votes from {sorted(grants)} of "
                f"voters {list(voters)}",
            )

    def _check_completeness(self, node: str, tr: NodeTrack, term: int) -> None:
        upto = max((i for t, i in self.commit_by_term.items() if t < term), default=0)
        if upto == 0:
            return
        want = self.committed.get(upto)
        if upto < tr.snap_index:
            return  # covered by the snapshot (built from this node's own committed state)
        if upto > tr.last:
            self.fail(
                "leader_completeness",
                node,
                f"leader of term {term} has log up to {tr.last}; {upto} was committed",
            )
        if want is not None and tr.chain_at(upto) != want:
            self.fail(
                "leader_completeness",
                node,
                f"leader of term {term} has a different entry at committed index {upto}",
            )


def _span(pairs: list[tuple[int, int]]) -> str:
    if not pairs:
        return "[]"
    return f"[{pairs[0][0]}@{pairs[0][1]}..{pairs[-1][0]}@{pairs[-1][1]}] ({len(pairs)})"
