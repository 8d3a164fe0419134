"""The leader's duties over the cluster State (pure): what to commit next, given what it sees.

The leader's control loop (``skulk.control``) gathers a :class:`LeaderView` — which nodes it can
reach and since when it could not reach the others, their addresses and free memory from
telemetry, the nodes each model must avoid — and asks :func:`next_commands` what to commit. The
answer is a short list of concrete commands (timestamps and instance ids are inputs), committed
in order; the loop asks again on its next tick, so each duty only has to make progress:

1. **Membership of the State**: a reachable node that State lacks, holds as not ``up``, or
   holds with other addresses is upserted (``UpsertNode``: ``up`` as of now).
2. **Down**: an ``up`` node unreachable for ``node_down_after_ms`` is committed ``down``.
3. **Re-placement**: an instance with a shard on a node that is not ``up``, or whose runner
   reported ``failed``, is placed again avoiding those nodes (one ``PlaceInstance`` of a new id
   that ``replaces`` the old one: atomic, so a retry or a late commit never leaves two; the
   instances moved in one round plan against the memory the earlier ones took); when no node
   is left it is marked ``failed`` instead (``SetInstanceStatus``), never relaunched in an
   endless loop. A ``failed`` instance is tried again when a plan fits (a node came back or
   joined), and is ``placed`` again if its runners recover where they are (a crash-looping
   runner's cool-down try succeeded).
4. **Removal**: a node ``down`` for ``node_remove_after_ms`` that holds no shard is removed
   from the State (``RemoveNode``); the loop also takes it out of the Raft membership.

Nothing here reads a clock or draws randomness: ``now_ms`` and ``fresh_ids`` come from the
caller, so the same view gives the same commands (tests drive every branch).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import attrs

from ..wire.cluster import (
    ClusterCommand,
    NodeStatusChanged,
    RemoveNode,
    SetInstanceStatus,
    UpsertNode,
)
from ._placement import (
    PlacementPolicy,
    PlacementRequest,
    Plan,
    model_needs,
    node_capacities,
    plan,
)
from ._state import Instance, State


@attrs.frozen
class Reachable:
    """A node the leader can reach now, with the addresses its telemetry gives."""

    api_address: str
    federation_address: str


@attrs.frozen
class LeaderView:
    """What the leader sees besides the State (see the module doc)."""

    reachable: Mapping[str, Reachable]
    """Nodes reachable now (the leader itself included) and their addresses."""
    unreachable_ms: Mapping[str, int]
    """For each node of the State that is not reachable: for how long it has not been."""
    free_bytes: Mapping[str, int]
    """Free memory per node from telemetry (a node missing here has no reading yet)."""
    avoid: Mapping[str, frozenset[str]] = attrs.field(factory=dict)
    """Per model: nodes where its runners failed, kept out of its next placements."""


def next_commands(
    state: State, view: LeaderView, now_ms: int, fresh_ids: Iterator[str]
) -> list[ClusterCommand]:
    """The commands the leader should commit now, in order (see the module doc)."""
    commands: list[ClusterCommand] = []
    config = state.config
    for node_id, seen in sorted(view.reachable.items()):
        node = state.node(node_id)
        if (
            node is None
            or node.status != "up"
            or (node.api_address, node.federation_address)
            != (seen.api_address, seen.federation_address)
        ):
            commands.append(UpsertNode(node_id, seen.api_address, seen.federation_address, now_ms))
    for node in state.nodes:
        if node.status == "up" and node.id not in view.reachable:
            if view.unreachable_ms.get(node.id, 0) >= config.node_down_after_ms:
                commands.append(NodeStatusChanged(node.id, "down", now_ms))
    down = {c.node for c in commands if isinstance(c, NodeStatusChanged)}
    usable = {n.id for n in state.nodes if n.status == "up" and n.id not in down}
    free = dict(view.free_bytes)  # each re-placement of this round takes its share
    for instance in state.instances:
        commands.extend(_replace(state, instance, usable, view, free, now_ms, fresh_ids))
    holding = {s.node for i in state.instances for s in i.shards}
    for node in state.nodes:
        if (
            node.status == "down"
            and node.id not in holding
            and view.unreachable_ms.get(node.id, 0) >= config.node_remove_after_ms
        ):
            commands.append(RemoveNode(node.id))
    return commands


def failed_nodes(state: State, instance: Instance) -> frozenset[str]:
    """The nodes whose runner of ``instance`` reported ``failed``."""
    return frozenset(
        r.node for r in state.runners if r.instance == instance.id and r.phase == "failed"
    )


def _replace(
    state: State,
    instance: Instance,
    usable: set[str],
    view: LeaderView,
    free: dict[str, int],
    now_ms: int,
    fresh_ids: Iterator[str],
) -> list[ClusterCommand]:
    bad = {s.node for s in instance.shards if s.node not in usable} | failed_nodes(state, instance)
    if not bad:  # every runner is where it should be and none failed (again)
        return (
            []
            if instance.status == "placed"
            else [SetInstanceStatus(instance.id, "placed", now_ms)]
        )
    avoid = bad | view.avoid.get(instance.model, frozenset())
    card = state.model(instance.model)
    if card is None:  # cannot happen: apply() keeps a used model's card
        return []
    request = PlacementRequest(
        instance.model,
        instance.sharding,
        excluded_nodes=tuple(sorted(avoid)),
        min_nodes=len(instance.shards) if instance.sharding != "single" else 1,
        max_nodes=len(instance.shards) if instance.sharding != "single" else None,
    )
    up_now = attrs.evolve(
        state, nodes=tuple(n for n in state.nodes if n.id in usable)
    )  # nodes this tick committed down are not candidates
    result = plan(
        request,
        {card.id: model_needs(card)},
        node_capacities(up_now, free),
        PlacementPolicy.from_config(state.config),
    )
    if isinstance(result, Plan):
        for shard in result.shards:
            free[shard.node] -= shard.need_bytes
        move = result.command(next(fresh_ids), now_ms)
        return [attrs.evolve(move, replaces=instance.id)]
    if instance.status == "placed":
        return [SetInstanceStatus(instance.id, "failed", now_ms)]
    return []
