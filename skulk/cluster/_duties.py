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
   reported ``failed``, is placed again (one ``PlaceInstance`` of a new id that ``replaces``
   the old one: atomic, so a retry or a late commit never leaves two; the instances moved in
   one round plan against the memory the earlier ones took, and the memory the replaced
   instance holds counts as free: its runners stop when it is gone); when no node is left it
   is marked ``failed`` instead (``SetInstanceStatus``), never relaunched in an endless loop.
   A ``failed`` instance is tried again when a plan fits (a node came back or joined), and is
   ``placed`` again if its runners recover where they are (a crash-looping runner's cool-down
   try succeeded). Which nodes the new plan avoids:

   * a ``single`` instance avoids its failed or down node, and every node in the view's
     ``avoid`` for the model;
   * a ``pipeline`` or ``tensor`` instance is re-placed whole, with the same number of ranks
     and fresh compute addresses, whichever rank failed (one rank cannot rejoin a group whose
     others are gone). Its **culprits** are its nodes that are down and those whose runner
     failed for a reason of its own; a rank that failed with a :data:`VICTIM_FAILURES` reason
     (it waited on a peer that stalled, or lost one) is not one. A culprit is avoided only once
     it has failed the model :data:`EXCLUDE_AFTER` times (the view's ``strikes`` plus this
     one), so a one-off crash re-places on the same nodes. While only victims have reported,
     the instance waits up to :data:`CULPRIT_WAIT_MS` for the culprit's own report (a rank
     that never joined, or crashed, says so a moment after its peers give up on it).
4. **Downloads** (:mod:`skulk.cluster._downloads`): a running Hub download whose node is no
   longer up fails ``node_down``; a model whose downloads all failed is downloaded again on
   another node with room (the view's ``store_room``).
5. **Removal**: a node ``down`` for ``node_remove_after_ms`` that holds no shard is removed
   from the State (``RemoveNode``); the loop also takes it out of the Raft membership.

Nothing here reads a clock or draws randomness: ``now_ms`` and ``fresh_ids`` come from the
caller, so the same view gives the same commands (tests drive every branch).
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping

import attrs

from ..wire.cluster import (
    ClusterCommand,
    NodeStatusChanged,
    RemoveNode,
    SetInstanceStatus,
    UpsertNode,
)
from ..wire.telemetry import ComputePorts
from ._downloads import download_commands
from ._placement import (
    PlacementPolicy,
    PlacementRequest,
    Plan,
    addresses_in_use,
    held_bytes,
    model_needs,
    node_capacities,
    plan,
)
from ._state import Instance, State

#: Runner failures that mark a rank a victim of a peer, not a culprit: it waited on a
#: collective or on the group forming and another rank never came (``collective_timeout``,
#: ``group_connect_timeout``), a peer's connection dropped (``collective_failed``: a peer
#: died), or rank 0 ended the group (``group_stopped``).
VICTIM_FAILURES = frozenset(
    {"collective_timeout", "group_connect_timeout", "collective_failed", "group_stopped"}
)
#: A rank's failure that says the model cannot be split this way (no re-placement helps).
UNSUPPORTED = "unsupported_sharding"
#: How many failures of a distributed instance a node causes before the model avoids it.
EXCLUDE_AFTER = 2
#: How long a distributed instance whose only failed ranks are victims waits for the culprit's
#: own report before it is re-placed anyway (a stalled rank may never report in time).
CULPRIT_WAIT_MS = 2000


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
    """Per model: nodes kept out of its next placements (where its single runners failed)."""
    compute: Mapping[str, ComputePorts] = attrs.field(factory=dict)
    """Compute ports per node from telemetry (a node missing here advertised none yet)."""
    strikes: Mapping[str, Mapping[str, int]] = attrs.field(factory=dict)
    """Per model: how many failures of its pipeline/tensor instances each node was the
    culprit of (see the module doc), counted by the leader while it leads."""
    tensor_families: frozenset[str] | None = None
    """The model families tensor sharding works for (``None``: not checked)."""
    store_room: Mapping[str, int] = attrs.field(factory=dict)
    """Room per node in its model store, from telemetry (for Hub downloads)."""
    failed_for_ms: Mapping[str, int] = attrs.field(factory=dict)
    """Per instance with a failed runner: for how long the leader has seen one (its own
    monotonic clock, from when it first saw it while leading)."""


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
    taken = set(addresses_in_use(state))  # ... and its compute addresses
    for instance in state.instances:
        commands.extend(_replace(state, instance, usable, view, free, taken, now_ms, fresh_ids))
    commands.extend(download_commands(state, usable, view.store_room, now_ms))
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


def culprit_nodes(state: State, instance: Instance, down: Collection[str] = ()) -> frozenset[str]:
    """The nodes to blame for ``instance``'s failure: those of its shards that are not ``up``
    (in ``state``, or in ``down``: verdicts not committed yet) and those whose runner failed
    for a reason other than a :data:`VICTIM_FAILURES` one."""
    up = {n.id for n in state.nodes if n.status == "up"} - set(down)
    gone = {s.node for s in instance.shards if s.node not in up}
    own = {
        r.node
        for r in state.runners
        if r.instance == instance.id and r.phase == "failed" and r.failure not in VICTIM_FAILURES
    }
    return frozenset(gone | own)


def _unservable(state: State, instance: Instance) -> bool:
    """Whether a rank of ``instance`` refused its shard as ``unsupported_sharding`` (a model
    the runner cannot split that way, though the planner let it through): re-placing the same
    split elsewhere cannot help, and no node is to blame."""
    return any(
        r.instance == instance.id and r.phase == "failed" and r.failure == UNSUPPORTED
        for r in state.runners
    )


def _awaiting_culprit(
    state: State, instance: Instance, down: Collection[str], view: LeaderView
) -> bool:
    """Whether the only failures of distributed ``instance`` so far are victims' (a peer
    stalled or died), its nodes are all up, and the leader has seen them for less than
    :data:`CULPRIT_WAIT_MS`: the rank that caused them usually reports its own failure a
    moment later, and re-placing before it does would blame no one. The wait runs on the
    leader's monotonic clock (``view.failed_for_ms``), never on the committed ``changed_at``
    stamps: those come from the wall clocks of whichever leaders wrote them."""
    if any(s.node in down for s in instance.shards):
        return False
    failed = [r for r in state.runners if r.instance == instance.id and r.phase == "failed"]
    if not failed or any(r.failure not in VICTIM_FAILURES for r in failed):
        return False
    return view.failed_for_ms.get(instance.id, 0) < CULPRIT_WAIT_MS


def _replace(
    state: State,
    instance: Instance,
    usable: set[str],
    view: LeaderView,
    free: dict[str, int],
    taken: set[str],
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
    card = state.model(instance.model)
    if card is None:  # cannot happen: apply() keeps a used model's card
        return []
    avoid = set(view.avoid.get(instance.model, frozenset()))
    if instance.sharding == "single":
        avoid |= bad
    else:
        strikes = view.strikes.get(instance.model, {})
        down = {n.id for n in state.nodes if n.id not in usable}
        if _awaiting_culprit(state, instance, down, view):
            return []  # only victims have spoken: give the culprit's own report a moment
        if _unservable(state, instance):  # the model cannot be split so: no node is to blame
            return (
                []
                if instance.status == "failed"
                else [SetInstanceStatus(instance.id, "failed", now_ms)]
            )
        avoid |= {n for n, count in strikes.items() if count >= EXCLUDE_AFTER}
        avoid |= {
            n
            for n in culprit_nodes(state, instance, down)
            if strikes.get(n, 0) + 1 >= EXCLUDE_AFTER
        }
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
    trial = dict(free)  # the replaced instance's memory is freed once the move commits
    for node, held in held_bytes(card, instance).items():
        if node in trial:
            trial[node] += held
    result = plan(
        request,
        {card.id: model_needs(card)},
        node_capacities(up_now, trial, view.compute),
        PlacementPolicy.from_config(state.config, view.tensor_families),
        taken,
    )
    if isinstance(result, Plan):
        for shard in result.shards:
            trial[shard.node] -= shard.need_bytes
        free.update(trial)
        taken.update(s.address for s in result.shards if s.address)
        move = result.command(next(fresh_ids), now_ms)
        return [attrs.evolve(move, replaces=instance.id)]
    if instance.status == "placed":
        return [SetInstanceStatus(instance.id, "failed", now_ms)]
    return []
