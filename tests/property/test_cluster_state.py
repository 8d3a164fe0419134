"""Properties of the cluster State's apply(): determinism, totality, snapshot round trips and
the invariants of specs/cluster.md, over random command sequences (valid and invalid)."""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from skulk.cluster import (
    KEYS_KEPT,
    ClusterMachine,
    State,
    apply,
    decode_result,
    encode_command,
    state_hash,
)
from skulk.wire.cluster import (
    Applied,
    Architecture,
    ClusterCommand,
    ClusterConfig,
    DeleteInstance,
    DemoSource,
    DownloadFailed,
    HubSource,
    ImportedSource,
    ModelCard,
    NodeStatusChanged,
    PathSource,
    PlaceInstance,
    RegisterModel,
    Rejected,
    ReleaseModel,
    RemoveNode,
    ReportRunner,
    SetConfig,
    SetInstanceStatus,
    Shard,
    StartDownload,
    UpsertNode,
)
from skulk.wire.raft import Entry, EntryKind

NODES = st.sampled_from(["n0", "n1", "n2", "n3", ""])
MODELS = st.sampled_from(["m0", "m1", "zz"])
INSTANCES = st.sampled_from(["i0", "i1", "i2", ""])
TIMES = st.integers(0, 10**6)
SMALL = st.integers(-1, 5)
KEYS = st.sampled_from([None, None, "k0", "k1", ""])


def _cards(dim: st.SearchStrategy[int]) -> st.SearchStrategy[ModelCard]:
    return st.builds(
        ModelCard,
        MODELS,
        st.one_of(
            st.builds(DemoSource, SMALL),
            st.builds(PathSource, st.just("/w")),
            st.builds(HubSource, st.just("org/m"), st.just("c" * 40)),
            st.builds(ImportedSource, st.just("/w")),
        ),
        st.builds(Architecture, st.just("llama"), dim, dim, dim, dim, dim),
        st.integers(-1, 10**9),
        dim,
    )


# Mostly valid cards (so that placements can succeed), sometimes ones with a bad dimension.
cards = st.one_of(_cards(st.integers(1, 4)), _cards(st.integers(1, 4)), _cards(SMALL))


@st.composite
def plans(draw: st.DrawFn, state: State) -> PlaceInstance:
    """A placement plan that is often valid in ``state`` and sometimes subtly not."""
    sharding = draw(st.sampled_from(["single", "pipeline", "tensor"]))
    known = [m.id for m in state.models]
    model = draw(st.sampled_from(known)) if known and draw(st.integers(0, 4)) else draw(MODELS)
    card = state.model(model)
    layers = card.architecture.layers if card is not None and draw(st.integers(0, 4)) else 3
    up = {node.id for node in state.nodes if node.status == "up"}
    everyone = {node.id for node in state.nodes} if draw(st.integers(0, 3)) == 0 else set()
    pool = sorted(up | everyone | {"n3"})
    n = 1 if sharding == "single" else draw(st.integers(1, 3))
    nodes = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n, unique=n <= len(pool)))
    if sharding == "pipeline":
        cuts = sorted(
            draw(st.lists(st.integers(0, max(layers, 0)), min_size=n - 1, max_size=n - 1))
        )
        bounds = [0, *cuts, layers]
        ranges = list(itertools.pairwise(bounds))
    else:
        ranges = [(0, layers)] * n
    ranks = list(range(n)) if draw(st.integers(0, 9)) else draw(st.permutations(range(n)))
    shards = tuple(
        Shard(r, node, s, e) for r, node, (s, e) in zip(ranks, nodes, ranges, strict=True)
    )
    instance = draw(st.sampled_from(["i0", "i1", "i2", "i3"]) | INSTANCES)
    return PlaceInstance(instance, model, sharding, shards, draw(TIMES), key=draw(KEYS))  # type: ignore[arg-type]


@st.composite
def reports(draw: st.DrawFn, state: State) -> ReportRunner:
    """A runner report, usually for an existing (instance, rank) from its own node."""
    phase = draw(st.sampled_from(["pending", "loading", "ready", "failed", "stopped"]))
    failure = draw(st.sampled_from([None, "crash_loop"]))
    if state.runners and draw(st.integers(0, 4)):
        runner = draw(st.sampled_from(state.runners))
        failure = "crash_loop" if phase == "failed" else None
        return ReportRunner(runner.instance, runner.rank, runner.node, phase, failure, draw(TIMES))  # type: ignore[arg-type]
    return ReportRunner(draw(INSTANCES), draw(SMALL), draw(NODES), phase, failure, draw(TIMES))  # type: ignore[arg-type]


def commands(state: State, *, wild: bool = True) -> st.SearchStrategy[ClusterCommand]:
    """Commands against ``state``: drawn from small id pools so they often hit, plus (if
    ``wild``) fully random ones from the wire types (any text, any int, even unencodable)."""
    pool = [
        st.builds(UpsertNode, NODES, st.just("a:1"), st.just("f:1"), TIMES),
        st.builds(NodeStatusChanged, NODES, st.sampled_from(["up", "down", "left"]), TIMES),
        st.builds(RemoveNode, NODES),
        st.builds(RegisterModel, cards),
        plans(state),
        plans(state),
        st.builds(DeleteInstance, INSTANCES, KEYS),
        st.builds(SetInstanceStatus, INSTANCES, st.sampled_from(["placed", "failed"]), TIMES),
        reports(state),
        st.builds(SetConfig, st.builds(ClusterConfig, floor_bytes=st.integers(-1, 10))),
        st.builds(ReleaseModel, MODELS, NODES),
        st.builds(StartDownload, MODELS, st.just("org/m"), st.just("c" * 40), NODES, SMALL, TIMES),
        st.builds(
            DownloadFailed, MODELS, NODES, st.sampled_from(["disk_full", ""]), st.just(""), TIMES
        ),
    ]
    if wild:
        pool.append(st.from_type(ClusterCommand))  # type: ignore[arg-type]
    return st.one_of(pool)


def check_invariants(state: State) -> None:
    for items, key in [
        (state.nodes, lambda x: x.id),
        (state.models, lambda x: x.id),
        (state.instances, lambda x: x.id),
        (state.runners, lambda x: (x.instance, x.rank)),
        (state.downloads, lambda x: (x.model, x.node)),
        (state.keys, lambda x: x.key),
    ]:
        keys = [key(i) for i in items]
        assert keys == sorted(set(keys)), "collections are sorted by a unique key"
    expected_runners = set()
    for instance in state.instances:
        card = state.model(instance.model)
        assert card is not None, "every instance's model is known"
        layers = card.architecture.layers
        assert [s.rank for s in instance.shards] == list(range(len(instance.shards)))
        ranges = [(s.start, s.end) for s in instance.shards]
        if instance.sharding == "pipeline":
            assert ranges[0][0] == 0 and ranges[-1][1] == layers
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
            assert all(s < e for s, e in ranges)
        else:
            assert all(r == (0, layers) for r in ranges)
        for shard in instance.shards:
            assert state.node(shard.node) is not None, "a node with shards is never removed"
            expected_runners.add((instance.id, shard.rank, shard.node))
    actual = {(r.instance, r.rank, r.node) for r in state.runners}
    assert actual == expected_runners, "one runner record per (instance, rank), on its node"
    running = [d.model for d in state.downloads if d.status == "downloading"]
    assert len(running) == len(set(running)), "at most one node downloads a model"
    for download in state.downloads:
        assert state.model(download.model) is None, "a model with a card downloads no more"
        assert state.node(download.node) is not None, "a removed node takes its downloads"
        assert (download.status == "failed") == (download.reason is not None)
    assert len(state.keys) <= KEYS_KEPT, "the State keeps a bounded number of keys"


def step(state: State, command: ClusterCommand) -> State:
    """Apply ``command`` checking determinism, rejection semantics and invariants."""
    new, result = apply(state, command)
    event(f"{type(command).__name__}: {getattr(result, 'reason', 'applied')}")
    again, result_again = apply(state, command)
    assert (again, result_again) == (new, result), "apply is deterministic"
    assert isinstance(result, Applied | Rejected)
    if isinstance(result, Rejected):
        assert new is state, "a rejection changes nothing"
    key = getattr(command, "key", None)
    if isinstance(command, PlaceInstance) and isinstance(result, Applied):
        if key is not None and state.keyed(key) is not None:
            # A keyed placement committed before: Applied again (the client's retry, planned
            # anew, may name other nodes, even ones down since), and nothing is placed.
            assert new is state, "a retried keyed placement changes nothing"
        else:
            for shard in command.shards:
                node = state.node(shard.node)
                assert node is not None and node.status == "up", "placed only onto up nodes"
    if key is not None and isinstance(result, Applied):
        assert new.keyed(key) is not None, "an applied keyed command leaves its key"
        assert apply(new, command) == (new, result), "its retry changes nothing, answers Applied"
    check_invariants(new)
    return new


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_command_sequences_keep_the_invariants(data: st.DataObject) -> None:
    machine = ClusterMachine()
    state = machine.initial()
    applied = 0
    if data.draw(st.booleans(), label="set up"):
        for command in (
            UpsertNode("n0", "a:0", "f:0", 1),
            UpsertNode("n1", "a:1", "f:1", 1),
            UpsertNode("n2", "a:2", "f:2", 1),
            RegisterModel(ModelCard("m0", DemoSource(1), Architecture("x", 3, 1, 1, 1, 1), 1, 1)),
        ):
            state = step(state, command)
    for _ in range(data.draw(st.integers(1, 30), label="length")):
        new = step(state, data.draw(commands(state), label="command"))
        applied += new is not state
        state = new
    assert state_hash(apply(state, RemoveNode("absent"))[0]) == state_hash(state)
    restored = machine.restore(machine.snapshot(state))
    assert restored == state and state_hash(restored) == state_hash(state)
    assert machine.snapshot(restored) == machine.snapshot(state)


@settings(max_examples=50, deadline=None)
@given(st.data())
def test_equal_command_logs_give_equal_states_on_every_replica(data: st.DataObject) -> None:
    """Two replicas fed the same entries (commands, garbage, no-ops) agree at every index; one
    restored from a snapshot midway goes on agreeing."""
    machine = ClusterMachine()
    a = b = machine.initial()
    for index in range(1, data.draw(st.integers(1, 25)) + 1):
        kind = data.draw(st.sampled_from([EntryKind.COMMAND] * 4 + [EntryKind.NOOP]))
        if data.draw(st.integers(0, 9)):
            body = encode_command(data.draw(commands(a, wild=False)))
        else:
            body = data.draw(st.binary(max_size=40))
        entry = Entry(index, 1, kind, body)
        a, result_a = machine.apply(a, entry)
        b, result_b = machine.apply(b, entry)
        assert result_a == result_b and state_hash(a) == state_hash(b)
        if kind is EntryKind.COMMAND:
            assert isinstance(decode_result(result_a), Applied | Rejected)
        if index % 7 == 0:
            b = machine.restore(machine.snapshot(b))
    assert a == b


@settings(max_examples=100, deadline=None)
@given(st.from_type(ClusterCommand))  # type: ignore[arg-type]
def test_any_command_on_a_populated_state_is_total(command: ClusterCommand) -> None:
    state = State(config=ClusterConfig())
    for c in (
        UpsertNode("n0", "a", "f", 1),
        RegisterModel(ModelCard("m0", DemoSource(1), Architecture("x", 2, 1, 1, 1, 1), 1, 1)),
        PlaceInstance("i0", "m0", "single", (Shard(0, "n0", 0, 2),), 2),
    ):
        state, result = apply(state, c)
        assert result == Applied()
    step(state, command)
