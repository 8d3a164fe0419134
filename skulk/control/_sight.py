"""What the leader sees of the cluster besides the State: the Raft members, the nodes linked to
it, and each node's free memory and compute ports from telemetry. Read by the leader's asks
(placement, removal) and its duties alike; and its clock, :func:`now_ms`."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from skulk.clock import wall
from skulk.cluster import State, held_bytes, usable_compute_ports
from skulk.consensus import RaftDriver
from skulk.federation import Mesh, PeerState
from skulk.wire.telemetry import ComputePorts, NodeReadings

log = logging.getLogger("skulk.control")


def now_ms() -> int:
    """The leader's clock for committed timestamps (ms since the Unix epoch)."""
    return int(wall() * 1000)


class LeaderSight:
    """This node's view, read fresh on every call (``readings()`` is the telemetry snapshot:
    node id → readings)."""

    def __init__(
        self,
        node_id: str,
        driver: RaftDriver[State],
        mesh: Mesh,
        readings: Callable[[], Mapping[str, NodeReadings]],
    ) -> None:
        self.node_id = node_id
        self._driver = driver
        self._mesh = mesh
        self.readings = readings
        self._said: dict[str, ComputePorts] = {}  # the bad reading last logged, per node

    def members(self) -> set[str]:
        conf = self._driver.conf
        return set(conf.members()) if conf is not None else set()

    def reachable_ids(self) -> set[str]:
        up = {
            v.peer_id
            for v in self._mesh.links()
            if v.peer_id is not None and v.state is PeerState.UP
        }
        return up | {self.node_id}

    def free_bytes(self, state: State) -> dict[str, int]:
        """Free memory per node from telemetry, less what instances placed there but not yet
        loaded will take (telemetry shows a loaded model's memory as used already)."""
        free = {n: r.memory_available_bytes for n, r in self.readings().items()}
        for instance in state.instances:
            card = state.model(instance.model)
            if card is None:
                continue
            ready = {
                r.node for r in state.runners if r.instance == instance.id and r.phase == "ready"
            }
            for node, held in held_bytes(card, instance).items():
                if node in free and node not in ready:
                    free[node] -= held
        return free

    def compute(self) -> dict[str, ComputePorts]:
        """Compute ports per node, as advertised in telemetry and checked
        (:func:`~skulk.cluster.usable_compute_ports`): a node whose reading is not usable is
        left out, as if it had advertised none (logged once per reading)."""
        usable: dict[str, ComputePorts] = {}
        for node, reading in self.readings().items():
            if reading.compute is None:
                continue
            checked = usable_compute_ports(reading.compute)
            if isinstance(checked, str):
                if self._said.get(node) != reading.compute:
                    self._said[node] = reading.compute
                    log.warning("node %s advertises unusable compute ports: %s", node, checked)
                continue
            self._said.pop(node, None)
            usable[node] = checked
        return usable
