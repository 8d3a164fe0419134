"""Negative controls: deliberately broken variants the harness must catch.

Each :class:`Mutant` breaks exactly one thing, through one of the core's ``_rule_*`` methods
(kept apart in :class:`~skulk.consensus._core.RaftCore` for this purpose), the Raft
configuration, the storage or the disk:

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

``python -m skulk.sim run --mutant NAME`` runs one; ``tests/sim/test_mutants.py`` asserts that
each is caught by random seeds alone (the first failing seed below 300) and, where a scenario
names it, by that targeted scenario too.
"""

from __future__ import annotations

import random

import attrs

from skulk.consensus._core import RaftConfig, RaftCore, Role
from skulk.consensus._types import Entry, HardState, Recovered, Snapshot, VoteReply
from skulk.sim._crashdisk import CrashingDisk
from skulk.sim._node import MakeCore, OpenStorage, StorageLike


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


@attrs.frozen
class Mutant:
    name: str
    description: str
    core_class: type[RaftCore] = RaftCore
    pre_vote: bool | None = None
    """Override ``RaftConfig.pre_vote`` (None: leave it)."""
    drop_vote: bool = False
    skip_fsync: bool = False

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
