"""``serve --model ORG/REPO`` on the leader (``ClusterControl._ensure`` of a Hub id, over the
fake Raft driver of test_control_placement): while no node has published its model store yet,
it keeps asking instead of giving up; then one node downloads the model, and once its card is
registered the model is placed."""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import trio
import trio.testing

from skulk.cluster import COMMAND_CODEC
from skulk.control import ClusterControl
from skulk.control._pull import INFO_WAIT_S
from skulk.hub import HubPlan, HubRef
from skulk.wire.cluster import (
    Architecture,
    HubSource,
    ModelCard,
    RegisterModel,
    StartDownload,
)
from skulk.wire.telemetry import NodeReadings, StoreReading
from tests.unit.test_control_placement import GIB, cluster, make, readings

C = "c" * 40
CARD = ModelCard(
    "org/m", HubSource("org/m", C), Architecture("llama", 4, 64, 4, 2, 100), GIB, 128, "f" * 64
)


def plan_of(control: ClusterControl) -> None:
    async def check_hub(name: str) -> HubPlan:
        assert name == "org/m"
        return HubPlan(HubRef("org/m"), C, (), "llama", "http://hub", None)

    control.check_hub = check_hub  # type: ignore[method-assign]


async def test_a_hub_model_given_to_serve_waits_for_store_readings_then_is_placed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: dict[str, NodeReadings] = {n: readings(n, 8 * GIB) for n in "abc"}
    view: Mapping[str, NodeReadings] = seen
    control, driver = make(cluster(), view)
    plan_of(control)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(control._ensure, "org/m")
        await trio.sleep(INFO_WAIT_S * 3)  # no store reading anywhere: it keeps asking
        assert driver.state.downloads == () and driver.committed == []
        seen["b"] = attrs.evolve(seen["b"], store=StoreReading(0, None, 4 * GIB))
        await trio.sleep(60)
        (start,) = driver.committed
        assert isinstance(start, StartDownload) and (start.model, start.node) == ("org/m", "b")
        await driver.submit(COMMAND_CODEC.encode(RegisterModel(attrs.evolve(CARD, holders=("b",)))))
        await trio.sleep(120)  # the pull sees the card, then the placement is asked
        nursery.cancel_scope.cancel()
    (instance,) = driver.state.instances
    assert instance.model == "org/m" and instance.sharding == "single"
