"""The placement planner: admission arithmetic, choices, pins, typed failures, properties."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from skulk.cluster import (
    ModelNeeds,
    NoCandidateNodes,
    NoComputePort,
    NodeCapacity,
    NotEnoughMemory,
    PlacementInfoPending,
    PlacementPolicy,
    PlacementRequest,
    Plan,
    UnknownModel,
    UnsupportedSharding,
    plan,
)
from skulk.wire.telemetry import ComputePorts

GIB = 1 << 30
NO_SLACK = PlacementPolicy(overhead=1.0, floor_bytes=0)
M = ModelNeeds("m", 8 * GIB, 8, 1024, 0, family="llama", heads=8, kv_heads=8)
MODELS = {"m": M}


def ports(name: str, first: int = 53000, last: int = 53031, host: str = "") -> ComputePorts:
    return ComputePorts(host or f"10.0.0.{ord(name[-1]) % 250}", first, last)


def node(name: str, gib: float | None, up: bool = True) -> NodeCapacity:
    return NodeCapacity(name, up, None if gib is None else int(gib * GIB), ports(name))


def test_single_takes_the_node_with_most_free_memory_ties_by_id() -> None:
    got = plan(PlacementRequest("m"), MODELS, [node("b", 20), node("a", 20), node("c", 10)])
    assert isinstance(got, Plan)
    assert [(s.rank, s.node, s.layers) for s in got.shards] == [(0, "a", (0, 8))]


def test_admission_counts_overhead_kv_and_floor_and_refuses_an_exact_fit() -> None:
    needs = ModelNeeds("m", 1000, 2, 10, 3, "llama", 4, 4)
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
        st.one_of(
            st.none(),
            st.builds(
                ComputePorts,
                st.sampled_from(["h1", "h2", "::1"]),
                st.just(7000),
                st.integers(7000, 7003),
            ),
        ),
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


taken_strategy = st.frozensets(
    st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(["h1", "h2", "[::1]"]),
              st.integers(7000, 7003)),
    max_size=6,
)  # fmt: skip


@given(requests, nodes_strategy, taken_strategy)
def test_plans_are_deterministic_admitted_and_well_formed(
    request: PlacementRequest, nodes: list[NodeCapacity], taken: frozenset[str]
) -> None:
    got = plan(request, MODELS, nodes, taken=taken)
    # order of input is irrelevant
    assert got == plan(request, MODELS, list(reversed(nodes)), taken=taken)
    if not isinstance(got, Plan):
        return
    by_id = {n.node: n for n in nodes}
    used = [s.node for s in got.shards]
    assert len(set(used)) == len(used)
    addresses = [s.address for s in got.shards]
    if request.sharding == "single":
        assert addresses == [""]
    else:
        assert all(addresses) and len(set(addresses)) == len(addresses)
        assert not set(addresses) & taken
    for s in got.shards:
        cap = by_id[s.node]
        assert cap.up and s.node not in request.excluded_nodes
        assert cap.available_bytes is not None and s.need_bytes < cap.available_bytes
        assert not request.nodes or s.node in request.nodes
        if s.address:
            assert cap.compute is not None
            host, _, port = s.address.rpartition(":")
            assert host.strip("[]") == cap.compute.host
            assert cap.compute.first_port <= int(port) <= cap.compute.last_port
    assert [s.rank for s in got.shards] == list(range(len(used)))
    if request.sharding == "single":
        assert len(used) == 1
    else:
        assert request.min_nodes <= len(used) <= (request.max_nodes or len(used))
    if request.sharding == "tensor":
        assert M.heads % len(used) == 0 and M.kv_heads % len(used) == 0
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
        addresses_in_use,
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
        UpsertNode("c", "127.0.0.2:3", "127.0.0.2:4", at=1),
        NodeStatusChanged("b", "down", at=2),
        RegisterModel(card),
    ):
        state, result = apply(state, command)
        assert isinstance(result, Applied), result
    needs = model_needs(card)
    assert needs.kv_bytes_per_token == 2 * 4 * 2 * 16 * 2  # K and V, layers, kv heads, head dim
    policy = PlacementPolicy.from_config(state.config)
    compute = {
        "a": ComputePorts("127.0.0.1", 9000, 9001),
        "c": ComputePorts("127.0.0.2", 9000, 9009),
    }
    nodes = node_capacities(state, {"a": 4 * GIB, "b": 64 * GIB, "c": 2 * GIB}, compute)
    got = plan(PlacementRequest("demo", "pipeline", min_nodes=1), {"demo": needs}, nodes, policy)
    assert isinstance(got, Plan) and [s.node for s in got.shards] == ["a", "c"]  # b is down
    state, result = apply(state, got.command("i1", at=3))
    assert isinstance(result, Applied), result
    assert [i.id for i in state.instances] == ["i1"]
    assert state.instances[0].shards[0].address == "127.0.0.1:9000"
    # The next plan does not reuse the address the State holds.
    again = plan(PlacementRequest("demo", "pipeline"), {"demo": needs}, nodes, policy,
                 addresses_in_use(state))  # fmt: skip
    assert isinstance(again, Plan) and again.shards[0].address == "127.0.0.1:9001"
    state, result = apply(state, again.command("i2", at=4))
    assert isinstance(result, Applied), result
    full = plan(PlacementRequest("demo", "pipeline"), {"demo": needs}, nodes, policy,
                addresses_in_use(state))  # fmt: skip
    assert full == NoComputePort("a", 9000, 9001)


# ---- sharding rules and compute addresses ------------------------------------------------------

TENSOR_OK = PlacementPolicy(overhead=1.0, floor_bytes=0, tensor_families=frozenset({"llama"}))


def test_tensor_refuses_a_family_without_shard_naming_it() -> None:
    gemma = ModelNeeds("g", 8 * GIB, 8, 1024, 0, family="gemma", heads=8, kv_heads=8)
    nodes = [node("a", 5), node("b", 5)]
    got = plan(PlacementRequest("g", "tensor", min_nodes=2), {"g": gemma}, nodes, TENSOR_OK)
    assert isinstance(got, UnsupportedSharding) and got.code == "unsupported_sharding"
    assert "'gemma'" in got.reason
    # A pipeline slices layers generically: any family.
    piped = plan(PlacementRequest("g", "pipeline", min_nodes=2), {"g": gemma}, nodes, TENSOR_OK)
    assert isinstance(piped, Plan) and len(piped.shards) == 2


def test_tensor_skips_counts_that_do_not_divide_the_heads() -> None:
    needs = ModelNeeds("t", 12 * GIB, 8, 1024, 0, family="llama", heads=8, kv_heads=4)
    nodes = [node(n, 3.5) for n in "abcd"]  # 3 nodes would fit by memory, 3 does not divide 4
    got = plan(PlacementRequest("t", "tensor", min_nodes=3), {"t": needs}, nodes, TENSOR_OK)
    assert isinstance(got, Plan) and len(got.shards) == 4
    assert all(s.layers == (0, 8) for s in got.shards)


def test_tensor_with_no_count_that_divides_refuses_with_the_arithmetic() -> None:
    needs = ModelNeeds("t", 8 * GIB, 8, 1024, 0, family="llama", heads=42, kv_heads=14)
    nodes = [node(n, 20) for n in "abc"]
    request = PlacementRequest("t", "tensor", min_nodes=3, max_nodes=3)
    got = plan(request, {"t": needs}, nodes, TENSOR_OK)
    assert isinstance(got, UnsupportedSharding)
    assert "14 kv heads do not divide over 3 ranks" in got.reason
    assert "42 heads" not in got.reason  # 42 divides over 3
    wide = plan(PlacementRequest("t", "tensor", min_nodes=3), {"t": needs},
                [node(n, 20) for n in "abcdefghij"], TENSOR_OK)  # fmt: skip
    # 3..10 ranks: 7 divides both (42, 14), so that is the plan.
    assert isinstance(wide, Plan) and len(wide.shards) == 7
    many = ModelNeeds("t", 8 * GIB, 8, 1024, 0, family="llama", heads=11, kv_heads=11)
    refused = plan(PlacementRequest("t", "tensor", min_nodes=2), {"t": many},
                   [node(n, 20) for n in "abcdefghij"], TENSOR_OK)  # fmt: skip
    assert isinstance(refused, UnsupportedSharding)
    assert "11 heads and 11 kv heads do not divide over 2 ranks" in refused.reason
    assert "nor over 6..10 ranks" in refused.reason


def test_a_pipeline_has_at_most_one_rank_per_layer() -> None:
    got = plan(PlacementRequest("m", "pipeline", min_nodes=9), MODELS,
               [node(f"n{i}", 20) for i in range(10)])  # fmt: skip
    assert isinstance(got, UnsupportedSharding)
    assert "8 layers do not split over 9 ranks" in got.reason
    capped = plan(PlacementRequest("m", "pipeline", min_nodes=2), MODELS,
                  [node(f"n{i}", 1.1) for i in range(10)], NO_SLACK)  # fmt: skip
    assert isinstance(capped, Plan) and len(capped.shards) == 8


def test_ranks_get_the_lowest_free_port_of_their_node_distinct_per_host() -> None:
    shared = [
        NodeCapacity("a", True, 5 * GIB, ComputePorts("10.0.0.9", 7000, 7010)),
        NodeCapacity("b", True, 5 * GIB, ComputePorts("10.0.0.9", 7000, 7010)),
        NodeCapacity("c", True, 4 * GIB, ComputePorts("::1", 7000, 7010)),
    ]
    got = plan(PlacementRequest("m", "pipeline", min_nodes=3), MODELS, shared, NO_SLACK,
               taken={"10.0.0.9:7000", "[::1]:7000", "10.0.0.8:7001"})  # fmt: skip
    assert isinstance(got, Plan)
    assert [(s.node, s.address) for s in got.shards] == [
        ("a", "10.0.0.9:7001"), ("b", "10.0.0.9:7002"), ("c", "[::1]:7001")
    ]  # fmt: skip
    small = ModelNeeds("s", GIB, 8, 1024, 0, family="llama", heads=8, kv_heads=8)
    single = plan(PlacementRequest("s"), {"s": small}, shared, NO_SLACK)
    assert isinstance(single, Plan) and single.shards[0].address == ""


def test_compute_ports_pending_taken_or_exhausted() -> None:
    bare = [NodeCapacity("a", True, 5 * GIB), NodeCapacity("b", True, 5 * GIB)]
    # single needs no compute address; pipeline and tensor wait for the ports.
    assert isinstance(plan(PlacementRequest("m"), MODELS, [NodeCapacity("a", True, 20 * GIB)]),
                      Plan)  # fmt: skip
    pending = plan(PlacementRequest("m", "pipeline"), MODELS, bare, NO_SLACK)
    assert pending == PlacementInfoPending(("a", "b"))
    two = [
        NodeCapacity("a", True, 20 * GIB, ComputePorts("h", 7000, 7000)),
        NodeCapacity("b", True, 10 * GIB, ComputePorts("g", 7000, 7009)),
    ]
    assert plan(PlacementRequest("m", "tensor"), MODELS, two, taken={"h:7000"}) == NoComputePort(
        "a", 7000, 7000
    )
    # A sharded instance has two ranks at least: one node is not enough, whatever it has.
    one = two[:1]
    assert isinstance(plan(PlacementRequest("m", "pipeline", min_nodes=1), MODELS, one),
                      NoCandidateNodes)  # fmt: skip
    # Two nodes behind one host with one port between them: the second rank finds none.
    crowded = [
        NodeCapacity("a", True, 5 * GIB, ComputePorts("h", 7000, 7000)),
        NodeCapacity("b", True, 5 * GIB, ComputePorts("h", 7000, 7000)),
    ]
    got = plan(PlacementRequest("m", "pipeline", min_nodes=2), MODELS, crowded, NO_SLACK)
    assert got == NoComputePort("b", 7000, 7000)
