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
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable

import attrs

from skulk.cluster import COMMAND_CODEC, decode_result
from skulk.cluster import state_hash as cluster_state_hash
from skulk.consensus import (
    Entry,
    HardState,
    Input,
    Message,
    Ready,
    Receive,
    Recovered,
    Role,
    Snapshot,
    TimeoutNow,
    VoteReply,
)
from skulk.sim._clusterchecks import outcome_key, result_text, transition_problem
from skulk.sim._statemachine import (
    INITIAL,
    MACHINE,
    Machine,
    SmState,
    decode_state,
    replay,
    state_hash,
)
from skulk.wire import WireError
from skulk.wire.cluster import ClusterCommand, ClusterResult

Ack = tuple[str, int, int, int, bytes]
"""An acknowledged command: ``(client_id, seq, index, term, result)``."""

GENESIS = b"\x00" * 32


@attrs.frozen
class Violation:
    """A broken invariant: its ``name``, when (tick), where (node, or ``""``) and details."""

    name: str
    time: int
    node: str
    details: str

    def __str__(self) -> str:
        where = f" on {self.node}" if self.node else ""
        return f"{self.name} at t={self.time}{where}: {self.details}"


class ViolationFound(Exception):
    def __init__(self, violation: Violation) -> None:
        super().__init__(str(violation))
        self.violation = violation


def chain_hash(prev: bytes, entry: Entry) -> bytes:
    """The hash chain link for ``entry`` after a prefix whose chain hash is ``prev``."""
    conf = f"{entry.conf.op}:{entry.conf.node}" if entry.conf is not None else ""
    head = f"{entry.index}|{entry.term}|{entry.kind.value}|{entry.client_id}|{entry.seq}|{conf}|"
    return hashlib.sha256(prev + head.encode() + entry.data).digest()


@attrs.define
class NodeTrack:
    """What the checker knows about one node."""

    snap_index: int = 0
    snap_term: int = 0
    snap_chain: bytes | None = None
    log: dict[int, tuple[int, bytes]] = attrs.Factory(dict)
    last: int = 0
    hs: HardState = attrs.Factory(HardState)
    started: bool = False
    life_term: int = 0
    life_commit: int = 0
    applied: int = 0
    max_applied: int = 0
    """Highest index applied in any life (applied must get back there after a restart)."""
    leader_term: int = 0
    role: Role | None = None
    prevote_grants: dict[int, set[str]] = attrs.Factory(dict)
    truncations: int = 0
    restores: int = 0

    def chain_at(self, index: int) -> bytes | None:
        if index == self.snap_index:
            return self.snap_chain
        got = self.log.get(index)
        return got[1] if got is not None else None

    def term_at(self, index: int) -> int | None:
        if index == self.snap_index:
            return self.snap_term
        got = self.log.get(index)
        return got[0] if got is not None else None


class Checker:
    """The invariant checker. ``clock`` returns the current tick (for violation reports);
    ``require_pre_vote`` enables ``prevote_discipline`` (set from the simulation's intended
    configuration, not the possibly-mutated core's); ``machine`` replays the log at the end
    (the nodes' own, so that only impurity, not a mutant's semantics, makes a replay differ)."""

    def __init__(
        self,
        clock: Callable[[], int],
        *,
        require_pre_vote: bool = True,
        machine: Machine = MACHINE,
    ) -> None:
        self._clock = clock
        self.require_pre_vote = require_pre_vote
        self.machine = machine
        self.tracks: dict[str, NodeTrack] = {}
        self.chains: dict[tuple[int, int], bytes] = {(0, 0): GENESIS}
        self.leaders: dict[int, str] = {}
        self.commit_by_term: dict[int, int] = {}
        self.committed: dict[int, bytes] = {}
        self.applied_entries: dict[int, Entry] = {}
        self.applied_state: dict[int, SmState] = {0: INITIAL}
        self.applied_results: dict[int, bytes] = {}
        self._decoded: dict[int, tuple[ClusterCommand | None, ClusterResult | None]] = {}
        self.command_stats: dict[str, int] = {}
        """After :meth:`final_replay`: ``"Kind:applied"`` / ``"Kind:reason"`` -> how many
        effective commands of the log had that outcome."""

    # --- helpers ------------------------------------------------------------------------

    def fail(self, name: str, node: str, details: str) -> None:
        raise ViolationFound(Violation(name, self._clock(), node, details))

    def track(self, node: str) -> NodeTrack:
        tr = self.tracks.get(node)
        if tr is None:
            tr = self.tracks[node] = NodeTrack()
        return tr

    def max_committed(self) -> int:
        return max(self.commit_by_term.values(), default=0)

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

    # --- state machine --------------------------------------------------------------------

    def on_restored(self, node: str, snapshot: Snapshot, state: SmState) -> None:
        tr = self.track(node)
        meta = snapshot.meta
        state = decode_state(snapshot.data, machine=self.machine)
        if state.applied != meta.index:
            self.fail(
                "restore_mismatch", node, f"snapshot {meta.index} holds state at {state.applied}"
            )
        if meta.index < tr.applied:
            self.fail("monotonic_applied", node, f"restored {meta.index} after {tr.applied}")
        self._record_state(node, meta.index, state)
        tr.applied = meta.index

    def on_applied(
        self,
        node: str,
        entry: Entry,
        commit: int,
        state: SmState,
        *,
        before: SmState,
        effective: bool,
        result: bytes,
    ) -> None:
        """``node`` applied ``entry`` (its commit index is ``commit``) to ``before`` and is now
        in ``state``; ``effective``: it reached the cluster machine, answering ``result``."""
        tr = self.track(node)
        i = entry.index
        if i != tr.applied + 1:
            self.fail("apply_gap", node, f"applied {i} after {tr.applied}")
        if i > commit:
            self.fail("apply_beyond_commit", node, f"applied {i} with commit {commit}")
        known = self.applied_entries.setdefault(i, entry)
        if known != entry:
            self.fail(
                "state_machine_safety", node, f"applied {entry} at {i}; another applied {known}"
            )
        self._record_state(node, i, state)
        known_result = self.applied_results.setdefault(i, result)
        if known_result != result:
            self.fail(
                "state_machine_safety",
                node,
                f"entry {i} answered {result_text(result)}; another node's answered "
                f"{result_text(known_result)}",
            )
        self._check_cluster(node, entry, before, state, effective, result)
        tr.applied = i
        tr.max_applied = max(tr.max_applied, i)

    def _check_cluster(
        self,
        node: str,
        entry: Entry,
        before: SmState,
        after: SmState,
        effective: bool,
        result: bytes,
    ) -> None:
        """The cluster State oracles (:mod:`skulk.sim._clusterchecks`) on one replica's step."""
        old, new = before.cluster, after.cluster
        if not effective:
            if new is not old and new != old:
                self.fail(
                    "noop_changed_state",
                    node,
                    f"entry {entry.index} ({entry.kind.value}, {entry.client_id}:{entry.seq}) "
                    "did not take effect yet changed the cluster State",
                )
            return
        decoded = self._decoded.get(entry.index)
        if decoded is None:
            decoded = self._decoded[entry.index] = self._decode(node, entry, result)
        problem = transition_problem(old, new, *decoded)
        if problem is not None:
            name, details = problem
            self.fail(name, node, f"at index {entry.index}: {details}")

    def _decode(
        self, node: str, entry: Entry, result: bytes
    ) -> tuple[ClusterCommand | None, ClusterResult | None]:
        try:
            answer = decode_result(result)
        except WireError as exc:
            self.fail("bad_result", node, f"entry {entry.index} answered {result!r:.60}: {exc}")
            raise  # unreachable: fail raises
        try:
            command: ClusterCommand | None = COMMAND_CODEC.decode(entry.data)
        except WireError:
            command = None
        return command, answer

    def _record_state(self, node: str, index: int, state: SmState) -> None:
        known = self.applied_state.setdefault(index, state)
        if known != state:  # cheaper than hashing every state; same meaning
            mine, theirs = cluster_state_hash(state.cluster), cluster_state_hash(known.cluster)
            self.fail(
                "state_machine_safety",
                node,
                f"state hash at applied index {index} is {state_hash(state).hex()[:12]}, "
                f"another node had {state_hash(known).hex()[:12]} (cluster state_hash "
                f"{mine[:12]} vs {theirs[:12]}"
                f"{'' if mine != theirs else '; sessions or digest differ'})",
            )

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

    # --- acknowledgements ---------------------------------------------------------------

    def check_acks(self, acks: Iterable[Ack]) -> None:
        """Every acknowledged command ``(client_id, seq, index, term, result)`` is the entry the
        oracle holds at ``index``, answered ``result`` there (run periodically on new
        acknowledgements, and at the end)."""
        for client, seq, index, term, result in acks:
            e = self.applied_entries.get(index)
            if e is None or (e.client_id, e.seq, e.term) != (client, seq, term):
                self.fail(
                    "ack_lost", "", f"acknowledged ({client}, {seq}) at {index}@{term}; log has {e}"
                )
            if self.applied_results.get(index, result) != result:
                self.fail(
                    "ack_result",
                    "",
                    f"({client}, {seq}) was told {result_text(result)}; entry {index} answered "
                    f"{result_text(self.applied_results[index])}",
                )

    # --- end of run -----------------------------------------------------------------------

    def final_replay(self, acks: Iterable[Ack]) -> int:
        """Replay the oracle log from scratch; check recorded state hashes and acknowledged
        commands ``(client_id, seq, index, term, result)``: in the log, effective once, and
        told the result of that effective application (a retry's cached answer included).
        Fills :attr:`command_stats`. Returns the replayed length."""
        top = max(self.applied_entries, default=0)
        entries: list[Entry] = []
        for i in range(1, top + 1):
            e = self.applied_entries.get(i)
            if e is None:
                self.fail("replay_mismatch", "", f"no node applied {i} (applied up to {top})")
            assert e is not None
            entries.append(e)
        effective: dict[tuple[str, int], int] = {}
        answered: dict[tuple[str, int], bytes] = {}
        stats: dict[str, int] = {}
        replayed = replay(entries, machine=self.machine)
        for e, (state, eff, result) in zip(entries, replayed, strict=True):
            known = self.applied_state.get(e.index)
            if known is not None and known != state:
                self.fail("replay_mismatch", "", f"replayed state at {e.index} differs")
            if eff:
                key = outcome_key(e, result)
                stats[key] = stats.get(key, 0) + 1
            if eff and e.client_id:
                ck = (e.client_id, e.seq)
                effective[ck] = effective.get(ck, 0) + 1
                answered[ck] = result
                if effective[ck] > 1:
                    self.fail("applied_twice", "", f"command {ck} applied twice")
        acks = list(acks)
        self.check_acks(acks)
        for client, seq, index, _, result in acks:
            if effective.get((client, seq), 0) != 1:
                self.fail("ack_lost", "", f"acknowledged ({client}, {seq}) never took effect")
            if answered[(client, seq)] != result:
                self.fail(
                    "ack_result",
                    "",
                    f"({client}, {seq}) was told {result_text(result)} at {index}; it took "
                    f"effect answering {result_text(answered[(client, seq)])}",
                )
        self.command_stats = dict(sorted(stats.items()))
        return top


def _span(pairs: list[tuple[int, int]]) -> str:
    if not pairs:
        return "[]"
    return f"[{pairs[0][0]}@{pairs[0][1]}..{pairs[-1][0]}@{pairs[-1][1]}] ({len(pairs)})"
