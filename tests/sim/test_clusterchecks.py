"""The cluster State oracles and the command mix the simulated leaders propose.

The oracles must hold for the real ``apply`` over thousands of generated commands, and fail
-- each with its own name -- on a State or a transition that breaks ``specs/cluster.md``."""

from __future__ import annotations

import random
from collections import Counter

import attrs

from skulk.cluster import State, apply
from skulk.sim._clusterchecks import state_problem, transition_problem
from skulk.sim._commands import EPOCH_MS, TICK_MS, CommandMaker
from skulk.wire.cluster import (
    Applied,
    Architecture,
    DeleteInstance,
    DemoSource,
    ModelCard,
    NodeStatusChanged,
    PlaceInstance,
    RegisterModel,
    Rejected,
    ReportRunner,
    Shard,
    UpsertNode,
)

NODES = ("n1", "n2", "n3")
CARD = ModelCard("m", DemoSource(1), Architecture("llama", 4, 8, 2, 1, 16), 100, 64)


def built() -> State:
    """n1, n2 up, n3 down; model m; instance i on n1+n2 (pipeline)."""
    state = State()
    for cmd in (
        *(UpsertNode(n, "a", "f", 1) for n in NODES),
        NodeStatusChanged("n3", "down", 2),
        RegisterModel(CARD),
        PlaceInstance(
            "i", "m", "pipeline", (Shard(0, "n1", 0, 2, "h:1"), Shard(1, "n2", 2, 4, "h:2")), 3
        ),
    ):
        state, result = apply(state, cmd)
        assert result == Applied(), cmd
    return state


def test_the_real_apply_passes_every_oracle_over_a_generated_mix() -> None:
    maker = CommandMaker(random.Random(5), NODES, running=lambda n: n != "n3")
    state = State()
    outcomes: Counter[str] = Counter()
    for seq in range(1, 3001):
        command = maker.make(state, NODES[seq % 3], "c", seq, now=seq)
        after, result = apply(state, command)
        assert transition_problem(state, after, command, result) is None, command
        outcomes[
            f"{type(command).__name__}:"
            + (result.reason if isinstance(result, Rejected) else "applied")
        ] += 1
        state = after
    # a realistic mix: every kind applies, and the interesting rejections happen
    kinds = {k.split(":")[0] for k in outcomes if k.endswith(":applied")}
    assert len(kinds) == 9, outcomes
    for key in (
        "PlaceInstance:node_not_up",
        "PlaceInstance:unknown_model",
        "PlaceInstance:duplicate_instance",
        "PlaceInstance:bad_layers",
        "PlaceInstance:bad_shards",
        "DeleteInstance:unknown_instance",
        "ReportRunner:wrong_node",
        "ReportRunner:unknown_rank",
        "RemoveNode:node_in_use",
        "RegisterModel:model_in_use",
    ):
        assert outcomes[key] > 0, (key, outcomes)
    assert outcomes["PlaceInstance:applied"] > 2 * outcomes["PlaceInstance:node_not_up"]


def test_timestamps_are_the_proposing_leaders_clock() -> None:
    maker = CommandMaker(random.Random(1), NODES, running=lambda n: True)
    stamps = {
        node: maker.make(State(), node, "c", 1, now=100).at  # type: ignore[union-attr]
        for node in NODES
    }
    for node, at in stamps.items():
        assert at == maker.clock(node, 100)
        assert abs(at - (EPOCH_MS + 100 * TICK_MS)) <= 40


def test_rejected_changed_state() -> None:
    state = built()
    command = ReportRunner("i", 0, "n2", "ready", None, 9)
    same, result = apply(state, command)
    assert isinstance(result, Rejected) and result.reason == "wrong_node"
    assert transition_problem(state, same, command, result) is None
    changed = attrs.evolve(state, runners=state.runners[1:])
    assert transition_problem(state, changed, command, result) == (
        "rejected_changed_state",
        "Rejected(wrong_node) ReportRunner changed the State",
    )


def test_placed_on_unavailable_node() -> None:
    state = built()
    command = PlaceInstance("j", "m", "single", (Shard(0, "n3", 0, 4),), 9)
    _, result = apply(state, command)
    assert isinstance(result, Rejected) and result.reason == "node_not_up"
    # what an apply that forgot to check would have committed
    everyone_up = attrs.evolve(
        state, nodes=tuple(attrs.evolve(n, status="up") for n in state.nodes)
    )
    wrong, result = apply(everyone_up, command)
    wrong = attrs.evolve(wrong, nodes=state.nodes)
    name, detail = transition_problem(state, wrong, command, result) or ("", "")
    assert name == "placed_on_unavailable_node" and "'n3', which was down" in detail
    left = attrs.evolve(state, nodes=tuple(attrs.evolve(n, status="left") for n in state.nodes))
    name, detail = transition_problem(left, wrong, command, result) or ("", "")
    assert name == "placed_on_unavailable_node" and "was left" in detail


def test_placement_discipline() -> None:
    state = built()
    command = DeleteInstance("nothing")
    inst = state.instances[0]
    moved = attrs.evolve(inst, shards=(Shard(0, "n2", 0, 2), Shard(1, "n1", 2, 4)))
    rewritten = attrs.evolve(state, instances=(moved,))
    name, _ = transition_problem(state, rewritten, command, Applied()) or ("", "")
    assert name == "placement_discipline"
    appeared = attrs.evolve(state, instances=(*state.instances, attrs.evolve(inst, id="k")))
    name, detail = transition_problem(state, appeared, command, Applied()) or ("", "")
    assert name == "placement_discipline" and "appeared through DeleteInstance" in detail


def test_runner_records() -> None:
    state = built()
    command = DeleteInstance("i")
    after, result = apply(state, command)
    assert transition_problem(state, after, command, result) is None
    kept = attrs.evolve(after, runners=state.runners)  # runners outlive their instance
    name, detail = transition_problem(state, kept, command, result) or ("", "")
    assert name == "runner_records" and "('i', 0) has no instance" in detail
    runner = state.runners[0]
    elsewhere = attrs.evolve(state, runners=(attrs.evolve(runner, node="n3"), state.runners[1]))
    assert state_problem(elsewhere) == (
        "runner_records",
        "runner ('i', 0) on 'n3', its shard is on 'n1'",
    )
    assert state_problem(attrs.evolve(state, runners=state.runners[:1])) == (
        "runner_records",
        "no runner record for [('i', 1)]",
    )
    extra = attrs.evolve(runner, rank=2)
    name, _ = state_problem(attrs.evolve(state, runners=(*state.runners, extra))) or ("", "")
    assert name == "runner_records"


def test_state_shape() -> None:
    state = built()
    assert state_problem(state) is None
    unsorted = attrs.evolve(state, nodes=tuple(reversed(state.nodes)))
    assert (state_problem(unsorted) or ("",))[0] == "state_shape"
    no_model = attrs.evolve(state, models=())
    assert (state_problem(no_model) or ("",))[0] == "state_shape"
    inst = state.instances[0]
    gap = attrs.evolve(inst, shards=(Shard(0, "n1", 0, 2), Shard(1, "n2", 3, 4)))
    detail = (state_problem(attrs.evolve(state, instances=(gap,))) or ("", ""))[1]
    assert "holds layers [(0, 2), (3, 4)] of 4" in detail
    gone = attrs.evolve(state, nodes=state.nodes[1:])
    assert "unknown nodes ['n1']" in (state_problem(gone) or ("", ""))[1]
