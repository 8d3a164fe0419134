"""The placement planner: admission arithmetic, choices, pins, typed failures, properties."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from skulk.cluster import (
    ModelNeeds,
    NoCandidateNodes,
    NodeCapacity,
    NotEnoughMemory,
    PlacementInfoPending,
    PlacementPolicy,
    PlacementRequest,
    Plan,
    UnknownModel,
    plan,
)

GIB = 1 << 30
NO_SLACK = PlacementPolicy(overhead=1.0, floor_bytes=0)
M = ModelNeeds("m", weight_bytes=8 * GIB, layers=8, context_length=1024, kv_bytes_per_token=0)
MODELS = {"m": M}


def node(name: str, gib: float | None, up: bool = True) -> NodeCapacity:
    return NodeCapacity(name, up, None if gib is None else int(gib * GIB))


def test_single_takes_the_node_with_most_free_memory_ties_by_id() -> None:
    got = plan(PlacementRequest("m"), MODELS, [node("b", 20), node("a", 20), node("c", 10)])
    assert isinstance(got, Plan)
    assert [(s.rank, s.node, s.layers) for s in got.shards] == [(0, "a", (0, 8))]


def test_admission_counts_overhead_kv_and_floor_and_refuses_an_exact_fit() -> None:
    needs = ModelNeeds("m", weight_bytes=1000, layers=2, context_length=10, kv_bytes_per_token=3)
    policy = PlacementPolicy(overhead=1.5, floor_bytes=100)
    need = 1500 + 30 + 100
    exact = plan(PlacementRequest("m"), {"m": needs}, [NodeCapacity("a", True, need)], policy)
    assert exact == NotEnoughMemory("a", need, need, 1)
    fits = plan(PlacementRequest("m"), {"m": needs}, [NodeCapacity("a", True, need + 1)], policy)
    assert isinstance(fits, Plan) and fits.shards[0].need_bytes == need


def test_pipeline_uses_the_fewest_nodes_and_splits_layers_by_memory() -> None:
    nodes = [node("a", 6), node("b", 3.5), node("c", 2)]
    got = plan(PlacementRequest("m", "pipeline"), MODELS, nodes, NO_SLACK)
    assert isinstance(got, Plan)
    # 8 GiB fits no single node; a (6) and b (3.5) split 8 layers about 2:1.
    assert [(s.node, s.layers) for s in got.shards] == [("a", (0, 5)), ("b", (5, 8))]


def test_tensor_gives_every_rank_all_layers_and_an_equal_share() -> None:
    got = plan(PlacementRequest("m", "tensor", min_nodes=2), MODELS,
               [node("a", 5), node("b", 5)], NO_SLACK)  # fmt: skip
    assert isinstance(got, Plan)
    assert [(s.node, s.layers, s.need_bytes) for s in got.shards] == [
        ("a", (0, 8), 4 * GIB), ("b", (0, 8), 4 * GIB)
    ]  # fmt: skip


def test_pins_and_exclusions() -> None:
    nodes = [node("a", 20), node("b", 15), node("c", 10)]
    pinned = plan(PlacementRequest("m", nodes=("c",)), MODELS, nodes)
    assert isinstance(pinned, Plan) and pinned.shards[0].node == "c"
    excluded = plan(PlacementRequest("m", excluded_nodes=("a",)), MODELS, nodes)
    assert isinstance(excluded, Plan) and excluded.shards[0].node == "b"
    assert isinstance(plan(PlacementRequest("m", nodes=("z",)), MODELS, nodes), NoCandidateNodes)
    everything = ("a", "b", "c")
    assert isinstance(
        plan(PlacementRequest("m", excluded_nodes=everything), MODELS, nodes), NoCandidateNodes
    )


def test_typed_failures() -> None:
    assert plan(PlacementRequest("x"), MODELS, [node("a", 20)]) == UnknownModel("x")
    assert isinstance(plan(PlacementRequest("m"), MODELS, [node("a", 20, up=False)]),
                      NoCandidateNodes)  # fmt: skip
    small = plan(PlacementRequest("m"), MODELS, [node("a", 4), node("b", 2)], NO_SLACK)
    assert small == NotEnoughMemory("a", 8 * GIB, 4 * GIB, 1)
    too_few = plan(PlacementRequest("m", "pipeline", min_nodes=3), MODELS, [node("a", 20)])
    assert isinstance(too_few, NoCandidateNodes)


def test_missing_telemetry_is_pending_only_when_nothing_known_fits() -> None:
    fits = plan(PlacementRequest("m"), MODELS, [node("a", 20), node("b", None)])
    assert isinstance(fits, Plan) and fits.shards[0].node == "a"
    pending = plan(PlacementRequest("m"), MODELS, [node("a", 1), node("b", None)])
    assert pending == PlacementInfoPending(("b",))


nodes_strategy = st.lists(
    st.builds(
        NodeCapacity,
        st.sampled_from([f"n{i:02d}" for i in range(12)]),
        st.booleans(),
        st.one_of(st.none(), st.integers(0, 64 * GIB)),
    ),
    max_size=12,
    unique_by=lambda n: n.node,
)
requests = st.builds(
    PlacementRequest,
    st.just("m"),
    st.sampled_from(["single", "pipeline", "tensor"]),
    st.lists(st.sampled_from([f"n{i:02d}" for i in range(12)]), max_size=3).map(tuple),
    st.lists(st.sampled_from([f"n{i:02d}" for i in range(12)]), max_size=3).map(tuple),
    st.integers(1, 4),
    st.one_of(st.none(), st.integers(1, 6)),
)


@given(requests, nodes_strategy)
def test_plans_are_deterministic_admitted_and_well_formed(
    request: PlacementRequest, nodes: list[NodeCapacity]
) -> None:
    got = plan(request, MODELS, nodes)
    assert got == plan(request, MODELS, list(reversed(nodes)))  # order of input is irrelevant
    if not isinstance(got, Plan):
        return
    by_id = {n.node: n for n in nodes}
    used = [s.node for s in got.shards]
    assert len(set(used)) == len(used)
    for s in got.shards:
        cap = by_id[s.node]
        assert cap.up and s.node not in request.excluded_nodes
        assert cap.available_bytes is not None and s.need_bytes < cap.available_bytes
        assert not request.nodes or s.node in request.nodes
    assert [s.rank for s in got.shards] == list(range(len(used)))
    if request.sharding == "single":
        assert len(used) == 1
    else:
        assert request.min_nodes <= len(used) <= (request.max_nodes or len(used))
    if request.sharding == "pipeline":
        ends = [s.layers for s in got.shards]
        assert ends[0][0] == 0 and ends[-1][1] == M.layers
        assert all(a[1] == b[0] and a[0] < a[1] for a, b in itertools.pairwise(ends))


def test_placement_benchmark_plans_every_case() -> None:
    from skulk.bench._placement import run

    result = run(nodes=30, repeats=2)
    assert result["single_ranks"] == 1
    assert isinstance(result["pipeline_ranks"], int) and result["pipeline_ranks"] > 1
    assert isinstance(result["tensor_ranks"], int) and result["tensor_ranks"] > 1
    assert "placement_100_nodes_ms" in result


def test_a_plan_from_state_is_a_command_apply_accepts() -> None:
    from skulk.cluster import (
        State,
        apply,
        model_needs,
        node_capacities,
    )
    from skulk.wire.cluster import (
        Applied,
        Architecture,
        DemoSource,
        ModelCard,
        NodeStatusChanged,
        RegisterModel,
        UpsertNode,
    )

    card = ModelCard("demo", DemoSource(0), Architecture("llama", 4, 64, 4, 2, 512), 10_000, 2048)
    state = State()
    for command in (
        UpsertNode("a", "127.0.0.1:1", "127.0.0.1:2", at=1),
        UpsertNode("b", "127.0.0.1:3", "127.0.0.1:4", at=1),
        NodeStatusChanged("b", "down", at=2),
        RegisterModel(card),
    ):
        state, result = apply(state, command)
        assert isinstance(result, Applied), result
    needs = model_needs(card)
    assert needs.kv_bytes_per_token == 2 * 4 * 2 * 16 * 2  # K and V, layers, kv heads, head dim
    policy = PlacementPolicy.from_config(state.config)
    nodes = node_capacities(state, {"a": 4 * GIB, "b": 64 * GIB})
    got = plan(PlacementRequest("demo", "pipeline", min_nodes=1), {"demo": needs}, nodes, policy)
    assert isinstance(got, Plan) and [s.node for s in got.shards] == ["a"]  # b is down
    state, result = apply(state, got.command("i1", at=3))
    assert isinstance(result, Applied), result
    assert [i.id for i in state.instances] == ["i1"]
