"""The simulator's state machine: exactly-once sessions, snapshots, impurity."""

from __future__ import annotations

import pytest

from skulk.consensus._types import ConfChange, Entry, EntryKind
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


def cmd(index: int, client: str, seq: int) -> Entry:
    return Entry(index, 1, EntryKind.COMMAND, f"{client}:{seq}".encode(), client, seq)


def test_retries_apply_once_and_other_entries_only_advance() -> None:
    entries = [
        cmd(1, "a", 1),
        Entry(2, 1, EntryKind.NOOP),
        cmd(3, "a", 1),  # a retry
        cmd(4, "b", 1),
        Entry(5, 1, EntryKind.CONF, conf=ConfChange("add_learner", "n9")),
        cmd(6, "a", 2),
    ]
    states = replay(entries)
    assert [eff for _, eff in states] == [True, False, False, True, False, True]
    final = states[-1][0]
    assert final.applied == 6 and final.count == 3
    assert final.sessions == (("a", 2), ("b", 1))
    # skipping the retry gives the same user state at a different index
    other = replay([cmd(1, "a", 1), cmd(2, "b", 1), cmd(3, "a", 2)])[-1][0]
    assert (other.digest, other.sessions, other.count) == (
        final.digest, final.sessions, final.count
    )
    assert state_hash(other) != state_hash(final)  # the applied index is part of the state


def test_order_matters() -> None:
    ab = replay([cmd(1, "a", 1), cmd(2, "b", 1)])[-1][0]
    ba = replay([cmd(1, "b", 1), cmd(2, "a", 1)])[-1][0]
    assert state_hash(ab) != state_hash(ba)


def test_snapshot_round_trip_and_bad_data() -> None:
    state = replay([cmd(1, "a", 1), cmd(2, "b", 7)])[-1][0]
    assert decode_state(encode_state(state)) == state
    assert encode_state(state) == encode_state(decode_state(encode_state(state)))
    with pytest.raises(BadSnapshotData):
        decode_state(b"not json")


def test_impure_apply_differs_between_nodes() -> None:
    e = cmd(1, "a", 1)
    s1, _ = apply_entry_impure(INITIAL, e, "n1")
    s2, _ = apply_entry_impure(INITIAL, e, "n2")
    pure, _ = apply_entry(INITIAL, e)
    assert len({state_hash(s1), state_hash(s2), state_hash(pure)}) == 3
