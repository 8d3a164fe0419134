"""The compute ports nodes advertise in telemetry are checked by the leader before placement
uses them (issue 23): a port outside 1..65535, an inverted range or a host no peer can dial
is ignored and logged (the node counts as having advertised none), never committed as a rank's
address; a very wide range is planned with as its first ``MAX_COMPUTE_PORTS`` ports."""

from __future__ import annotations

import logging

import attrs
import pytest

from skulk.cluster import MAX_COMPUTE_PORTS, usable_compute_ports
from skulk.wire.cluster import Placed, PlacementAsk
from skulk.wire.telemetry import ComputePorts

from .test_control_placement import GIB, LLAMA, cluster, make, readings

BAD = [
    ComputePorts("10.0.0.2", 0, 3),
    ComputePorts("10.0.0.2", -5, 7000),
    ComputePorts("10.0.0.2", 65535, 70000),
    ComputePorts("10.0.0.2", 7003, 7000),
    ComputePorts("10.0.0.2", 1, 10**12),
    ComputePorts("", 7000, 7003),
    ComputePorts("10.0.0.2:7000", 7000, 7003),
    ComputePorts("[::1]", 7000, 7003),
    ComputePorts("evil host", 7000, 7003),
    ComputePorts("a/b", 7000, 7003),
    ComputePorts("x" * 300, 7000, 7003),
    ComputePorts("10.0.0.2", True, 7003),
]


@pytest.mark.parametrize("ports", BAD, ids=repr)
def test_unusable_readings_say_why(ports: ComputePorts) -> None:
    assert isinstance(usable_compute_ports(ports), str)


@pytest.mark.parametrize(
    "ports",
    [
        ComputePorts("10.0.0.2", 7000, 7000),
        ComputePorts("::1", 1, 1),
        ComputePorts("fe80::1", 65535, 65535),
        ComputePorts("node-b.local", 21703, 21734),
        ComputePorts("localhost", 9000, 9031),
    ],
    ids=repr,
)
def test_usable_readings_are_kept_as_they_are(ports: ComputePorts) -> None:
    assert usable_compute_ports(ports) == ports


def test_a_wide_range_is_planned_with_its_first_ports() -> None:
    wide = ComputePorts("10.0.0.2", 1, 65535)
    assert usable_compute_ports(wide) == attrs.evolve(wide, last_port=MAX_COMPUTE_PORTS)


async def test_a_node_with_a_bad_range_gets_no_rank_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "skulk.control")
    seen = {n: readings(n, 8 * GIB) for n in "abc"}
    seen["b"] = attrs.evolve(seen["b"], compute=ComputePorts("10.0.0.98", 0, 3))
    control, driver = make(cluster(LLAMA), seen)
    for _ in range(2):
        reply = await control.ask(PlacementAsk("m", "pipeline", (), (), 3, 3, True, False))
        assert reply.code == "placement_info_pending", reply  # type: ignore[union-attr]
    placed = await control.ask(PlacementAsk("m", "pipeline", (), (), 2, 2, False, False))
    assert isinstance(placed, Placed)
    (instance,) = driver.state.instances
    assert sorted(s.node for s in instance.shards) == ["a", "c"]
    assert all(1 <= int(s.address.rsplit(":", 1)[1]) <= 65535 for s in instance.shards)
    said = [r for r in caplog.records if "unusable compute ports" in r.getMessage()]
    assert len(said) == 1 and "first_port 0" in said[0].getMessage()
