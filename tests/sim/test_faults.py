"""Fault plans: validation, JSON round trips, seeded random plans (swarm testing)."""

from __future__ import annotations

import random

import pytest

from skulk.sim import Action, PlanError
from skulk.sim._faults import bind_leader, plan_from_json, plan_to_json, validate
from skulk.sim._swarm import HUNT_CORE, TRIGGERED, PlanShape, Swarm, draw_swarm, random_plan

NODES = ("n1", "n2", "n3", "n4", "n5")


def test_json_round_trip_keeps_only_what_is_set() -> None:
    plan = (
        Action(3, "partition", groups=(("n1", "n2"), ("n3",))),
        Action(5, "cut", node="n1", peer="n2", msg="AppendRequest"),
        Action(9, "delay", lo=2, hi=7),
        Action(11, "isolate", node="@leader", on="elected", after=2),
    )
    raw = plan_to_json(plan)
    assert raw[1] == {"at": 5, "op": "cut", "node": "n1", "peer": "n2", "msg": "AppendRequest"}
    assert raw[3] == {"at": 11, "op": "isolate", "node": "@leader", "on": "elected", "after": 2}
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
        (Action(1, "rejoin"), "needs node"),
        (Action(1, "crash", node="n1", on="tuesday", after=1), "unknown event"),
        (Action(1, "crash", node="n1", on="elected"), "'on' and 'after'"),
        (Action(1, "crash", node="n1", after=3), "'on' and 'after'"),
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


def test_leader_placeholder_is_valid_and_binds() -> None:
    validate(Action(1, "crash", node="@leader"), NODES)
    validate(Action(1, "heal", on="first_commit", after=1), NODES)
    a = Action(1, "partition", groups=(("@leader", "n2"), ("n3",)))
    assert bind_leader(a, "n1").groups == (("n1", "n2"), ("n3",))
    assert bind_leader(Action(1, "cut", node="n4", peer="@leader"), "n2").peer == "n2"


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
    disk_ops = {"disk_full", "fsync_error", "crash_during_write", "crash_on_snapshot", "flip_bit"}
    for seed in range(20):
        plan = random_plan(random.Random(seed), NODES, shape)
        assert not disk_ops & {a.op for a in plan}


def test_each_seed_draws_its_own_mix() -> None:
    shape = PlanShape(until=1000)
    swarms = [draw_swarm(random.Random(f"{s}:faults"), shape, 5) for s in range(200)]
    profiles = [s.profile for s in swarms]
    assert {"full", "hunt", "subset"} == set(profiles)
    assert 25 < profiles.count("hunt") < 75 and profiles.count("subset") > 70
    assert len({s.weights for s in swarms}) > 100
    for s in swarms:
        kinds = {k for k, _ in s.weights}
        if s.profile == "hunt":  # leader hunting: nothing but faults aimed at leaders
            assert set(HUNT_CORE) <= kinds <= {*TRIGGERED, "slow_votes"}
        else:
            assert len(kinds) >= 2


def test_a_hunting_plan_aims_at_leaders_and_pairs_each_fault_with_its_undo() -> None:
    swarm = Swarm("hunt", tuple((k, 1) for k in HUNT_CORE), mean_gap=25, leader_share=0.0)
    plan = random_plan(random.Random(3), NODES, PlanShape(until=1000), swarm)
    triggered = [a for a in plan if a.on]
    assert len(triggered) == len(plan) - 1 and plan[-1].op == "heal_all"
    assert {a.on for a in triggered} == {"elected", "first_commit", "proposed"}
    by_tick: dict[int, list[Action]] = {}
    for a in triggered:
        assert a.node == "@leader"
        by_tick.setdefault(a.at, []).append(a)
    for pair in by_tick.values():  # armed together: they fire on the same event
        fault, undo = pair
        assert (fault.op, undo.op) == ("isolate", "rejoin") and fault.on == undo.on
        assert undo.after > fault.after
        assert fault.after <= (2 if fault.on == "first_commit" else 30)


def test_durations_scale_with_the_election_timeout() -> None:
    swarm = Swarm("hunt", (("elected_crash", 1),), mean_gap=25, leader_share=0.0)

    def outages(timeout: int) -> list[int]:
        shape = PlanShape(until=4000, timeout=timeout)
        plan = random_plan(random.Random(5), NODES, shape, swarm)
        crashes = {a.at: a.after for a in plan if a.op == "crash"}
        return [a.after - crashes[a.at] for a in plan if a.op == "restart"]

    fast, slow = outages(20), outages(80)
    assert len(fast) > 50 and len(slow) > 50
    assert max(fast) <= 150 < max(slow) <= 600
