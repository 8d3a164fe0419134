"""The invariant checker's state-machine checks: what each replica applied and restored, and,
at the end of a run, the replay of the oracle log and the acknowledged commands (see
:mod:`skulk.sim._invariants` for the table of invariants)."""

from __future__ import annotations

from collections.abc import Iterable

from skulk.cluster import COMMAND_CODEC, decode_result
from skulk.cluster import state_hash as cluster_state_hash
from skulk.consensus import Entry, Snapshot
from skulk.sim._checkstate import Ack, CheckerState
from skulk.sim._clusterchecks import outcome_key, result_text, transition_problem
from skulk.sim._statemachine import SmState, decode_state, replay, state_hash
from skulk.wire import WireError
from skulk.wire.cluster import ClusterCommand, ClusterResult


class ApplyChecks(CheckerState):
    """``on_restored``, ``on_applied``, ``check_acks`` and ``final_replay``."""

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
