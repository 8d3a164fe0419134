"""The simulator's state machine: the real cluster State behind the real sessions, the digest
chain, snapshots, impurity."""

from __future__ import annotations

import pytest

from skulk.cluster import decode_result, encode_command
from skulk.consensus import ConfChange, Entry, EntryKind
from skulk.sim._statemachine import (
    INITIAL,
    BadSnapshotData,
    apply_entry,
    apply_entry_impure,
    decode_state,
    encode_state,
    replay,
    state_hash,
)
from skulk.wire.cluster import (
    Applied,
    ClusterCommand,
    NodeStatusChanged,
    Rejected,
    RemoveNode,
    UpsertNode,
)


def cmd(index: int, client: str, seq: int, command: ClusterCommand | None = None) -> Entry:
    command = command or UpsertNode(f"{client}{seq}", "api:1", "fed:2", at=seq)
    return Entry(index, 1, EntryKind.COMMAND, encode_command(command), client, seq)


def test_retries_apply_once_and_other_entries_only_advance() -> None:
    entries = [
        cmd(1, "a", 1),
        Entry(2, 1, EntryKind.NOOP),
        cmd(3, "a", 1, RemoveNode("a1")),  # a retry (decided anew): not applied
        cmd(4, "b", 1),
        Entry(5, 1, EntryKind.CONF, conf=ConfChange("add_learner", "n9")),
        cmd(6, "a", 2),
    ]
    steps = replay(entries)
    assert [eff for _, eff, _ in steps] == [True, False, False, True, False, True]
    final = steps[-1][0]
    assert final.applied == 6 and final.count == 3
    assert final.sessions() == (("a", 2), ("b", 1))
    assert [n.id for n in final.cluster.nodes] == ["a1", "a2", "b1"]  # a1 was not removed
    # the retry is answered with the first attempt's result, no-ops with nothing
    assert steps[2][2] == steps[0][2] and decode_result(steps[0][2]) == Applied()
    assert steps[1][2] == b"" and steps[4][2] == b""
    # skipping the retry gives the same user state at a different index
    other = replay([cmd(1, "a", 1), cmd(2, "b", 1), cmd(3, "a", 2)])[-1][0]
    assert (other.digest, other.sessions(), other.count, other.cluster) == (
        final.digest,
        final.sessions(),
        final.count,
        final.cluster,
    )
    assert state_hash(other) != state_hash(final)  # the applied index is part of the state


def test_rejections_are_results_and_leave_the_cluster_state() -> None:
    s1, eff, result = apply_entry(INITIAL, cmd(1, "a", 1, NodeStatusChanged("x", "down", 5)))
    assert eff and isinstance(decode_result(result), Rejected)
    assert s1.cluster == INITIAL.cluster and s1.count == 1  # effective, yet rejected
    _, eff, result = apply_entry(s1, Entry(2, 1, EntryKind.COMMAND, b"\xff", "a", 2))
    answer = decode_result(result)
    assert eff and isinstance(answer, Rejected) and answer.reason == "undecodable"


def test_order_matters() -> None:
    ab = replay([cmd(1, "a", 1), cmd(2, "b", 1)])[-1][0]
    ba = replay([cmd(1, "b", 1), cmd(2, "a", 1)])[-1][0]
    assert state_hash(ab) != state_hash(ba)


def test_snapshot_round_trip_and_bad_data() -> None:
    state = replay([cmd(1, "a", 1), cmd(2, "b", 7)])[-1][0]
    assert decode_state(encode_state(state)) == state
    assert encode_state(state) == encode_state(decode_state(encode_state(state)))
    with pytest.raises(BadSnapshotData):
        decode_state(b"not a snapshot")
    with pytest.raises(BadSnapshotData):
        decode_state(encode_state(state)[:-3])


def test_impure_apply_differs_between_nodes() -> None:
    e = cmd(1, "a", 1)
    s1, _, _ = apply_entry_impure(INITIAL, e, "n1")
    s2, _, _ = apply_entry_impure(INITIAL, e, "n2")
    pure, _, _ = apply_entry(INITIAL, e)
    assert len({state_hash(s1), state_hash(s2), state_hash(pure)}) == 3
