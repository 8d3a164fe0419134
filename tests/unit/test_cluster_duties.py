"""The leader's duties (``next_commands``): upserts, down verdicts, re-placement, give-up,
recovery and removal, driven through the real ``apply()`` so every command is one it accepts."""

from __future__ import annotations

from typing import Any

import attrs

from skulk.cluster import LeaderView, Reachable, State, apply, culprit_nodes, next_commands
from skulk.cluster._duties import CULPRIT_WAIT_MS
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
    Sharding,
    UpsertNode,
)
from skulk.wire.telemetry import ComputePorts

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


# ---- pipeline and tensor instances: re-placed whole -------------------------------------------

PORTS = {n: ComputePorts(f"10.0.0.{i}", 7000, 7007) for i, n in enumerate("abcd")}


def distributed(sharding: Sharding = "pipeline") -> State:
    """Nodes a, b, c, d up; model m; instance p0 of two ranks on a and b."""
    state = run(State(), [UpsertNode(n, f"http://{n}", f"ws://{n}", 0) for n in "abcd"])
    ranges = [(0, 2), (2, 4)] if sharding == "pipeline" else [(0, 4), (0, 4)]
    shards = tuple(Shard(r, node, *ranges[r], f"10.0.0.{r}:7000") for r, node in enumerate("ab"))
    return run(state, [RegisterModel(CARD), PlaceInstance("p0", "m", sharding, shards, 0)])


def view(free: dict[str, int] | None = None, **kwargs: Any) -> LeaderView:
    return LeaderView(here("a", "b", "c", "d"), {}, free or dict.fromkeys("abcd", 8 * GIB),
                      compute=PORTS, **kwargs)  # fmt: skip


def replace_once(
    state: State, v: LeaderView, fresh: str = "p1", now: int = 50
) -> tuple[PlaceInstance, State]:
    """The one command the duties give at ``now`` (a whole re-placement), applied."""
    (move,) = next_commands(state, v, now, iter([fresh]))
    assert isinstance(move, PlaceInstance) and move.replaces == "p0"
    return move, run(state, [move])


def nodes_of(move: PlaceInstance) -> list[str]:
    return sorted(s.node for s in move.shards)


def test_a_one_off_crash_re_places_the_whole_instance_on_the_same_nodes() -> None:
    state = run(distributed(), [ReportRunner("p0", 1, "b", "failed", "runner_crashed", 5)])
    assert culprit_nodes(state, state.instances[0]) == frozenset({"b"})
    move, after = replace_once(state, view())
    assert move.sharding == "pipeline" and len(move.shards) == 2
    assert nodes_of(move) == ["a", "b"]  # the freed memory makes them the roomiest again
    old = {s.address for s in state.instances[0].shards}
    new = [s.address for s in move.shards]
    assert all(new) and len(set(new)) == 2 and not old & set(new)  # fresh addresses
    assert [i.id for i in after.instances] == ["p1"]
    assert [(r.rank, r.phase) for r in after.runners] == [(0, "pending"), (1, "pending")]


def test_a_culprit_with_a_strike_already_is_avoided() -> None:
    state = run(distributed(), [ReportRunner("p0", 1, "b", "failed", "group_not_joined", 5)])
    move, _ = replace_once(state, view(strikes={"m": {"b": 1}}))
    assert "b" not in nodes_of(move) and "a" in nodes_of(move)
    # Two strikes avoid a node even when it is not to blame this time.
    state = run(distributed(), [ReportRunner("p0", 0, "a", "failed", "wedged", 5)])
    move, _ = replace_once(state, view(strikes={"m": {"b": 2}}))
    assert "b" not in nodes_of(move)


def test_victims_are_not_culprits() -> None:
    state = run(distributed(), [
        ReportRunner("p0", 0, "a", "failed", "collective_timeout", 5),
        ReportRunner("p0", 1, "b", "failed", "load_error", 6),
    ])  # fmt: skip
    assert culprit_nodes(state, state.instances[0]) == frozenset({"b"})
    move, _ = replace_once(state, view(strikes={"m": {"a": 1, "b": 1}}))
    assert "a" in nodes_of(move) and "b" not in nodes_of(move)
    # A crash seen from the other rank: its peer's connection dropped. Only the crash counts.
    state = run(distributed(), [
        ReportRunner("p0", 0, "a", "failed", "collective_failed", 5),
        ReportRunner("p0", 1, "b", "failed", "runner_crashed", 6),
    ])  # fmt: skip
    assert culprit_nodes(state, state.instances[0]) == frozenset({"b"})
    # Every rank a victim (the group never formed, say): nobody is to blame, same nodes.
    state = run(distributed(), [
        ReportRunner("p0", 0, "a", "failed", "group_connect_timeout", 5),
        ReportRunner("p0", 1, "b", "failed", "group_connect_timeout", 6),
    ])  # fmt: skip
    assert culprit_nodes(state, state.instances[0]) == frozenset()
    # Only victims have spoken: the culprit's own report is waited for, a while.
    seen = {"p0": CULPRIT_WAIT_MS - 1}  # for how long the leader has seen them (monotonic)
    assert next_commands(state, view(failed_for_ms=seen), 5, iter(["p1"])) == []
    waited = view(strikes={"m": {"a": 1, "b": 1}}, failed_for_ms={"p0": CULPRIT_WAIT_MS})
    move, _ = replace_once(state, waited)
    assert nodes_of(move) == ["a", "b"]


def test_the_culprit_wait_runs_on_the_leaders_monotonic_clock_not_the_stamps() -> None:
    """Stamps from a leader whose wall clock ran an hour ahead (or a wall clock that jumped
    back) must not hold a re-placement for an hour; nor may one from a clock behind end the
    wait early."""
    hour = 3_600_000
    state = run(distributed(), [
        ReportRunner("p0", 0, "a", "failed", "group_connect_timeout", 10 * hour),
        ReportRunner("p0", 1, "b", "failed", "group_connect_timeout", 10 * hour),
    ])  # fmt: skip
    waited = view(failed_for_ms={"p0": CULPRIT_WAIT_MS})
    move, _ = replace_once(state, waited, now=9 * hour)  # this leader's clock: an hour behind
    assert nodes_of(move) == ["a", "b"]
    just_now = view(failed_for_ms={"p0": 0})
    assert next_commands(state, just_now, 11 * hour, iter(["p1"])) == []  # clock an hour ahead


def test_a_culprits_late_report_is_waited_for_and_blamed() -> None:
    state = run(distributed(), [ReportRunner("p0", 0, "a", "failed", "group_connect_timeout", 5)])
    assert next_commands(state, view(), 1000, iter(["p1"])) == []  # victim only, just now
    state = run(state, [ReportRunner("p0", 1, "b", "failed", "group_not_joined", 900)])
    move, _ = replace_once(state, view(strikes={"m": {"b": 1}}), now=1000)  # at once: blamed
    assert "b" not in nodes_of(move)


def test_a_down_node_is_a_culprit_and_the_instance_moves_off_it() -> None:
    state = distributed()
    late = LeaderView(here("a", "c", "d"), {"b": 5000}, dict.fromkeys("acd", 8 * GIB),
                      compute=PORTS)  # fmt: skip
    commands = next_commands(state, late, 60, iter(["p1"]))
    assert commands[0] == NodeStatusChanged("b", "down", 60)
    move = commands[1]
    assert isinstance(move, PlaceInstance) and move.replaces == "p0"
    assert "b" not in nodes_of(move) and len(move.shards) == 2
    assert culprit_nodes(state, state.instances[0], down={"b"}) == frozenset({"b"})
    run(state, commands)


def test_the_replaced_instance_memory_counts_as_free_on_its_nodes() -> None:
    state = run(distributed(), [ReportRunner("p0", 1, "b", "failed", "runner_crashed", 5)])
    # A rank needs 0.6 GiB + the 512 MiB floor (+ a little KV); a and b show 0.75 GiB free
    # beside the 0.5 GiB of weights p0 holds on each; c and d have too little.
    free = {"a": 3 * GIB // 4, "b": 3 * GIB // 4, "c": GIB // 4, "d": GIB // 4}
    move, _ = replace_once(state, view(free))
    assert nodes_of(move) == ["a", "b"]


def test_a_distributed_instance_with_nowhere_to_go_is_marked_failed() -> None:
    state = run(distributed(), [ReportRunner("p0", 1, "b", "failed", "runner_crashed", 5)])
    tiny = dict.fromkeys("abcd", GIB // 8)
    assert next_commands(state, view(tiny), 70, iter(["p1"])) == [
        SetInstanceStatus("p0", "failed", 70)
    ]
    # No compute ports advertised yet: no plan either (and no instance with empty addresses).
    bare = LeaderView(here("a", "b", "c", "d"), {}, dict.fromkeys("abcd", 8 * GIB))
    assert next_commands(state, bare, 71, iter(["p1"])) == [SetInstanceStatus("p0", "failed", 71)]


def test_tensor_instances_are_re_placed_with_their_rank_count_and_family_check() -> None:
    state = run(distributed("tensor"), [ReportRunner("p0", 0, "a", "failed", "wedged", 5)])
    move, _ = replace_once(state, view(tensor_families=frozenset({"llama"})))
    assert move.sharding == "tensor" and [(s.start, s.end) for s in move.shards] == [(0, 4)] * 2
    refused = next_commands(state, view(tensor_families=frozenset()), 80, iter(["p1"]))
    assert refused == [SetInstanceStatus("p0", "failed", 80)]


def test_moves_in_one_round_get_distinct_fresh_addresses() -> None:
    state = distributed()
    shards = (Shard(0, "c", 0, 2, "10.0.0.2:7000"), Shard(1, "d", 2, 4, "10.0.0.3:7000"))
    state = run(state, [PlaceInstance("q0", "m", "pipeline", shards, 0),
                        ReportRunner("p0", 0, "a", "failed", "runner_crashed", 5),
                        ReportRunner("q0", 1, "d", "failed", "runner_crashed", 5)])  # fmt: skip
    commands = next_commands(state, view(), 90, iter(["p1", "q1"]))
    moves = [c for c in commands if isinstance(c, PlaceInstance)]
    assert [m.replaces for m in moves] == ["p0", "q0"]
    addresses = [s.address for m in moves for s in m.shards]
    held = {s.address for i in state.instances for s in i.shards}
    assert len(set(addresses)) == 4 and not held & set(addresses)
    after = run(state, commands)
    assert sorted(i.id for i in after.instances) == ["p1", "q1"]


def test_a_model_the_runner_cannot_split_so_is_marked_failed_not_moved() -> None:
    state = run(distributed("tensor"), [
        ReportRunner("p0", 0, "a", "failed", "unsupported_sharding", 5),
    ])  # fmt: skip
    commands = next_commands(state, view(), 50, iter(["p1"]))
    assert commands == [SetInstanceStatus("p0", "failed", 50)]
    state = run(state, commands)
    assert next_commands(state, view(), 60, iter(["p1"])) == []  # and left so, no churn
