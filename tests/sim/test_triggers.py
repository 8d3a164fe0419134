"""Triggered actions: armed by the clock, fired by what the cluster does."""

from __future__ import annotations

import pytest

from skulk.sim import Action, SimConfig
from skulk.sim._run import build_world, result_of
from skulk.sim._triggers import Triggers


def armed(*actions: Action) -> Triggers:
    t = Triggers()
    for a in actions:
        t.arm(a)
    return t


def test_an_event_binds_the_leader_and_schedules_after_it() -> None:
    t = armed(
        Action(5, "isolate", node="@leader", on="elected", after=2),
        Action(5, "rejoin", node="@leader", on="elected", after=40),
    )
    assert t.waiting and t.due(100) == []
    t.fire("proposed", "n1", 10)  # not what they wait for
    t.fire("elected", "n3", 20)
    assert not t.waiting
    assert t.due(21) == []
    assert t.due(22) == [Action(22, "isolate", node="n3")]
    assert t.due(59) == [] and t.due(60) == [Action(60, "rejoin", node="n3")]
    assert t.statistics().fired == 2


def test_faults_armed_one_after_the_other_hit_successive_events() -> None:
    t = armed(
        Action(5, "crash", node="@leader", on="elected", after=1),
        Action(5, "restart", node="@leader", on="elected", after=9),
        Action(7, "isolate", node="@leader", on="elected", after=1),
    )
    t.fire("elected", "n1", 10)
    t.fire("elected", "n2", 30)
    assert t.due(100) == [
        Action(11, "crash", node="n1"),
        Action(19, "restart", node="n1"),
        Action(31, "isolate", node="n2"),
    ]


def test_observe_leader_reports_each_term_once_then_its_first_commit() -> None:
    t = Triggers()
    assert t.observe_leader("n1", term=2, commit=5, now=1) == "elected"
    assert t.observe_leader("n1", term=2, commit=5, now=2) is None
    assert t.observe_leader("n1", term=2, commit=7, now=3) == "first_commit"
    assert t.observe_leader("n1", term=2, commit=9, now=4) is None
    assert t.observe_leader("n2", term=3, commit=9, now=5) == "elected"
    assert t.observe_leader("n1", term=4, commit=9, now=6) == "elected"


def test_clear_drops_everything() -> None:
    t = armed(Action(1, "heal", on="proposed", after=3), Action(1, "heal", on="elected", after=1))
    t.fire("proposed", "n1", 2)
    t.clear()
    assert not t.waiting and t.due(1000) == []


def test_arm_refuses_an_untriggered_action() -> None:
    with pytest.raises(ValueError, match="not a triggered action"):
        Triggers().arm(Action(1, "heal"))


def test_in_a_run_the_new_leader_is_isolated_before_its_no_op_reaches_anyone() -> None:
    config = SimConfig(nodes=3, steps=200, faults=False, liveness=False, vary=False, clients=0)
    plan = [
        Action(0, "isolate", node="@leader", on="elected", after=1),
        Action(0, "rejoin", node="@leader", on="elected", after=500),  # after the run
    ]
    lines: list[str] = []
    world = build_world(1, config, plan=plan, trace_sink=lines.append)
    assert world.run() is None
    (isolated,) = [line for line in lines if "'isolate'" in line and "'on'" not in line]
    first = isolated.split("'node', '")[1].split("'")[0]
    core = world.nodes[first].core
    assert core is not None
    term = core.log.last_term  # its no-op's term: it never heard of a later one
    for nid, node in world.nodes.items():
        if nid != first:
            assert node.core is not None and node.core.term > term  # the others moved on
            assert term not in {e.term for e in node.core.log.slice(1, node.core.last_index)}
    assert dict(result_of(world).counters)["triggered"] == 1
