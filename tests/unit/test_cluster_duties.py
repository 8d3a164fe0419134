"""The leader's duties (``next_commands``): upserts, down verdicts, re-placement, give-up,
recovery and removal, driven through the real ``apply()`` so every command is one it accepts."""

from __future__ import annotations

import attrs

from skulk.cluster import LeaderView, Reachable, State, apply, next_commands
from skulk.wire.cluster import (
    Applied,
    Architecture,
    ClusterCommand,
    DemoSource,
    ModelCard,
    NodeStatusChanged,
    PlaceInstance,
    RegisterModel,
    Rejected,
    RemoveNode,
    ReportRunner,
    SetInstanceStatus,
    Shard,
    UpsertNode,
)

GIB = 1 << 30
CARD = ModelCard("m", DemoSource(1), Architecture("llama", 4, 64, 4, 4, 100), GIB, 128)
FREE = {"a": 8 * GIB, "b": 8 * GIB, "c": 8 * GIB}


def here(*nodes: str) -> dict[str, Reachable]:
    return {n: Reachable(f"http://{n}", f"ws://{n}") for n in nodes}


def run(state: State, commands: list[ClusterCommand]) -> State:
    for command in commands:
        state, result = apply(state, command)
        assert result == Applied(), (command, result)
    return state


def cluster() -> State:
    """Nodes a, b, c up; model m; instance i0 on b."""
    state = run(State(), [UpsertNode(n, f"http://{n}", f"ws://{n}", 0) for n in "abc"])
    return run(state, [RegisterModel(CARD), PlaceInstance("i0", "m", "single",
                                                          (Shard(0, "b", 0, 4),), 0)])  # fmt: skip


def test_reachable_nodes_are_upserted_once_and_when_addresses_change() -> None:
    view = LeaderView(here("a", "b"), {}, FREE)
    commands = next_commands(State(), view, 7, iter(()))
    assert commands == [
        UpsertNode("a", "http://a", "ws://a", 7),
        UpsertNode("b", "http://b", "ws://b", 7),
    ]
    state = run(State(), commands)
    assert next_commands(state, view, 8, iter(())) == []
    moved = LeaderView({"a": Reachable("http://a2", "ws://a")}, {}, FREE)
    assert next_commands(state, moved, 9, iter(())) == [UpsertNode("a", "http://a2", "ws://a", 9)]


def test_a_node_unreachable_long_enough_goes_down_and_its_instance_moves() -> None:
    state = cluster()
    early = LeaderView(here("a", "c"), {"b": 4999}, FREE)
    assert next_commands(state, early, 10, iter(())) == []
    late = LeaderView(here("a", "c"), {"b": 5000}, FREE)
    commands = next_commands(state, late, 11, iter(["i1"]))
    assert commands[0] == NodeStatusChanged("b", "down", 11)
    (place,) = commands[1:]
    assert isinstance(place, PlaceInstance) and place.shards[0].node in {"a", "c"}
    assert place.replaces == "i0"
    state = run(state, commands)
    assert [i.id for i in state.instances] == ["i1"]
    # Committed twice (a retry, a late commit): the second is refused, no second instance.
    _, again = apply(state, attrs.evolve(place, instance="i9"))
    assert isinstance(again, Rejected) and again.reason == "unknown_instance"


def test_a_failed_runner_moves_the_instance_away_from_its_node() -> None:
    state = run(cluster(), [ReportRunner("i0", 0, "b", "failed", "crash_loop", 5)])
    view = LeaderView(here("a", "b", "c"), {}, FREE)
    commands = next_commands(state, view, 12, iter(["i1"]))
    (place,) = commands
    assert isinstance(place, PlaceInstance) and place.shards[0].node != "b"
    assert place.replaces == "i0"


def test_no_node_left_marks_the_instance_failed_and_it_recovers_when_its_runner_does() -> None:
    state = run(cluster(), [ReportRunner("i0", 0, "b", "failed", "crash_loop", 5)])
    avoid = {"m": frozenset({"a", "c"})}
    view = LeaderView(here("a", "b", "c"), {}, FREE, avoid)
    commands = next_commands(state, view, 13, iter(["i1"]))
    assert commands == [SetInstanceStatus("i0", "failed", 13)]
    state = run(state, commands)
    assert next_commands(state, view, 14, iter(["i1"])) == []  # no endless relaunch loop
    state = run(state, [ReportRunner("i0", 0, "b", "ready", None, 15)])
    assert next_commands(state, view, 16, iter(())) == [SetInstanceStatus("i0", "placed", 16)]


def test_a_failed_instance_is_placed_again_when_a_node_can_take_it() -> None:
    state = run(cluster(), [ReportRunner("i0", 0, "b", "failed", "crash_loop", 5),
                            SetInstanceStatus("i0", "failed", 6)])  # fmt: skip
    view = LeaderView(here("a", "b", "c"), {}, FREE, {"m": frozenset({"c"})})
    commands = next_commands(state, view, 17, iter(["i2"]))
    place = commands[0]
    assert isinstance(place, PlaceInstance) and place.shards[0].node == "a"


def test_moves_in_one_round_share_the_free_memory() -> None:
    state = run(cluster(), [PlaceInstance("j0", "m", "single", (Shard(0, "b", 0, 4),), 0),
                            NodeStatusChanged("b", "down", 1)])  # fmt: skip
    # a can take one copy (1.2 GiB + floor), not two; c has room for one too.
    free = {"a": 2 * GIB, "c": 2 * GIB}
    commands = next_commands(state, LeaderView(here("a", "c"), {}, free), 30, iter(["x", "y"]))
    nodes = [c.shards[0].node for c in commands if isinstance(c, PlaceInstance)]
    assert sorted(nodes) == ["a", "c"]


def test_a_down_node_is_removed_only_when_empty_and_after_the_remove_delay() -> None:
    state = run(cluster(), [NodeStatusChanged("c", "down", 1)])
    view = LeaderView(here("a", "b"), {"c": 599_999}, FREE)
    assert next_commands(state, view, 18, iter(())) == []
    view = LeaderView(here("a", "b"), {"c": 600_000}, FREE)
    assert next_commands(state, view, 19, iter(())) == [RemoveNode("c")]
    # b is down and holds i0: it is moved first, never removed while holding it.
    state = run(state, [NodeStatusChanged("b", "down", 2)])
    view = LeaderView(here("a"), {"b": 700_000, "c": 700_000}, FREE)
    commands = next_commands(state, view, 20, iter(["i1"]))
    assert RemoveNode("b") not in commands and RemoveNode("c") in commands


def test_a_node_that_comes_back_is_up_again() -> None:
    state = run(cluster(), [NodeStatusChanged("c", "down", 1)])
    view = LeaderView(here("a", "b", "c"), {}, FREE)
    assert next_commands(state, view, 21, iter(())) == [UpsertNode("c", "http://c", "ws://c", 21)]
