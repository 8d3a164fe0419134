"""The leader's placements and duties on a node (``ClusterControl``), over a fake Raft driver
that applies each submitted command with the real ``apply()``: pipeline and tensor instances
are committed with compute addresses from telemetry, refusals carry the arithmetic, and a node
that keeps failing a distributed instance is avoided only from its second failure."""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import trio

from skulk.cluster import COMMAND_CODEC, RESULT_CODEC, State, apply
from skulk.cluster._duties import CULPRIT_WAIT_MS
from skulk.control import ClusterControl
from skulk.federation import LinkView, PeerState
from skulk.wire.cluster import (
    Architecture,
    ClusterCommand,
    ControlRefused,
    DemoSource,
    ModelCard,
    Placed,
    PlaceInstance,
    PlacementAsk,
    Planned,
    RegisterModel,
    ReportRunner,
    Shard,
    UpsertNode,
)
from skulk.wire.telemetry import ComputePorts, NodeReadings

GIB = 1 << 30
LLAMA = ModelCard("m", DemoSource(1), Architecture("llama", 4, 64, 4, 2, 100), 2 * GIB, 128)
GEMMA = ModelCard("g", DemoSource(1), Architecture("gemma", 4, 64, 4, 4, 100), GIB, 128)
ODD = ModelCard("o", DemoSource(1), Architecture("llama", 4, 84, 6, 3, 100), GIB, 128)


def readings(node: str, free: int, compute: bool = True) -> NodeReadings:
    ports = ComputePorts(f"10.0.0.{ord(node)}", 7000, 7003) if compute else None
    return NodeReadings(node, node, "linux", 16 * GIB, free, "", ("cpu",), 2, 0.0,
                        (f"ws://{node}",), f"http://{node}", 0.0, ports)  # fmt: skip


class FakeDriver:
    """A leader whose log commits at once: ``submit`` applies the command to ``state``."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.applied = 0
        self.leader = "a"
        self.committed: list[ClusterCommand] = []

    async def submit(self, data: bytes, **_: Any) -> bytes:
        command = COMMAND_CODEC.decode(data)
        self.state, result = apply(self.state, command)
        self.applied += 1
        self.committed.append(command)
        return RESULT_CODEC.encode(result)

    async def wait_applied(self, seen: int) -> None:
        await trio.sleep_forever()

    def statistics(self) -> Any:
        return SimpleNamespace(role="leader", term=1)


def make(state: State, seen: Mapping[str, NodeReadings]) -> tuple[ClusterControl, FakeDriver]:
    driver = FakeDriver(state)
    views = [LinkView(n, f"ws://{n}", PeerState.UP, 1.0, 0, 0, 0, 0, None, True) for n in seen]
    mesh = SimpleNamespace(links=lambda: views, link=lambda peer: None)

    def no_card(name: str) -> ModelCard:
        raise AssertionError("cards are registered up front here")

    control = ClusterControl(
        "a",
        SimpleNamespace(driver=driver),
        mesh,
        lambda: seen,
        card_for=no_card,  # type: ignore[arg-type]
    )
    return control, driver


def cluster(*cards: ModelCard) -> State:
    state = State()
    for command in [UpsertNode(n, f"http://{n}", f"ws://{n}", 0) for n in "abc"]:
        state, _ = apply(state, command)
    for card in cards:
        state, _ = apply(state, RegisterModel(card))
    return state


def ask(model: str, sharding: Any, *, dry_run: bool = False, **kw: Any) -> PlacementAsk:
    return PlacementAsk(model, sharding, kw.get("nodes", ()), (), kw.get("min_nodes", 1),
                        kw.get("max_nodes"), dry_run, False)  # fmt: skip


async def test_a_pipeline_is_committed_with_compute_addresses_and_a_dry_run_shows_them() -> None:
    seen = {n: readings(n, 2 * GIB) for n in "abc"}  # half the model per node fits, not all
    control, driver = make(cluster(LLAMA), seen)
    dry = await control.ask(ask("m", "pipeline", dry_run=True))
    assert isinstance(dry, Planned) and len(dry.shards) == 2
    assert all(s.address.startswith("10.0.0.") and s.address.endswith(":7000") for s in dry.shards)
    assert driver.committed == []
    placed = await control.ask(ask("m", "pipeline"))
    assert isinstance(placed, Placed)
    (instance,) = driver.state.instances
    assert instance.sharding == "pipeline"
    assert control.placements == {("placement", "new"): 1}  # the dry run placed nothing
    assert [s.address for s in instance.shards] == [s.address for s in dry.shards]
    # The next placement on those nodes takes the next ports.
    seen.update({n: readings(n, 8 * GIB) for n in "abc"})
    used = tuple(s.node for s in instance.shards)
    again = await control.ask(ask("m", "pipeline", dry_run=True, nodes=used, min_nodes=2))
    assert isinstance(again, Planned)
    assert all(s.address.endswith(":7001") for s in again.shards)


async def test_tensor_refusals_name_the_family_or_the_heads_arithmetic() -> None:
    seen = {n: readings(n, 8 * GIB) for n in "abc"}
    control, driver = make(cluster(GEMMA, ODD, LLAMA), seen)
    family = await control.ask(ask("g", "tensor", min_nodes=2))
    assert isinstance(family, ControlRefused) and family.code == "unsupported_sharding"
    assert "'gemma'" in family.message
    heads = await control.ask(ask("o", "tensor", min_nodes=2, max_nodes=2))
    assert isinstance(heads, ControlRefused) and heads.code == "unsupported_sharding"
    assert "3 kv heads do not divide over 2 ranks" in heads.message
    placed = await control.ask(ask("m", "tensor", min_nodes=2))
    assert isinstance(placed, Placed)
    assert [len(i.shards) for i in driver.state.instances] == [2]


async def test_nodes_without_compute_ports_are_pending_and_memory_refusals_say_need_and_have() -> (
    None
):
    seen = {n: readings(n, 8 * GIB, compute=False) for n in "abc"}
    control, _ = make(cluster(LLAMA), seen)
    pending = await control.ask(ask("m", "pipeline", min_nodes=2))
    assert isinstance(pending, ControlRefused) and pending.code == "placement_info_pending"
    assert isinstance(await control.ask(ask("m", "single")), Placed)  # needs no ports
    small = {n: readings(n, GIB) for n in "abc"}
    control, _ = make(cluster(LLAMA), small)
    refused = await control.ask(ask("m", "single"))
    assert isinstance(refused, ControlRefused) and refused.code == "not_enough_memory"
    assert "need" in refused.message and "have" in refused.message
    assert refused.need is not None and refused.have == GIB


async def test_a_node_failing_a_pipeline_twice_is_avoided_from_the_second_time(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen = {n: readings(n, 8 * GIB) for n in "abc"}
    state = cluster(LLAMA)
    shards = (Shard(0, "a", 0, 2, "10.0.0.97:7000"), Shard(1, "b", 2, 4, "10.0.0.98:7000"))
    state, _ = apply(state, PlaceInstance("p0", "m", "pipeline", shards, 0))
    state, _ = apply(state, ReportRunner("p0", 1, "b", "failed", "runner_crashed", 1))
    control, driver = make(state, seen)
    fresh = (f"p{i}" for i in itertools.count(1))
    await control._duty_round(fresh)
    (first,) = driver.state.instances
    assert first.id == "p1" and sorted(s.node for s in first.shards) == ["a", "b"]
    assert control._strikes == {"m": {"b": 1}}
    # b fails the new instance too: its second strike keeps it out of the next plan.
    rank = next(s.rank for s in first.shards if s.node == "b")
    driver.state, _ = apply(driver.state, ReportRunner("p1", rank, "b", "failed", "wedged", 2))
    await control._duty_round(fresh)
    (second,) = driver.state.instances
    assert second.id == "p2" and sorted(s.node for s in second.shards) == ["a", "c"]
    assert control._strikes == {"m": {"b": 2}}
    # A victim's failure counts against nobody.
    rank = next(s.rank for s in second.shards if s.node == "c")
    driver.state, _ = apply(
        driver.state, ReportRunner("p2", rank, "c", "failed", "collective_timeout", 3)
    )
    await control._duty_round(fresh)  # only a victim has spoken: the culprit is waited for
    assert [i.id for i in driver.state.instances] == ["p2"]
    await trio.sleep(CULPRIT_WAIT_MS / 1000)  # on the leader's own (Trio) clock
    await control._duty_round(fresh)
    (third,) = driver.state.instances
    assert third.id == "p3" and sorted(s.node for s in third.shards) == ["a", "c"]
    assert control._strikes == {"m": {"b": 2}}
    assert control.placements == {  # the re-placements, by the failure that caused each
        ("replacement", "runner_crashed"): 1,
        ("replacement", "wedged"): 1,
        ("replacement", "collective_timeout"): 1,
    }
