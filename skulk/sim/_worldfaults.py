"""The world's side of the fault plan: running each :class:`~skulk.sim._faults.Action` when
it is due (network, node, disk, admin and client actions; ``@leader`` bound to the leader of
the moment; triggered actions armed), and healing everything at once."""

from __future__ import annotations

import random

from skulk.consensus import StorageCorrupt, verified_regions
from skulk.sim._faults import Action, bind_leader, names_leader
from skulk.sim._network import NETWORK_OPS
from skulk.sim._node import NodeStatus, SimNode
from skulk.sim._worldbase import PROBE_CLIENT, SCENARIO_CLIENT, WorldBase


class FaultActions(WorldBase):
    """The plan's actions (see the module doc)."""

    def _apply(self, a: Action) -> None:
        self.trace.add(f"{self.now} A {sorted(a.to_json().items())}")
        if a.on:
            self.triggers.arm(a)
            return
        if names_leader(a):
            leader = self.leader()
            if leader is None:
                self.trace.add(f"{self.now} A skipped: no leader")
                return
            a = bind_leader(a, leader.node_id)
            self.trace.add(f"{self.now} A @leader={leader.node_id}")
        node = self.nodes.get(a.node)
        op = a.op
        if op in NETWORK_OPS:
            self.network.apply(a, self.now)
        elif op == "heal_all":
            self._heal_all()
        elif op in ("transfer", "add_learner", "promote", "remove"):
            self.admin.request(a, self.now)
        elif op == "propose":
            if a.node:
                self.workload.add_client(SCENARIO_CLIENT).hint = a.node
            self.workload.enqueue(SCENARIO_CLIENT, a.n or 1)
        else:
            assert node is not None, f"{op} needs a node"
            self._node_action(op, node, a)

    def _node_action(self, op: str, node: SimNode, a: Action) -> None:
        nid = node.node_id
        if op == "crash":
            if node.status is not NodeStatus.CORRUPT:
                self._restart_at.pop(nid, None)
                node.crash("crash (planned)")
        elif op == "restart":
            if node.status is NodeStatus.DOWN:
                self._start(node)
        elif op == "pause":
            if node.status in (NodeStatus.UP, NodeStatus.DEGRADED):
                node.paused = True
        elif op == "resume":
            self._resume(node)
        elif op == "crash_during_write":
            if node.up:
                node.disk.crash_after(a.n)
        elif op == "crash_on_snapshot":
            node.disk.crash_on_next_snapshot(a.n or 1)
        elif op == "disk_full":
            self.disks[nid].set_full(True)
        elif op == "disk_ok":
            self.disks[nid].set_full(False)
        elif op == "fsync_error":
            node.disk.fail_next_fsync()
        elif op == "flip_bit":
            self._flip_bit(node, a)
        elif op == "compact":
            self._send(node.compact_now())
        else:  # pragma: no cover - validate() refuses unknown ops
            raise AssertionError(f"unknown op {op}")

    def _resume(self, node: SimNode) -> None:
        if not node.paused:
            return
        node.paused = False
        queued, self._inbox[node.node_id] = self._inbox[node.node_id], []
        for m in queued:
            if node.up and not node.paused:
                self._receive(node, m)

    def _flip_bit(self, node: SimNode, a: Action) -> None:
        """Flip a durable bit where storage promises to notice, then crash and restart the
        node: storage must refuse to start (CORRUPT) or recover exactly what it persisted."""
        if node.status is NodeStatus.CORRUPT:
            return
        disk = self.disks[node.node_id]
        rng = random.Random(f"{self.seed}:flip:{a.at}:{a.n}")
        if node.up:
            node.crash("crash (to notice a bit flip)")
        try:
            regions = verified_regions(node.disk)
        except StorageCorrupt:
            regions = {}  # already refused: nothing more to damage
        flipped = disk.flip_random_bit(rng, regions)
        self.trace.add(f"{self.now} F {node.node_id} {flipped}")
        self._start(node)

    def _heal_all(self) -> None:
        self.triggers.clear()
        self.network.heal()
        self.network.reset_params()
        for nid in self.node_ids:
            node = self.nodes[nid]
            self.disks[nid].set_full(False)
            node.disk.disarm()
            self._resume(node)
            if node.status is NodeStatus.DOWN:
                self._start(node)
        if self.config.liveness and self.liveness.healed_at is None:
            self.liveness.start(self.now)
            self.workload.add_client(PROBE_CLIENT).timeout = 2 * self.config.election_timeout_max
            self.workload.enqueue(PROBE_CLIENT, 1)
