"""Consensus in a live node: the Raft driver over the federation mesh, plus the leader's duties.

``python -m skulk serve`` runs one :class:`ConsensusService`::

    consensus = ConsensusService(node_id, mesh, data_dir, ClusterMachine(), founder=not join_urls)
    mesh = Mesh(..., rpc_handler=consensus.handle_rpc)   # forwarded submissions
    await nursery.start(consensus.run)
    ...
    await consensus.step_down()                           # graceful shutdown

* **Storage** is ``data_dir`` (``$SKULK_HOME/raft``) on the real disk, fsync on.
* **Bootstrap.** A *founder* (a node started without ``--join``) whose storage is empty starts a
  new cluster with itself as the only voter. Any other node with empty storage waits, empty,
  until the leader adds it. A node with data resumes as the member it was, whatever its flags.
* **Leader duties** run while this node leads: every ``duty_interval`` seconds the leader adds
  linked nodes that are not members as learners and promotes caught-up learners, up to an odd
  number of voters (:mod:`skulk.consensus._membership`). Nodes are removed only when asked
  (:meth:`ConsensusService.remove_member`: an operator, or the cluster layer's policy).
* **Graceful shutdown** (:meth:`step_down`) hands leadership to the most up-to-date voter, so the
  cluster does not wait an election timeout for a new leader.

The replicated state machine is given (``machine``); a live node runs the cluster State
(:class:`skulk.cluster.ClusterMachine`), wired in by ``serve``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Generic, TypeVar

import trio

from skulk.federation import Mesh, PeerState, RpcFailed
from skulk.wire import JsonValue

from ._core import ProposalRefused, Role
from ._driver import DriverConfig, RaftDriver
from ._errors import ConsensusError
from ._machine import StateMachine
from ._membership import DEFAULT_MAX_VOTERS, next_change
from ._meshtransport import SUBMIT_METHOD, MeshTransport
from ._osdisk import OsDisk
from ._storage import DEFAULT_SEGMENT_BYTES, Storage
from ._types import ConfChange, NodeId, Recovered

log = logging.getLogger("skulk.consensus")

S = TypeVar("S")


class ConsensusService(Generic[S]):
    """See the module doc."""

    def __init__(
        self,
        node_id: NodeId,
        mesh: Mesh,
        data_dir: Path,
        machine: StateMachine[S],
        *,
        founder: bool,
        config: DriverConfig = DriverConfig(),  # noqa: B008 - frozen
        duty_interval: float = 0.25,
        max_voters: int = DEFAULT_MAX_VOTERS,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        self.node_id = node_id
        self._segment_bytes = segment_bytes
        self._mesh = mesh
        self._data_dir = data_dir
        self._duty_interval = duty_interval
        self._max_voters = max_voters
        self.transport = MeshTransport(mesh)
        self.driver: RaftDriver[S] = RaftDriver(
            node_id,
            voters=(node_id,) if founder else (),
            machine=machine,
            open_storage=self._open_storage,
            transport=self.transport,
            config=config,
        )

    def _open_storage(self) -> tuple[Storage, Recovered]:
        return Storage.open(OsDisk(self._data_dir), segment_bytes=self._segment_bytes)

    async def handle_rpc(self, method: str, body: bytes) -> bytes:
        """The mesh's rpc handler: forwarded submissions (other methods: unknown)."""
        if method != SUBMIT_METHOD:
            raise RpcFailed("no_handler", f"unknown method {method!r}")
        return await self.transport.handle_rpc(method, body)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self.transport.run)
            await nursery.start(self.driver.run)
            nursery.start_soon(self._leader_duties)
            task_status.started()

    async def step_down(self, timeout: float = 2.0) -> None:  # noqa: ASYNC109
        """If this node leads, hand leadership over (bounded by ``timeout`` seconds)."""
        if self.driver.role is Role.LEADER:
            new = await self.driver.transfer_leadership(timeout=timeout)
            conf = self.driver.conf
            if new not in (None, self.node_id):
                log.info("raft %s: leadership handed to %s", self.node_id, new)
            elif conf is not None and set(conf.voters) - {self.node_id}:  # else: nobody to hand to
                log.warning("raft %s: leadership not handed over in %gs", self.node_id, timeout)

    async def remove_member(self, node: NodeId, timeout: float = 5.0) -> bool:  # noqa: ASYNC109
        """On the leader: remove ``node`` from the Raft membership. Returns True once it is
        no longer a member (checked as entries apply, at most ``timeout`` s), False if it was
        not one or is still one. Raises :class:`NotLeader` on a non-leader,
        :class:`ProposalRefused` when the leader cannot take it now (e.g. the last voter)."""
        conf = self.driver.conf
        if conf is None or node not in conf.members():
            return False
        self.driver.propose_conf_change(ConfChange("remove", node))
        with trio.move_on_after(timeout):
            while (conf := self.driver.conf) is not None and node in conf.members():
                await self.driver.wait_applied(self.driver.applied)
        conf = self.driver.conf
        return conf is not None and node not in conf.members()

    def linked_peers(self) -> set[NodeId]:
        return {
            view.peer_id
            for view in self._mesh.links()
            if view.peer_id is not None and view.state is PeerState.UP
        }

    async def _leader_duties(self) -> None:
        while True:
            await trio.sleep(self._duty_interval)
            conf = self.driver.conf
            if self.driver.role is not Role.LEADER or conf is None:
                continue
            change = next_change(
                conf, self.linked_peers(), self.driver.caught_up, max_voters=self._max_voters
            )
            if change is None:
                continue
            try:
                self.driver.propose_conf_change(change)
            except (ConsensusError, ProposalRefused) as exc:
                log.debug("raft %s: %s not proposed: %s", self.node_id, change, exc)
            else:
                log.info("raft %s: proposed %s %s", self.node_id, change.op, change.node)

    def status_json(self) -> dict[str, JsonValue]:
        """The body of ``GET /v1/cluster/raft``."""
        stats = self.driver.statistics()
        conf = self.driver.conf
        return {
            "node_id": self.node_id,
            "healthy": stats.healthy,
            "unavailable": stats.unavailable,
            "role": stats.role,
            "term": stats.term,
            "leader": stats.leader,
            "commit": stats.commit,
            "applied": stats.applied,
            "last_index": stats.last_index,
            "snapshot_index": stats.snapshot_index,
            "voters": list(conf.voters) if conf else [],
            "learners": list(conf.learners) if conf else [],
        }
