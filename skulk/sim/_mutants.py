"""Negative controls: deliberately broken variants the harness must catch.

Each :class:`Mutant` breaks exactly one thing, through one of the core's ``_rule_*`` methods
(kept apart in :class:`~skulk.consensus.RaftCore` for this purpose), the Raft
configuration, the storage, the disk or the cluster State's ``apply``:

======================  ====================================================================
``commit-old-term``     ``_rule_can_commit``: a leader commits an entry of an earlier term by
                        counting replicas (Raft §5.4.2, Figure 8)
``no-persist-vote``     storage drops the vote from every persisted HardState
``skip-fsync``          ``fsync`` and ``fsync_dir`` do nothing
``apply-before-commit`` ``_rule_apply_limit``: entries are handed out for applying as soon as
                        they are in the log
``ignore-vote-term``    ``_rule_vote_reply_counts``: vote replies count whatever their term
``no-prevote``          ``RaftConfig(pre_vote=False)``
======================  ====================================================================

and, through the cluster machine (``apply`` of the real State, wrapped by
:class:`_BrokenClusterMachine`):

===============================  ===========================================================
``place-on-down-node``           ``PlaceInstance`` skips the ``node_not_up`` check
``keep-runners-on-delete``       ``DeleteInstance`` leaves the instance's runner records
``overwrite-instance``           ``PlaceInstance`` of an existing id replaces the instance
``write-on-reject``              a ``ReportRunner`` rejected as ``wrong_node`` is recorded
                                 anyway (the State changes under a ``Rejected``)
``impure-cluster-apply``         ``UpsertNode`` / ``ReportRunner`` stamp the applying node's
                                 own clock instead of the leader's ``at``
``forget-retry-result``          the sessions answer a retried command with nothing instead
                                 of its cached result (through :class:`Sessions`)
===============================  ===========================================================

``python -m skulk.sim run --mutant NAME`` runs one; ``tests/sim/test_mutants.py`` asserts that
each is caught by random seeds alone (the first failing seed below 300) and, where a scenario
names it, by that targeted scenario too.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence

import attrs

from skulk.cluster import COMMAND_CODEC, RESULT_CODEC, ClusterMachine, State
from skulk.cluster import apply as cluster_apply
from skulk.consensus import (
    Entry,
    EntryKind,
    HardState,
    RaftConfig,
    RaftCore,
    Recovered,
    Role,
    Sessions,
    SessionState,
    Snapshot,
    StateMachine,
    VoteReply,
)
from skulk.sim._crashdisk import CrashingDisk
from skulk.sim._node import MakeCore, OpenStorage, StorageLike
from skulk.sim._statemachine import Machine, real_machine
from skulk.wire import WireError
from skulk.wire.cluster import (
    Applied,
    ClusterCommand,
    ClusterResult,
    DeleteInstance,
    PlaceInstance,
    Rejected,
    ReportRunner,
    UpsertNode,
)


class _CommitOldTerm(RaftCore):
    def _rule_can_commit(self, index: int) -> bool:
        return self.term_at(index) is not None


class _ApplyBeforeCommit(RaftCore):
    def _rule_apply_limit(self) -> int:
        return self.last_index


class _IgnoreVoteTerm(RaftCore):
    def _rule_vote_reply_counts(self, p: VoteReply) -> bool:
        return self.role is (Role.PRE_CANDIDATE if p.pre_vote else Role.CANDIDATE)


class _VoteDroppingStorage:
    """Persists everything but the vote."""

    def __init__(self, inner: StorageLike) -> None:
        self._inner = inner

    def persist(
        self,
        *,
        snapshot: Snapshot | None = None,
        entries: tuple[Entry, ...] = (),
        hard_state: HardState | None = None,
        restore: bool = False,
    ) -> None:
        if hard_state is not None:
            hard_state = attrs.evolve(hard_state, vote=None)
        self._inner.persist(
            snapshot=snapshot, entries=entries, hard_state=hard_state, restore=restore
        )


class _BrokenClusterMachine(ClusterMachine):
    """:class:`ClusterMachine` with ``apply(state, command)`` replaced by :meth:`transition`
    (the entry decoding and result encoding are the real machine's)."""

    def __init__(self, node_id: str = "") -> None:
        self.node_id = node_id

    def transition(self, state: State, command: ClusterCommand) -> tuple[State, ClusterResult]:
        return cluster_apply(state, command)

    def apply(self, state: State, entry: Entry) -> tuple[State, bytes]:
        if entry.kind is not EntryKind.COMMAND:
            return state, b""
        try:
            command = COMMAND_CODEC.decode(entry.data)
        except WireError as exc:
            result: ClusterResult = Rejected("undecodable", str(exc)[:200])
        else:
            state, result = self.transition(state, command)
        return state, RESULT_CODEC.encode(result)


class _PlaceOnDownNode(_BrokenClusterMachine):
    def transition(self, state: State, command: ClusterCommand) -> tuple[State, ClusterResult]:
        if not isinstance(command, PlaceInstance):
            return cluster_apply(state, command)
        all_up = attrs.evolve(state, nodes=tuple(attrs.evolve(n, status="up") for n in state.nodes))
        new, result = cluster_apply(all_up, command)
        if not isinstance(result, Applied):
            return state, result
        return attrs.evolve(new, nodes=state.nodes), result


class _KeepRunnersOnDelete(_BrokenClusterMachine):
    def transition(self, state: State, command: ClusterCommand) -> tuple[State, ClusterResult]:
        new, result = cluster_apply(state, command)
        if isinstance(command, DeleteInstance) and isinstance(result, Applied):
            new = attrs.evolve(new, runners=state.runners)
        return new, result


class _OverwriteInstance(_BrokenClusterMachine):
    def transition(self, state: State, command: ClusterCommand) -> tuple[State, ClusterResult]:
        if isinstance(command, PlaceInstance) and state.instance(command.instance) is not None:
            gone = attrs.evolve(
                state,
                instances=tuple(i for i in state.instances if i.id != command.instance),
                runners=tuple(r for r in state.runners if r.instance != command.instance),
            )
            new, result = cluster_apply(gone, command)
            return (new, result) if isinstance(result, Applied) else (state, result)
        return cluster_apply(state, command)


class _WriteOnReject(_BrokenClusterMachine):
    def transition(self, state: State, command: ClusterCommand) -> tuple[State, ClusterResult]:
        new, result = cluster_apply(state, command)
        if (
            isinstance(command, ReportRunner)
            and isinstance(result, Rejected)
            and result.reason == "wrong_node"
        ):
            runners = tuple(
                attrs.evolve(r, node=command.node, phase=command.phase, changed_at=command.at)
                if (r.instance, r.rank) == (command.instance, command.rank)
                else r
                for r in state.runners
            )
            new = attrs.evolve(state, runners=runners)
        return new, result


class _ImpureClusterApply(_BrokenClusterMachine):
    def transition(self, state: State, command: ClusterCommand) -> tuple[State, ClusterResult]:
        if isinstance(command, UpsertNode | ReportRunner):
            skew = hashlib.sha256(self.node_id.encode()).digest()[0] % 7
            command = attrs.evolve(command, at=command.at + skew)  # "the local clock"
        return cluster_apply(state, command)


class _ForgetRetryResult(Sessions[State]):
    def apply_all(
        self, state: SessionState[State], entries: Sequence[Entry]
    ) -> tuple[SessionState[State], list[bytes]]:
        results: list[bytes] = []
        for entry in entries:
            last = state.sessions.get(entry.client_id) if entry.client_id else None
            retry = entry.kind is EntryKind.COMMAND and last is not None and entry.seq <= last.seq
            state, (result,) = super().apply_all(state, (entry,))
            results.append(b"" if retry else result)
        return state, results


@attrs.frozen
class Mutant:
    name: str
    description: str
    core_class: type[RaftCore] = RaftCore
    pre_vote: bool | None = None
    """Override ``RaftConfig.pre_vote`` (None: leave it)."""
    drop_vote: bool = False
    skip_fsync: bool = False
    cluster_machine: Callable[[str], StateMachine[State]] | None = None
    """Builds a node's cluster machine from its id (None: the real ``ClusterMachine``)."""
    sessions: type[Sessions[State]] | None = None
    """The sessions class around it (None: the real :class:`Sessions`)."""

    def machine(self, node_id: str) -> Machine:
        """The state machine ``node_id`` runs: sessions around the cluster machine."""
        if self.cluster_machine is None and self.sessions is None:
            return real_machine(node_id)
        inner = self.cluster_machine(node_id) if self.cluster_machine else ClusterMachine()
        return (self.sessions or Sessions)(inner)

    def make_core(self) -> MakeCore:
        cls = self.core_class

        def make(node: str, config: RaftConfig, rng: random.Random, rec: Recovered) -> RaftCore:
            return cls(node, config, rng, rec)

        return make

    def raft(self, config: RaftConfig) -> RaftConfig:
        if self.pre_vote is None:
            return config
        return attrs.evolve(config, pre_vote=self.pre_vote)

    def open_storage(self, inner: OpenStorage) -> OpenStorage:
        if not self.drop_vote:
            return inner

        def open_(disk: CrashingDisk) -> tuple[StorageLike, Recovered]:
            storage, recovered = inner(disk)
            return _VoteDroppingStorage(storage), recovered

        return open_


NONE = Mutant("none", "the real thing")

MUTANTS: dict[str, Mutant] = {
    m.name: m
    for m in (
        Mutant(
            "commit-old-term",
            "a leader commits an earlier term's entry by counting replicas",
            core_class=_CommitOldTerm,
        ),
        Mutant("no-persist-vote", "storage does not persist the vote", drop_vote=True),
        Mutant("skip-fsync", "fsync and directory fsync do nothing", skip_fsync=True),
        Mutant(
            "apply-before-commit",
            "entries are applied as soon as they are appended",
            core_class=_ApplyBeforeCommit,
        ),
        Mutant(
            "ignore-vote-term",
            "vote replies are counted whatever their term",
            core_class=_IgnoreVoteTerm,
        ),
        Mutant("no-prevote", "elections skip the PreVote round", pre_vote=False),
        Mutant(
            "place-on-down-node",
            "apply() places instances on nodes that are down or left",
            cluster_machine=_PlaceOnDownNode,
        ),
        Mutant(
            "keep-runners-on-delete",
            "apply() keeps a deleted instance's runner records",
            cluster_machine=_KeepRunnersOnDelete,
        ),
        Mutant(
            "overwrite-instance",
            "apply() lets a PlaceInstance replace an existing instance",
            cluster_machine=_OverwriteInstance,
        ),
        Mutant(
            "write-on-reject",
            "apply() records a runner report it rejects as wrong_node",
            cluster_machine=_WriteOnReject,
        ),
        Mutant(
            "impure-cluster-apply",
            "apply() stamps the applying node's clock on node and runner records",
            cluster_machine=_ImpureClusterApply,
        ),
        Mutant(
            "forget-retry-result",
            "a retried command is answered with nothing, not its cached result",
            sessions=_ForgetRetryResult,
        ),
    )
}


class UnknownMutant(ValueError):
    pass


def find_mutant(name: str | None) -> Mutant:
    """The mutant called ``name`` (``None``/``""``/``"none"``: no mutation)."""
    if not name or name == "none":
        return NONE
    try:
        return MUTANTS[name]
    except KeyError:
        raise UnknownMutant(f"unknown mutant {name!r} (known: {', '.join(MUTANTS)})") from None
