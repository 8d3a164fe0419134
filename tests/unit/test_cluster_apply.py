"""apply(): one test per rejection reason, the happy paths, and the Raft machine adapter."""

from __future__ import annotations

import attrs
import pytest

from skulk.cluster import ClusterMachine, State, apply, decode_result, encode_command, state_hash
from skulk.wire import SnapshotCorrupt
from skulk.wire.cluster import (
    Applied,
    Architecture,
    ClusterCommand,
    ClusterConfig,
    DeleteInstance,
    DemoSource,
    Download,
    DownloadFailed,
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

A, B = "127.0.0.1:7001", "127.0.0.1:7002"
CARD = ModelCard("demo", DemoSource(7), Architecture("llama", 4, 64, 4, 2, 256), 1000, 2048)


def run(*commands: ClusterCommand, state: State | None = None) -> State:
    """Apply ``commands``, each of which must be applied."""
    state = State() if state is None else state
    for command in commands:
        state, result = apply(state, command)
        assert result == Applied(), (command, result)
    return state


def base() -> State:
    """Nodes a, b (up) and c (down), the demo model, instance i1 (single, on a)."""
    return run(
        UpsertNode("a", "127.0.0.1:1", "127.0.0.1:2", at=1),
        UpsertNode("b", "127.0.0.1:3", "127.0.0.1:4", at=2),
        UpsertNode("c", "127.0.0.1:5", "127.0.0.1:6", at=3),
        NodeStatusChanged("c", "down", at=4),
        RegisterModel(CARD),
        PlaceInstance("i1", "demo", "single", (Shard(0, "a", 0, 4),), at=5),
    )


def rejected(state: State, command: ClusterCommand) -> str:
    new, result = apply(state, command)
    assert isinstance(result, Rejected), result
    assert new is state
    return result.reason


def test_the_happy_path_builds_a_canonical_state() -> None:
    state = base()
    assert [n.id for n in state.nodes] == ["a", "b", "c"]
    assert state.node("c") is not None and state.node("c").changed_at == 4  # type: ignore[union-attr]
    assert [(r.instance, r.rank, r.node, r.phase) for r in state.runners] == [
        ("i1", 0, "a", "pending")
    ]
    # The same commands in another order for independent keys give an equal State.
    other = run(
        UpsertNode("b", "127.0.0.1:3", "127.0.0.1:4", at=2),
        UpsertNode("a", "127.0.0.1:1", "127.0.0.1:2", at=1),
        UpsertNode("c", "127.0.0.1:5", "127.0.0.1:6", at=3),
        RegisterModel(CARD),
        NodeStatusChanged("c", "down", at=4),
        PlaceInstance("i1", "demo", "single", (Shard(0, "a", 0, 4),), at=5),
    )
    assert other == state and hash(other) == hash(state)
    assert state_hash(other) == state_hash(state)


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        (UpsertNode("", "x", "y", at=0), "bad_value"),
        (NodeStatusChanged("zz", "down", at=9), "unknown_node"),
        (RemoveNode("zz"), "unknown_node"),
        (RemoveNode("a"), "node_in_use"),
        (RegisterModel(attrs.evolve(CARD, weight_bytes=-1)), "bad_value"),
        (RegisterModel(attrs.evolve(CARD, id="")), "bad_value"),
        (
            RegisterModel(attrs.evolve(CARD, architecture=Architecture("x", 0, 1, 1, 1, 1))),
            "bad_value",
        ),
        (RegisterModel(attrs.evolve(CARD, source=PathSource("/m"))), "model_in_use"),
        (PlaceInstance("i1", "demo", "single", (Shard(0, "b", 0, 4),), at=9), "duplicate_instance"),
        (PlaceInstance("", "demo", "single", (Shard(0, "b", 0, 4),), at=9), "bad_value"),
        (PlaceInstance("i2", "nope", "single", (Shard(0, "b", 0, 4),), at=9), "unknown_model"),
        (PlaceInstance("i2", "demo", "single", (Shard(0, "zz", 0, 4),), at=9), "unknown_node"),
        (PlaceInstance("i2", "demo", "single", (Shard(0, "c", 0, 4),), at=9), "node_not_up"),
        (PlaceInstance("i2", "demo", "single", (), at=9), "bad_shards"),
        (PlaceInstance("i2", "demo", "single", (Shard(1, "b", 0, 4),), at=9), "bad_shards"),
        (
            PlaceInstance("i2", "demo", "single", (Shard(0, "a", 0, 2), Shard(1, "b", 2, 4)), 9),
            "bad_shards",
        ),
        (
            PlaceInstance("i2", "demo", "pipeline", (Shard(0, "a", 0, 2), Shard(1, "a", 2, 4)), 9),
            "bad_shards",
        ),
        (PlaceInstance("i2", "demo", "single", (Shard(0, "b", 0, 3),), at=9), "bad_layers"),
        (
            PlaceInstance("i2", "demo", "pipeline", (Shard(0, "a", 0, 3), Shard(1, "b", 2, 4)), 9),
            "bad_layers",
        ),
        (
            PlaceInstance("i2", "demo", "pipeline", (Shard(0, "a", 0, 0), Shard(1, "b", 0, 4)), 9),
            "bad_layers",
        ),
        (
            PlaceInstance("i2", "demo", "tensor", (Shard(0, "a", 0, 4), Shard(1, "b", 0, 3)), 9),
            "bad_layers",
        ),
        (
            PlaceInstance("i2", "demo", "tensor", (Shard(0, "a", 0, 4, A), Shard(1, "b", 0, 4)), 9),
            "bad_shards",  # a rank without a compute address
        ),
        (
            PlaceInstance(
                "i2", "demo", "tensor", (Shard(0, "a", 0, 4, A), Shard(1, "b", 0, 4, A)), 9
            ),
            "bad_shards",  # two ranks at one address
        ),
        (PlaceInstance("i2", "demo", "single", (Shard(0, "b", 0, 4, A),), at=9), "bad_shards"),
        (RegisterModel(attrs.evolve(CARD, id="x", holders=("b", "a"))), "bad_value"),
        (DeleteInstance("zz"), "unknown_instance"),
        (SetInstanceStatus("zz", "failed", at=9), "unknown_instance"),
        (ReportRunner("zz", 0, "a", "ready", None, at=9), "unknown_instance"),
        (ReportRunner("i1", 1, "a", "ready", None, at=9), "unknown_rank"),
        (ReportRunner("i1", 0, "b", "ready", None, at=9), "wrong_node"),
        (ReportRunner("i1", 0, "a", "failed", None, at=9), "bad_value"),
        (ReportRunner("i1", 0, "a", "ready", "oops", at=9), "bad_value"),
        (SetConfig(ClusterConfig(floor_bytes=-1)), "bad_value"),
    ],
    ids=lambda v: type(v).__name__ if not isinstance(v, str) else v,
)
def test_each_rejection_leaves_the_state_unchanged(command: ClusterCommand, reason: str) -> None:
    assert rejected(base(), command) == reason


def test_pipeline_and_tensor_plans_are_checked_and_accepted() -> None:
    state = run(
        PlaceInstance("p", "demo", "pipeline", (Shard(0, "b", 0, 1, B), Shard(1, "a", 1, 4, A)), 9),
        PlaceInstance("t", "demo", "tensor", (Shard(0, "a", 0, 4, A), Shard(1, "b", 0, 4, B)), 9),
        state=base(),
    )
    assert [(r.instance, r.rank) for r in state.runners] == [
        ("i1", 0),
        ("p", 0),
        ("p", 1),
        ("t", 0),
        ("t", 1),
    ]


def test_node_down_keeps_instances_and_removal_needs_them_gone() -> None:
    state = run(NodeStatusChanged("a", "down", at=10), state=base())
    assert state.instance("i1") is not None and len(state.runners) == 1
    assert rejected(state, RemoveNode("a")) == "node_in_use"
    state = run(DeleteInstance("i1"), RemoveNode("a"), state=state)
    assert state.node("a") is None and state.runners == () and state.instances == ()


def test_reports_and_status_changes_record_the_leaders_time() -> None:
    state = run(
        ReportRunner("i1", 0, "a", "failed", "crash_loop", at=11),
        SetInstanceStatus("i1", "failed", at=12),
        UpsertNode("c", "127.0.0.1:7", "127.0.0.1:8", at=13),
        state=base(),
    )
    assert state.runners[0].failure == "crash_loop" and state.runners[0].changed_at == 11
    assert state.instance("i1").status == "failed"  # type: ignore[union-attr]
    c = state.node("c")
    assert c is not None and (c.status, c.changed_at, c.api_address) == ("up", 13, "127.0.0.1:7")
    # Repeating a status is applied and changes nothing, not even the time.
    assert run(NodeStatusChanged("c", "up", at=99), state=state) == state
    assert run(RegisterModel(CARD), state=state) == state


def test_the_machine_adapter() -> None:
    machine = ClusterMachine()
    state = machine.initial()
    noop = Entry(index=1, term=1, kind=EntryKind.NOOP)
    assert machine.apply(state, noop) == (state, b"")
    entry = Entry(2, 1, EntryKind.COMMAND, encode_command(UpsertNode("a", "x", "y", at=1)))
    state, result = machine.apply(state, entry)
    assert decode_result(result) == Applied() and state.node("a") is not None
    garbage = Entry(3, 1, EntryKind.COMMAND, b"\xff\x00")
    same, result = machine.apply(state, garbage)
    assert same is state
    decoded = decode_result(result)
    assert isinstance(decoded, Rejected) and decoded.reason == "undecodable"

    full = base()
    image = machine.snapshot(full)
    assert machine.restore(image) == full
    assert state_hash(machine.restore(image)) == state_hash(full)
    assert machine.snapshot(machine.restore(image)) == image
    with pytest.raises(SnapshotCorrupt):
        machine.restore(b"not zstd")
    from skulk.wire import pack

    with pytest.raises(SnapshotCorrupt):
        machine.restore(pack({"nodes": 1}))


def test_a_card_in_use_gains_holders_but_cannot_change_otherwise() -> None:
    state = run(RegisterModel(attrs.evolve(CARD, holders=("b",))), state=base())  # i1 uses it
    state = run(RegisterModel(attrs.evolve(CARD, holders=("a",))), state=state)
    card = state.model("demo")
    assert card is not None and card.holders == ("a", "b")
    assert rejected(state, RegisterModel(attrs.evolve(CARD, weight_bytes=5))) == "model_in_use"


def test_a_node_releases_a_model_it_no_longer_holds() -> None:
    state = run(RegisterModel(attrs.evolve(CARD, holders=("a", "b"))), state=base())
    state = run(ReleaseModel("demo", "a"), state=state)
    card = state.model("demo")
    assert card is not None and card.holders == ("b",)
    assert run(ReleaseModel("demo", "a"), state=state) == state  # idempotent
    assert rejected(state, ReleaseModel("nothing", "a")) == "unknown_model"
    # A holder again later: the card merges it back.
    state = run(RegisterModel(attrs.evolve(CARD, holders=("a",))), state=state)
    card = state.model("demo")
    assert card is not None and card.holders == ("a", "b")


def start(node: str, model: str = "org/m", at: int = 10) -> StartDownload:
    return StartDownload(model, "org/m", "c" * 40, node, 1000, at)


def test_a_download_runs_on_one_node_fails_typed_and_ends_with_the_card() -> None:
    state = run(start("a"), state=base())
    assert state.download("org/m") == Download(
        "org/m", "org/m", "c" * 40, "a", 1000, "downloading", 10
    )
    assert run(start("a"), state=state) == state  # a repeat
    assert rejected(state, start("b")) == "duplicate_download"
    assert rejected(base(), start("c")) == "node_not_up"
    assert rejected(base(), start("z")) == "unknown_node"
    assert rejected(base(), start("a", model="demo")) == "model_exists"
    assert rejected(state, DownloadFailed("org/m", "b", "hub_unreachable", "", 11)) == (
        "unknown_download"
    )
    failed = run(DownloadFailed("org/m", "a", "hub_unreachable", "gone", 11), state=state)
    (entry,) = failed.downloads
    assert (entry.status, entry.reason, entry.detail, entry.changed_at) == (
        "failed", "hub_unreachable", "gone", 11,
    )  # fmt: skip
    assert failed.download("org/m") is None
    assert run(DownloadFailed("org/m", "a", "other", "", 12), state=failed) == failed
    # Re-placed on b: a's failure stays visible; a retry on a replaces a's entry.
    moved = run(start("b", at=12), state=failed)
    assert [(d.node, d.status) for d in moved.downloads] == [("a", "failed"), ("b", "downloading")]
    again = run(start("a", at=13), state=failed)
    assert [(d.node, d.status) for d in again.downloads] == [("a", "downloading")]
    # The card registered: every entry of the model goes.
    card = attrs.evolve(CARD, id="org/m", holders=("b",))
    done = run(RegisterModel(card), state=moved)
    assert done.downloads == () and done.model("org/m") == card


def test_a_removed_node_takes_its_downloads_with_it() -> None:
    state = run(start("b"), state=base())
    state = run(RemoveNode("b"), state=state)
    assert state.downloads == ()
