"""The placement planner: where an instance of a model should run (pure, sans-IO).

:func:`plan` takes what the leader knows — the models (:class:`ModelNeeds`), every node's
committed status and free memory from telemetry (:class:`NodeCapacity`) and the request
(:class:`PlacementRequest`) — and answers a concrete :class:`Plan` (which node runs which rank
and which layers) or a typed :data:`PlacementFailure` carrying the arithmetic. It reads no
clock, no randomness and no global state: the same inputs give the same plan on any machine,
ties broken by node id, so the leader can commit the plan and every replica checks it alike.

Memory admission, per node: ``need = ceil(weights * share * overhead) + ceil(kv_bytes_per_token
* context_length * share) + floor``, where ``share`` is the fraction of the model the node holds
(its layers / all layers for a pipeline shard, ``1/n`` for a tensor shard, ``1`` alone). A node
is admitted only if ``need < available``: an exact fit is refused (nothing would be left for
activations, the runtime or the operating system).

Choices, in order: the fewest nodes that fit (from ``min_nodes``); among nodes, the ones with
the most free memory (then the smaller node id); rank 0 is the node with the most free memory.
A pipeline's layers are split in proportion to free memory (largest remainders, every rank at
least one layer, contiguous ranges in rank order).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from ..wire.cluster import ClusterConfig, ModelCard, PlaceInstance, Shard, Sharding
from ._state import State

#: Bytes per KV-cache element the planner reserves for (fp16/bf16 caches).
KV_ELEMENT_BYTES = 2


@attrs.frozen
class ModelNeeds:
    """What placing a model costs: its weights, layers and KV cache per token of context."""

    model: str
    weight_bytes: int
    layers: int
    context_length: int
    kv_bytes_per_token: int
    """KV-cache bytes one token of context takes across all layers."""


def model_needs(card: ModelCard) -> ModelNeeds:
    """What placing ``card``'s model costs; the KV cache per token is keys and values of
    ``kv_heads * (hidden_size / heads)`` elements in every layer."""
    arch = card.architecture
    head_dim = arch.hidden_size // arch.heads
    kv = 2 * arch.layers * arch.kv_heads * head_dim * KV_ELEMENT_BYTES
    return ModelNeeds(card.id, card.weight_bytes, arch.layers, card.context_length, kv)


@attrs.frozen
class NodeCapacity:
    """A node as the planner sees it: committed ``up`` or not, and its free memory from
    telemetry (``None``: no reading has arrived yet)."""

    node: str
    up: bool
    available_bytes: int | None


def node_capacities(state: State, free_bytes: Mapping[str, int]) -> tuple[NodeCapacity, ...]:
    """Every node of ``state`` (``up`` as committed) with its free memory from a telemetry
    snapshot ``free_bytes`` (a node missing there has no reading yet)."""
    return tuple(NodeCapacity(n.id, n.status == "up", free_bytes.get(n.id)) for n in state.nodes)


@attrs.frozen
class PlacementPolicy:
    overhead: float = 1.2
    """Weights take this factor more than their file size once loaded (buffers, fragmentation)."""
    floor_bytes: int = 256 * 1024 * 1024
    """Kept free on every node beyond the model's own need."""

    @classmethod
    def from_config(cls, config: ClusterConfig) -> PlacementPolicy:
        """The policy the committed cluster config sets."""
        return cls(overhead=config.overhead_percent / 100, floor_bytes=config.floor_bytes)


@attrs.frozen
class PlacementRequest:
    model: str
    sharding: Sharding = "single"
    nodes: tuple[str, ...] = ()
    """Pin: use only these nodes (empty: any)."""
    excluded_nodes: tuple[str, ...] = ()
    min_nodes: int = 1
    max_nodes: int | None = None


@attrs.frozen
class ShardPlan:
    rank: int
    node: str
    layers: tuple[int, int]
    """The half-open range ``[start, end)`` of the model's layers this rank runs."""
    need_bytes: int
    available_bytes: int


@attrs.frozen
class Plan:
    model: str
    sharding: Sharding
    shards: tuple[ShardPlan, ...]

    def command(self, instance: str, at: int) -> PlaceInstance:
        """The command that commits this plan as ``instance`` (``at``: the leader's time)."""
        shards = tuple(Shard(s.rank, s.node, *s.layers) for s in self.shards)
        return PlaceInstance(instance, self.model, self.sharding, shards, at)


@attrs.frozen
class UnknownModel:
    model: str
    code: str = "unknown_model"


@attrs.frozen
class NoCandidateNodes:
    reason: str
    code: str = "no_candidate_nodes"


@attrs.frozen
class NotEnoughMemory:
    """The closest attempt did not fit: ``node`` needs ``need`` bytes and has ``have``."""

    node: str
    need: int
    have: int
    nodes: int
    """How many nodes that attempt used."""
    code: str = "not_enough_memory"


@attrs.frozen
class PlacementInfoPending:
    """No plan fits the nodes with telemetry, and these candidates have none yet: try again in
    a moment (the API answers 503, not an error)."""

    nodes: tuple[str, ...]
    code: str = "placement_info_pending"


PlacementFailure = UnknownModel | NoCandidateNodes | NotEnoughMemory | PlacementInfoPending


def plan(
    request: PlacementRequest,
    models: Mapping[str, ModelNeeds],
    nodes: Sequence[NodeCapacity],
    policy: PlacementPolicy = PlacementPolicy(),
) -> Plan | PlacementFailure:
    """A plan for ``request``, or why there is none (see the module docstring)."""
    needs = models.get(request.model)
    if needs is None:
        return UnknownModel(request.model)
    candidates, failure = _candidates(request, nodes)
    if failure is not None:
        return failure
    known = [c for c in candidates if c.available_bytes is not None]
    pending = tuple(sorted(c.node for c in candidates if c.available_bytes is None))
    # Most free memory first, then node id: the order ranks and choices follow.
    known.sort(key=lambda c: (-(c.available_bytes or 0), c.node))
    low, high = _node_counts(request, needs, len(candidates))
    if low > high:
        return NoCandidateNodes(
            f"{request.sharding} needs {low} node(s), but only {high} can be used"
        )
    closest: NotEnoughMemory | None = None
    for n in range(low, min(high, len(known)) + 1):
        attempt = _attempt(request, needs, known[:n], policy)
        if isinstance(attempt, Plan):
            return attempt
        closest = attempt
    if pending:
        return PlacementInfoPending(pending)
    if closest is None:  # fewer nodes with readings than the minimum
        return NoCandidateNodes(f"{request.sharding} needs {low} node(s), {len(known)} are up")
    return closest


def _candidates(
    request: PlacementRequest, nodes: Sequence[NodeCapacity]
) -> tuple[list[NodeCapacity], NoCandidateNodes | None]:
    by_id = {n.node: n for n in nodes}
    if request.nodes:
        unknown = sorted(set(request.nodes) - by_id.keys())
        if unknown:
            return [], NoCandidateNodes(f"unknown node(s) pinned: {', '.join(unknown)}")
        pool = [by_id[n] for n in sorted(set(request.nodes))]
    else:
        pool = sorted(nodes, key=lambda n: n.node)
    excluded = set(request.excluded_nodes)
    up = [n for n in pool if n.up and n.node not in excluded]
    if not up:
        return [], NoCandidateNodes("no node is up and allowed (pinned, not excluded)")
    return up, None


def _node_counts(request: PlacementRequest, needs: ModelNeeds, available: int) -> tuple[int, int]:
    if request.sharding == "single":
        return 1, 1
    high = available if request.max_nodes is None else min(request.max_nodes, available)
    if request.sharding == "pipeline":
        high = min(high, needs.layers)  # every rank runs at least one layer
    return max(1, request.min_nodes), high


def _attempt(
    request: PlacementRequest,
    needs: ModelNeeds,
    chosen: Sequence[NodeCapacity],
    policy: PlacementPolicy,
) -> Plan | NotEnoughMemory:
    n = len(chosen)
    pipeline = request.sharding == "pipeline"
    if pipeline:
        counts = _split_layers(needs.layers, [c.available_bytes or 0 for c in chosen])
        starts = [sum(counts[:i]) for i in range(n)]
        ranges = [(start, start + count) for start, count in zip(starts, counts, strict=True)]
        shares = [count / needs.layers for count in counts]
    else:  # single, or tensor: every rank holds all layers and 1/n of each
        ranges = [(0, needs.layers)] * n
        shares = [1 / n] * n
    shards: list[ShardPlan] = []
    for rank, (node, layers, share) in enumerate(zip(chosen, ranges, shares, strict=True)):
        need = _need(needs, share, policy)
        have = node.available_bytes or 0
        if not need < have:
            return NotEnoughMemory(node.node, need, have, n)
        shards.append(ShardPlan(rank, node.node, layers, need, have))
    return Plan(request.model, request.sharding, tuple(shards))


def _need(needs: ModelNeeds, share: float, policy: PlacementPolicy) -> int:
    weights = math.ceil(needs.weight_bytes * share * policy.overhead)
    kv = math.ceil(needs.kv_bytes_per_token * needs.context_length * share)
    return weights + kv + policy.floor_bytes


def _split_layers(layers: int, weights: Sequence[int]) -> list[int]:
    """``layers`` split in proportion to ``weights``, each part at least 1, largest remainders
    first (ties to the earlier part); sums to ``layers``. Needs ``len(weights) <= layers``."""
    n = len(weights)
    spare = layers - n  # every part gets one layer first
    total = sum(weights)
    if total <= 0:
        exact = [spare / n] * n
    else:
        exact = [spare * w / total for w in weights]
    parts = [math.floor(x) for x in exact]
    order = sorted(range(n), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[: spare - sum(parts)]:
        parts[i] += 1
    return [p + 1 for p in parts]
