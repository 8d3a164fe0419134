"""The asks the leader decides, one at a time and planning with its own State: a placement
(:func:`place`, with the typed refusal a failed plan becomes) and a node's removal
(:func:`remove_node`)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable

from skulk.cluster import (
    NoCandidateNodes,
    NoComputePort,
    NotEnoughMemory,
    PlacementFailure,
    PlacementInfoPending,
    PlacementPolicy,
    PlacementRequest,
    Plan,
    State,
    UnknownModel,
    UnsupportedSharding,
    addresses_in_use,
    model_needs,
    node_capacities,
    plan,
)
from skulk.consensus import ConsensusError, ConsensusService, ProposalRefused
from skulk.wire.cluster import (
    ClusterCommand,
    ClusterResult,
    ControlRefused,
    ControlReply,
    NodeRemoved,
    Placed,
    PlacementAsk,
    Planned,
    PlannedShard,
    Rejected,
    RemoveNode,
)

from ._families import tensor_families
from ._sight import LeaderSight, now_ms

log = logging.getLogger("skulk.control")

#: Replicate one command; its result (raises ``ControlUnavailable``).
Submit = Callable[[ClusterCommand], Awaitable[ClusterResult]]


async def place(
    ask: PlacementAsk,
    state: State,
    sight: LeaderSight,
    submit: Submit,
    current: Callable[[], State] | None = None,
) -> ControlReply:
    """Plan ``ask`` on ``state`` and what ``sight`` sees, and commit the plan (unless a dry run
    or ``if_absent`` finds one already): :class:`Placed`, :class:`Planned` or a refusal.

    An ask with a ``key`` the State holds is a retry: it answers the instance that key placed
    and plans nothing (``key_reused`` when the key was committed with something else). The
    plan is committed with the key, so a retry that raced its first try (whose entry committed
    after this plan was made) changes nothing: the answer is read back from ``current()``, the
    leader's State once the command applied."""
    if ask.key is not None and not ask.dry_run:
        replay = _replay(ask, state)
        if replay is not None:
            return replay
    if ask.if_absent:
        existing = next((i for i in state.instances if i.model == ask.model), None)
        if existing is not None:
            return Placed(existing.id, existed=True)
    request = PlacementRequest(
        ask.model, ask.sharding, ask.nodes, ask.excluded_nodes, ask.min_nodes, ask.max_nodes
    )
    card = state.model(ask.model)
    families = None
    if ask.sharding == "tensor" and card is not None:
        families = await tensor_families([card.architecture.family])
    result = plan(
        request,
        {m.id: model_needs(m) for m in state.models},
        node_capacities(state, sight.free_bytes(state), sight.compute()),
        PlacementPolicy.from_config(state.config, families),
        addresses_in_use(state),
    )
    if not isinstance(result, Plan):
        return _refusal(result)
    if ask.dry_run:
        shards = tuple(
            PlannedShard(s.rank, s.node, *s.layers, s.need_bytes, s.available_bytes, s.address)
            for s in result.shards
        )
        return Planned(result.model, result.sharding, shards)
    instance = uuid.uuid4().hex[:12]
    outcome = await submit(result.command(instance, now_ms(), ask.key))
    if isinstance(outcome, Rejected):
        return ControlRefused(outcome.reason, outcome.detail)
    seen = current().keyed(ask.key) if ask.key is not None and current is not None else None
    if seen is not None and seen.instance != instance:  # an earlier try of the ask won
        log.info("placement %s was committed already as %s", ask.key, seen.instance)
        return Placed(seen.instance, existed=False)
    log.info("placed %s of %s on %s", instance, ask.model, [s.node for s in result.shards])
    return Placed(instance, existed=False)


async def remove_node(
    node: str,
    state: State,
    sight: LeaderSight,
    submit: Submit,
    consensus: ConsensusService[State],
) -> ControlReply:
    """Take ``node`` out of the State and the Raft membership: refused for the leader itself,
    an unknown node, a node still linked, or one still holding instances."""
    if node == sight.node_id:
        return ControlRefused("bad_value", "the leader cannot remove itself; stop it first")
    if state.node(node) is None and node not in sight.members():
        return ControlRefused("unknown_node", f"no node {node!r} in the cluster")
    if node in sight.reachable_ids():
        return ControlRefused(
            "node_in_use", f"node {node!r} is up and linked; stop it before removing it"
        )
    # Its instances move first (the duties re-place them once it is down); then it goes.
    if state.node(node) is not None:
        if any(s.node == node for i in state.instances for s in i.shards):
            return ControlRefused(
                "node_in_use",
                f"node {node!r} still holds instances; they move once it is down "
                f"({state.config.node_down_after_ms / 1000:g} s after it stopped)",
            )
        result = await submit(RemoveNode(node))
        if isinstance(result, Rejected):
            return ControlRefused(result.reason, result.detail)
    try:
        await consensus.remove_member(node)
    except (ConsensusError, ProposalRefused) as exc:
        return ControlRefused(  # the leader's duties retry it (``_reconcile``)
            "unavailable",
            f"could not remove {node!r} from Raft yet ({exc}); the leader keeps trying",
        )
    log.warning("node %s removed from the cluster", node)
    return NodeRemoved(node)


def _replay(ask: PlacementAsk, state: State) -> ControlReply | None:
    """The answer to a retried keyed ``ask`` whose key ``state`` holds (None: a new key)."""
    assert ask.key is not None
    seen = state.keyed(ask.key)
    if seen is None:
        return None
    instance = state.instance(seen.instance)
    if seen.kind != "place" or (instance is not None and instance.model != ask.model):
        what = f"{seen.kind} of {seen.instance!r}"
        return ControlRefused("key_reused", f"idempotency key {ask.key!r} was used for a {what}")
    return Placed(seen.instance, existed=False)


def _refusal(failure: PlacementFailure) -> ControlRefused:
    """A placement failure as the typed refusal the asker gets."""
    match failure:
        case NotEnoughMemory(node=node, need=need, have=have, nodes=nodes):
            message = (
                f"not enough memory on node {node} (using {nodes} node(s)): need {need} bytes, "
                f"have {have} free (an exact fit is refused)"
            )
            return ControlRefused(failure.code, message, node=node, need=need, have=have)
        case UnsupportedSharding(reason=reason):
            return ControlRefused(failure.code, reason)
        case NoComputePort(node=node, first_port=first, last_port=last):
            return ControlRefused(
                failure.code,
                f"node {node} has no free compute port: {first}-{last} are all used by other "
                "instances' ranks on its host (widen its --compute-ports)",
                node=node,
            )
        case UnknownModel(model=model):
            return ControlRefused(failure.code, f"no model {model!r} is registered")
        case NoCandidateNodes(reason=reason):
            return ControlRefused(failure.code, reason)
        case PlacementInfoPending(nodes=nodes):
            waiting = ", ".join(nodes)
            return ControlRefused(
                failure.code,
                f"no memory reading (or, for pipeline/tensor, no compute ports) yet from "
                f"{waiting}; try again in a moment",
            )
