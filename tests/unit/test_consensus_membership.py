"""The leader's membership policy."""

from __future__ import annotations

import pytest

from skulk.consensus import ConfChange, ConfState
from skulk.consensus._membership import next_change, wanted_voters


@pytest.mark.parametrize(
    ("members", "max_voters", "wanted"),
    [(1, 5, 1), (2, 5, 1), (3, 5, 3), (4, 5, 3), (5, 5, 5), (9, 5, 5), (9, 4, 3), (0, 5, 1)],
)
def test_wanted_voters_is_odd_and_capped(members: int, max_voters: int, wanted: int) -> None:
    assert wanted_voters(members, max_voters) == wanted


def test_a_linked_stranger_is_added_as_learner_first() -> None:
    conf = ConfState(("a",), ("b",))
    assert next_change(conf, {"c", "b"}, lambda n: True) == ConfChange("add_learner", "c")


def test_a_second_node_stays_learner_until_a_third_arrives() -> None:
    assert next_change(ConfState(("a",), ("b",)), {"b"}, lambda n: True) is None
    conf = ConfState(("a",), ("b", "c"))
    assert next_change(conf, {"b", "c"}, lambda n: True) == ConfChange("promote", "b")
    conf = ConfState(("a", "b"), ("c",))
    assert next_change(conf, {"b", "c"}, lambda n: True) == ConfChange("promote", "c")


def test_a_lagging_learner_is_not_promoted() -> None:
    conf = ConfState(("a",), ("b", "c"))
    assert next_change(conf, {"b", "c"}, lambda n: n == "c") == ConfChange("promote", "c")
    assert next_change(conf, {"b", "c"}, lambda n: False) is None


def test_no_more_voters_than_wanted() -> None:
    conf = ConfState(("a", "b", "c", "d", "e"), ("f",))
    assert next_change(conf, {"b", "c", "d", "e", "f"}, lambda n: True) is None


def test_an_unlinked_member_is_never_removed() -> None:
    conf = ConfState(("a", "b", "c"))
    assert next_change(conf, set(), lambda n: True) is None
