"""The invariant checker fails with the right name when fed a broken history."""

from __future__ import annotations

from functools import partial

import attrs
import pytest

from skulk.cluster import encode_command
from skulk.consensus import (
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Message,
    Ready,
    Recovered,
    Role,
    Snapshot,
    SnapshotMeta,
    VoteReply,
)
from skulk.sim import MUTANTS
from skulk.sim._invariants import Checker, ViolationFound
from skulk.sim._statemachine import INITIAL, SmState, apply_entry, encode_state
from skulk.wire.cluster import (
    Architecture,
    ClusterCommand,
    DemoSource,
    ModelCard,
    NodeStatusChanged,
    PlaceInstance,
    RegisterModel,
    Shard,
    UpsertNode,
)

VOTERS = ("n1", "n2", "n3")
BOOT = Snapshot(SnapshotMeta(0, 0, ConfState(VOTERS)), encode_state(INITIAL))


def checker(require_pre_vote: bool = True) -> Checker:
    c = Checker(lambda: 7, require_pre_vote=require_pre_vote)
    for n in VOTERS:
        c.on_recovered(n, Recovered(HardState(), BOOT, ()), clean=True)
    return c


def e(index: int, term: int, data: bytes = b"") -> Entry:
    kind = EntryKind.COMMAND if data else EntryKind.NOOP
    return Entry(index, term, kind, data, "c" if data else "", index if data else 0)


def stepped(
    c: Checker,
    node: str,
    *,
    role: Role = Role.FOLLOWER,
    term: int = 1,
    vote: str | None = None,
    commit: int = 0,
    last: int = 0,
    last_term: int | None = 0,
    inp: None = None,
) -> None:
    c.on_stepped(
        node,
        inp,
        role=role,
        term=term,
        vote=vote,
        commit=commit,
        first_index=1,
        last_index=last,
        last_term=last_term,
        voters=VOTERS,
    )


def persist(
    c: Checker,
    node: str,
    *entries: Entry,
    hs: HardState | None = None,
    role: Role = Role.FOLLOWER,
    term: int = 1,
) -> None:
    c.on_persisted(node, Ready(hard_state=hs, entries=entries), role, term)


def violation(fn: object) -> str:
    assert callable(fn)
    with pytest.raises(ViolationFound) as info:
        fn()
    return info.value.violation.name


def test_election_safety() -> None:
    c = checker(require_pre_vote=False)
    persist(c, "n1", e(1, 1), hs=HardState(1, "n1", 0))
    stepped(c, "n1", role=Role.LEADER, vote="n1", last=1, last_term=1)
    persist(c, "n2", e(1, 1), hs=HardState(1, "n2", 0))
    assert (
        violation(lambda: stepped(c, "n2", role=Role.LEADER, vote="n2", last=1, last_term=1))
        == "election_safety"
    )


def test_double_vote_and_monotonic_term() -> None:
    c = checker()
    persist(c, "n1", hs=HardState(2, "n2", 0))
    assert violation(lambda: persist(c, "n1", hs=HardState(2, "n3", 0))) == "double_vote"
    assert violation(lambda: persist(c, "n1", hs=HardState(1, None, 0))) == "monotonic_term"


def test_log_matching() -> None:
    c = checker()
    persist(c, "n1", e(1, 1, b"x"))
    assert violation(lambda: persist(c, "n2", e(1, 1, b"y"))) == "log_matching"
    assert violation(lambda: persist(c, "n3", e(2, 1))) == "log_matching"  # a gap


def test_leader_append_only() -> None:
    c = checker()
    persist(c, "n1", e(1, 1), e(2, 1), hs=HardState(1, "n1", 0), role=Role.LEADER)
    stepped(c, "n1", role=Role.LEADER, vote="n1", last=2, last_term=1)
    assert violation(lambda: persist(c, "n1", e(2, 1, b"z"), role=Role.LEADER)) == (
        "leader_append_only"
    )


def applied(c: Checker, node: str, entry: Entry, commit: int, before: SmState = INITIAL) -> SmState:
    after, effective, result = apply_entry(before, entry)
    c.on_applied(node, entry, commit, after, before=before, effective=effective, result=result)
    return after


def test_state_machine_safety_and_apply_rules() -> None:
    c = checker()
    a, b = e(1, 1, b"a"), e(1, 1, b"b")
    sa = applied(c, "n1", a, 1)
    assert violation(lambda: applied(c, "n2", b, 1)) == "state_machine_safety"
    assert violation(lambda: applied(c, "n3", a, 0)) == "apply_beyond_commit"
    assert violation(lambda: applied(c, "n3", e(2, 1), 2, sa)) == "apply_gap"


def test_durability_after_a_clean_crash() -> None:
    c = checker()
    persist(c, "n1", e(1, 1), hs=HardState(1, "n2", 1))
    lost = Recovered(HardState(1, "n2", 1), BOOT, ())
    assert violation(lambda: c.on_recovered("n1", lost, clean=True)) == "durability"
    c.on_recovered("n1", lost, clean=False)  # after an interrupted write: either is fine
    assert (
        violation(
            lambda: c.on_recovered("n1", Recovered(HardState(0, None, 0), BOOT, ()), clean=False)
        )
        == "monotonic_term"
    )


def test_unpersisted_state() -> None:
    c = checker()
    persist(c, "n1", hs=HardState(1, None, 0))
    assert violation(lambda: stepped(c, "n1", term=2)) == "unpersisted_state"
    assert violation(lambda: stepped(c, "n1", term=1, last=3)) == "unpersisted_state"


def test_prevote_discipline() -> None:
    c = checker()
    persist(c, "n1", hs=HardState(1, "n1", 0))
    assert (
        violation(lambda: stepped(c, "n1", role=Role.CANDIDATE, vote="n1")) == "prevote_discipline"
    )
    c2 = checker()
    c2.on_deliver(Message("n2", "n1", VoteReply(1, True, pre_vote=True)))
    persist(c2, "n1", hs=HardState(1, "n1", 0))
    stepped(c2, "n1", role=Role.CANDIDATE, vote="n1")  # n1 + n2 of three: a quorum


def test_leader_completeness() -> None:
    c = checker(require_pre_vote=False)
    persist(c, "n1", e(1, 1, b"x"), hs=HardState(1, "n1", 1))
    stepped(c, "n1", role=Role.LEADER, vote="n1", commit=1, last=1, last_term=1)
    persist(c, "n2", hs=HardState(2, "n2", 0))
    assert (
        violation(lambda: stepped(c, "n2", role=Role.LEADER, term=2, vote="n2", last_term=0))
        == "leader_completeness"
    )


def test_restore_mismatch() -> None:
    c = checker()
    snap = Snapshot(SnapshotMeta(5, 1, ConfState(VOTERS)), encode_state(INITIAL))
    assert violation(lambda: c.on_restored("n1", snap, INITIAL)) == ("restore_mismatch")


def test_final_replay_and_acks() -> None:
    c = checker()
    a = e(1, 1, b"a")
    applied(c, "n1", a, 1)
    told = c.applied_results[1]
    assert c.final_replay([("c", 1, 1, 1, told)]) == 1
    assert c.command_stats == {"undecodable:undecodable": 1}
    assert violation(lambda: c.final_replay([("c", 2, 1, 1, told)])) == "ack_lost"
    assert violation(lambda: c.final_replay([("c", 1, 1, 1, b"")])) == "ack_result"
    c.applied_state[1] = INITIAL
    assert violation(lambda: c.final_replay([])) == "replay_mismatch"


def test_cluster_oracles_run_on_every_apply_of_every_replica() -> None:
    """The checker runs the cluster State oracles with each replica's own before/after."""
    broken = MUTANTS["place-on-down-node"].machine("n1")
    commands: list[ClusterCommand] = [
        UpsertNode("n1", "api", "fed", 1),
        NodeStatusChanged("n1", "down", 2),
        RegisterModel(ModelCard("m", DemoSource(1), Architecture("a", 2, 2, 1, 1, 2), 1, 8)),
        PlaceInstance("i", "m", "single", (Shard(0, "n1", 0, 2),), 3),
    ]
    c = checker()
    state = INITIAL
    for i, command in enumerate(commands, start=1):
        entry = Entry(i, 1, EntryKind.COMMAND, encode_command(command), "c", i)
        after, effective, result = apply_entry(state, entry, machine=broken)
        record = partial(
            c.on_applied, "n1", entry, i, after, before=state, effective=effective, result=result
        )
        if i < len(commands):
            record()
        else:
            assert violation(record) == "placed_on_unavailable_node"
        state = after
    # an entry that did not take effect must not change the State either
    c2 = checker()
    noop = Entry(1, 1, EntryKind.NOOP)
    assert (
        violation(
            lambda: c2.on_applied(
                "n1",
                noop,
                1,
                attrs.evolve(state, applied=1),
                before=INITIAL,
                effective=False,
                result=b"",
            )
        )
        == "noop_changed_state"
    )
