"""The leader's duties, every ``interval`` s while this node leads: gather a
:class:`~skulk.cluster.LeaderView` (reachable nodes from the mesh, their addresses, free memory
and compute ports from telemetry, how long the others have been unreachable, the failures
counted against each node per model) and commit what :func:`~skulk.cluster.next_commands` says
— upserts, ``down`` verdicts, re-placements, removals — and take removed nodes out of the Raft
membership; then (outside the ask lock) make the Raft membership follow the State, retrying a
removal's membership step that failed (:class:`~skulk.control._reconcile.MembershipReconciler`).

A committed re-placement is remembered: a ``single`` instance's failed nodes are avoided by the
model from then on, and each culprit of a pipeline/tensor instance's failure
(:func:`~skulk.cluster.culprit_nodes`) gets a strike (avoided from its second). Both are
forgotten when a new term starts."""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Iterator

import trio

from skulk.cluster import (
    LeaderView,
    Reachable,
    State,
    culprit_nodes,
    failed_nodes,
    next_commands,
    store_room,
)
from skulk.consensus import ConsensusError, ConsensusService, ProposalRefused
from skulk.wire.cluster import NodeStatusChanged, PlaceInstance, Rejected, RemoveNode

from ._asks import Submit
from ._families import tensor_families
from ._reconcile import MembershipReconciler
from ._rpc import ControlUnavailable
from ._sight import LeaderSight, now_ms

log = logging.getLogger("skulk.control")


class LeaderDuties:
    """See the module doc. A round holds ``ask_lock``: the asks the leader runs plan against
    the same State and free memory, so never at the same time."""

    def __init__(
        self,
        sight: LeaderSight,
        consensus: ConsensusService[State],
        submit: Submit,
        ask_lock: trio.Lock,
        interval: float,
    ) -> None:
        self._sight = sight
        self._consensus = consensus
        self._driver = consensus.driver
        self._submit = submit
        self._ask_lock = ask_lock
        self._interval = interval
        self.avoid: dict[str, frozenset[str]] = {}
        self.strikes: dict[str, dict[str, int]] = {}
        self._last_reachable: dict[str, float] = {}
        self._failed_since: dict[str, float] = {}  # instance id → when first seen failed
        self._led_term: int | None = None
        self.membership = MembershipReconciler(sight, consensus)

    async def run(self) -> None:
        fresh = (uuid.uuid4().hex[:12] for _ in itertools.count())
        while True:
            await trio.sleep(self._interval)
            stats = self._driver.statistics()
            if stats.role != "leader":
                self._led_term = None
                continue
            if self._led_term != stats.term:  # a new leader gives every node a fresh grace
                self._led_term = stats.term
                self._last_reachable.clear()
                self._failed_since.clear()
                self.avoid.clear()
                self.strikes.clear()
                self.membership.reset()
            try:
                await self.round(fresh)
            except ControlUnavailable as exc:
                log.debug("leader duties paused: %s", exc)
            except Exception:  # a bug must not take the node (and each next leader) down
                log.exception("leader duty round failed; trying again in 5 s")
                await trio.sleep(5.0)
            state = self._driver.state  # the membership follows the State, commits or not
            try:
                await self.membership.round(state, state.config.node_down_after_ms / 1000)
            except Exception:
                log.exception("membership round failed; trying again in 5 s")
                await trio.sleep(5.0)

    async def round(self, fresh: Iterator[str]) -> None:
        """One round: commit what the State and the view call for (new instance ids from
        ``fresh``)."""
        async with self._ask_lock:
            state = self._driver.state
            tensor_models = {i.model for i in state.instances if i.sharding == "tensor"}
            families = await tensor_families(
                m.architecture.family for m in state.models if m.id in tensor_models
            )
            commands = next_commands(state, self.view(state, families), now_ms(), fresh)
            down = {
                c.node for c in commands if isinstance(c, NodeStatusChanged) and c.status != "up"
            }
            for command in commands:
                if self._driver.leader != self._sight.node_id:
                    return  # deposed mid-round: the new leader decides
                result = await self._submit(command)
                if isinstance(result, Rejected):  # the others of the round may still hold
                    log.warning("leader duty %s rejected: %s", type(command).__name__, result)
                    continue
                log.info("leader duty: %s", command)
                if isinstance(command, PlaceInstance):
                    self._remember_failures(state, command, down)
                if isinstance(command, RemoveNode):
                    try:
                        await self._consensus.remove_member(command.node)
                    except (ConsensusError, ProposalRefused) as exc:
                        log.warning("could not remove %s from Raft: %s", command.node, exc)

    def view(self, state: State, families: frozenset[str] | None) -> LeaderView:
        """What the leader sees now, with what it remembers (since when a node has been
        unreachable, the nodes each model avoids, the strikes)."""
        now = trio.current_time()
        reachable_ids = self._sight.reachable_ids()
        readings = self._sight.readings()
        reachable: dict[str, Reachable] = {}
        for node in reachable_ids:
            r = readings.get(node)
            if r is not None and r.api_address:
                reachable[node] = Reachable(r.api_address, ",".join(r.listen_addresses))
        for node in reachable_ids:
            self._last_reachable[node] = now
        unreachable: dict[str, int] = {}
        for known in state.nodes:
            if known.id not in reachable_ids:
                since = self._last_reachable.setdefault(known.id, now)
                unreachable[known.id] = int((now - since) * 1000)
        failing = {r.instance for r in state.runners if r.phase == "failed"}
        self._failed_since = {i: self._failed_since.get(i, now) for i in failing}
        return LeaderView(
            reachable,
            unreachable,
            self._sight.free_bytes(state),
            dict(self.avoid),
            self._sight.compute(),
            {model: dict(counts) for model, counts in self.strikes.items()},
            families,
            store_room(readings),
            {i: int((now - since) * 1000) for i, since in self._failed_since.items()},
        )

    def _remember_failures(self, state: State, move: PlaceInstance, down: set[str]) -> None:
        """A committed re-placement (``move``, planned on ``state``; ``down``: the round's
        verdicts): a single instance's failed nodes are kept out of the model's placements
        while this node leads; each culprit of a pipeline/tensor instance gets a strike."""
        old = state.instance(move.replaces) if move.replaces is not None else None
        if old is None:
            return
        if old.sharding == "single":
            bad = failed_nodes(state, old)
            if bad:
                self.avoid[old.model] = self.avoid.get(old.model, frozenset()) | bad
            return
        counts = self.strikes.setdefault(old.model, {})
        for node in sorted(culprit_nodes(state, old, down)):
            counts[node] = counts.get(node, 0) + 1
            log.warning(
                "node %s failed instance %s of %s (%d time(s) while this node leads)",
                node,
                old.id,
                old.model,
                counts[node],
            )
