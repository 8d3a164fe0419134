"""Fault plans: validation, JSON round trips, seeded random plans."""

from __future__ import annotations

import random

import pytest

from skulk.sim._faults import (
    Action,
    PlanError,
    PlanShape,
    plan_from_json,
    plan_to_json,
    random_plan,
    validate,
)

NODES = ("n1", "n2", "n3", "n4", "n5")


def test_json_round_trip_keeps_only_what_is_set() -> None:
    plan = (
        Action(3, "partition", groups=(("n1", "n2"), ("n3",))),
        Action(5, "cut", node="n1", peer="n2", msg="AppendRequest"),
        Action(9, "delay", lo=2, hi=7),
    )
    raw = plan_to_json(plan)
    assert raw[1] == {"at": 5, "op": "cut", "node": "n1", "peer": "n2", "msg": "AppendRequest"}
    assert plan_from_json(raw) == plan


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (Action(1, "explode"), "unknown op"),
        (Action(1, "crash"), "needs node"),
        (Action(1, "crash", node="n9"), "unknown node"),
        (Action(1, "heal", node="n1"), "does not take node"),
        (Action(1, "drop", p=1.5), "p must be"),
        (Action(1, "delay", lo=5, hi=2), "lo <= hi"),
        (Action(1, "cut", node="n1", peer="n2", msg="Gossip"), "unknown message type"),
        (Action(-1, "heal"), "negative time"),
        (Action(1, "flap", node="n1", peer="n2"), "needs n"),
    ],
)
def test_validate_refuses_bad_actions(action: Action, message: str) -> None:
    with pytest.raises(PlanError, match=message):
        validate(action, NODES)


def test_from_json_refuses_unknown_fields() -> None:
    with pytest.raises(PlanError, match="unknown field"):
        Action.from_json({"at": 1, "op": "heal", "colour": "red"})
    with pytest.raises(PlanError, match="needs 'at' and 'op'"):
        Action.from_json({"op": "heal"})


def test_leader_placeholder_is_valid() -> None:
    validate(Action(1, "crash", node="@leader"), NODES)


def test_random_plan_is_seeded_valid_sorted_and_ends_healed() -> None:
    shape = PlanShape(until=1000)
    plan = random_plan(random.Random("7:faults"), NODES, shape)
    assert plan == random_plan(random.Random("7:faults"), NODES, shape)
    assert plan != random_plan(random.Random("8:faults"), NODES, shape)
    assert [a.at for a in plan] == sorted(a.at for a in plan)
    assert plan[-1] == Action(1000, "heal_all")
    assert all(a.at < 1000 for a in plan[:-1])
    for a in plan:
        validate(a, NODES)
    assert sum(a.op == "flip_bit" for a in plan) <= 1
    assert len({a.op for a in plan}) > 8


def test_random_plan_without_disk_faults() -> None:
    shape = PlanShape(until=2000, disk_faults=False, bit_flips=False)
    plan = random_plan(random.Random(1), NODES, shape)
    disk_ops = {"disk_full", "fsync_error", "crash_during_write", "crash_on_snapshot", "flip_bit"}
    assert not disk_ops & {a.op for a in plan}
