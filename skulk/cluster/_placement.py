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

Pipeline and tensor ranks also get a compute address each (``host:port``, where the rank's
runner joins the instance's ``mlx.distributed`` ring): the node's advertised compute host and
the lowest port of its advertised range that no shard in the State uses on that host (the
caller passes those addresses as ``taken``) and no earlier rank of the plan took. A node that
has not advertised a compute range yet is pending, like one with no memory reading.

Sharding rules: pipeline works for any family (a generic slice of the model's layers), with at
most one rank per layer; tensor needs the family to have mlx-lm's ``shard()`` (the policy's
``tensor_families``, computed by the caller: the planner imports nothing) and a node count
that divides both the attention heads and the KV heads; counts that do not are skipped, and
when none in ``[min_nodes, max_nodes]`` does the answer is :class:`UnsupportedSharding` with
the arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import attrs

from ..wire.cluster import ClusterConfig, ModelCard, PlaceInstance, Shard, Sharding
from ..wire.telemetry import ComputePorts
from ._state import Instance, State

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
    family: str
    """The mlx-lm model family (``model_type``): tensor sharding needs its ``shard()``."""
    heads: int
    kv_heads: int


def model_needs(card: ModelCard) -> ModelNeeds:
    """What placing ``card``'s model costs; the KV cache per token is keys and values of
    ``kv_heads * (hidden_size / heads)`` elements in every layer."""
    arch = card.architecture
    head_dim = arch.hidden_size // arch.heads
    kv = 2 * arch.layers * arch.kv_heads * head_dim * KV_ELEMENT_BYTES
    return ModelNeeds(
        card.id,
        card.weight_bytes,
        arch.layers,
        card.context_length,
        kv,
        arch.family,
        arch.heads,
        arch.kv_heads,
    )


def held_bytes(card: ModelCard, instance: Instance) -> dict[str, int]:
    """The weight bytes each node holds for ``instance`` once its runners loaded: its layers'
    share of the weights (a pipeline or single rank), ``1/n`` of them (a tensor rank)."""
    held: dict[str, int] = {}
    for shard in instance.shards:
        if instance.sharding == "tensor":
            fraction = 1 / len(instance.shards)
        else:
            fraction = (shard.end - shard.start) / max(1, card.architecture.layers)
        held[shard.node] = held.get(shard.node, 0) + int(card.weight_bytes * fraction)
    return held


def addresses_in_use(state: State) -> frozenset[str]:
    """The compute addresses the State's instances hold (what a new plan must not reuse)."""
    return frozenset(s.address for i in state.instances for s in i.shards if s.address)


def compute_address(host: str, port: int) -> str:
    """``host:port`` (``[host]:port`` for an IPv6 host)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@attrs.frozen
class NodeCapacity:
    """A node as the planner sees it: committed ``up`` or not, its free memory from telemetry
    (``None``: no reading has arrived yet) and its advertised compute ports (``None``: none
    yet; only pipeline and tensor ranks need them)."""

    node: str
    up: bool
    available_bytes: int | None
    compute: ComputePorts | None = None


def node_capacities(
    state: State,
    free_bytes: Mapping[str, int],
    compute: Mapping[str, ComputePorts | None] | None = None,
) -> tuple[NodeCapacity, ...]:
    """Every node of ``state`` (``up`` as committed) with its free memory from a telemetry
    snapshot ``free_bytes`` (a node missing there has no reading yet) and its compute ports
    from ``compute`` (likewise)."""
    ports = compute or {}
    return tuple(
        NodeCapacity(n.id, n.status == "up", free_bytes.get(n.id), ports.get(n.id))
        for n in state.nodes
    )


@attrs.frozen
class PlacementPolicy:
    overhead: float = 1.2
    """Weights take this factor more than their file size once loaded (buffers, fragmentation)."""
    floor_bytes: int = 256 * 1024 * 1024
    """Kept free on every node beyond the model's own need."""
    tensor_families: frozenset[str] | None = None
    """The model families tensor sharding works for (mlx-lm has a ``shard()`` for them);
    ``None``: not checked."""

    @classmethod
    def from_config(
        cls, config: ClusterConfig, tensor_families: frozenset[str] | None = None
    ) -> PlacementPolicy:
        """The policy the committed cluster config sets."""
        return cls(
            overhead=config.overhead_percent / 100,
            floor_bytes=config.floor_bytes,
            tensor_families=tensor_families,
        )


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
    address: str = ""
    """Where the rank joins the compute group (``host:port``); empty for ``single``."""


@attrs.frozen
class Plan:
    model: str
    sharding: Sharding
    shards: tuple[ShardPlan, ...]

    def command(self, instance: str, at: int, key: str | None = None) -> PlaceInstance:
        """The command that commits this plan as ``instance`` (``at``: the leader's time;
        ``key``: the asker's idempotency key)."""
        shards = tuple(Shard(s.rank, s.node, *s.layers, s.address) for s in self.shards)
        return PlaceInstance(instance, self.model, self.sharding, shards, at, key=key)


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
    """No plan fits the nodes with telemetry, and these candidates have none yet (no memory
    reading, or — for a pipeline or tensor plan — no compute ports advertised): try again in a
    moment (the API answers 503, not an error)."""

    nodes: tuple[str, ...]
    code: str = "placement_info_pending"


@attrs.frozen
class UnsupportedSharding:
    """The model cannot be split this way: ``reason`` says why, with the arithmetic (a family
    without tensor support, heads that do not divide over any allowed rank count, more
    pipeline ranks than layers)."""

    reason: str
    code: str = "unsupported_sharding"


@attrs.frozen
class NoComputePort:
    """Every port of ``node``'s compute range ``[first_port, last_port]`` is taken by other
    instances' ranks on its host."""

    node: str
    first_port: int
    last_port: int
    code: str = "no_compute_port"


PlacementFailure = (
    UnknownModel
    | NoCandidateNodes
    | NotEnoughMemory
    | PlacementInfoPending
    | UnsupportedSharding
    | NoComputePort
)


def plan(
    request: PlacementRequest,
    models: Mapping[str, ModelNeeds],
    nodes: Sequence[NodeCapacity],
    policy: PlacementPolicy = PlacementPolicy(),
    taken: Collection[str] = frozenset(),
) -> Plan | PlacementFailure:
    """A plan for ``request``, or why there is none (see the module docstring). ``taken``:
    compute addresses in use (:func:`addresses_in_use`), never given to a new rank."""
    needs = models.get(request.model)
    if needs is None:
        return UnknownModel(request.model)
    if request.sharding == "tensor" and (family := _tensor_family(needs, policy)) is not None:
        return family
    candidates, failure = _candidates(request, nodes)
    if failure is not None:
        return failure
    distributed = request.sharding != "single"
    ports = _Ports(frozenset(taken))
    known: list[NodeCapacity] = []
    portless: list[NodeCapacity] = []
    missing: list[str] = []
    for c in candidates:
        if c.available_bytes is None or (distributed and c.compute is None):
            missing.append(c.node)
        elif distributed and not ports.free_on(c):
            portless.append(c)
        else:
            known.append(c)
    pending = tuple(sorted(missing))
    # Most free memory first, then node id: the order ranks and choices follow.
    known.sort(key=lambda c: (-(c.available_bytes or 0), c.node))
    low, high = _node_counts(request, len(candidates))
    if request.sharding == "pipeline" and low > needs.layers:
        return UnsupportedSharding(
            f"a pipeline gives every rank at least one layer: {needs.layers} layers do not "
            f"split over {low} ranks"
        )
    if request.sharding == "pipeline":
        high = min(high, needs.layers)
    if low > high:
        return NoCandidateNodes(
            f"{request.sharding} needs {low} node(s), but only {high} can be used"
        )
    counts = list(range(low, high + 1))
    if request.sharding == "tensor":
        counts = [n for n in counts if _divides(needs, n)]
        if not counts:
            return UnsupportedSharding(_heads_arithmetic(needs, range(low, high + 1)))
    closest: NotEnoughMemory | NoComputePort | None = None
    for n in (n for n in counts if n <= len(known)):
        attempt = _attempt(request, needs, known[:n], policy, ports)
        if isinstance(attempt, Plan):
            return attempt
        closest = attempt
    if pending:
        return PlacementInfoPending(pending)
    if closest is None and portless:
        first = portless[0]
        assert first.compute is not None
        return NoComputePort(first.node, first.compute.first_port, first.compute.last_port)
    if closest is None:  # fewer usable nodes than the minimum
        return NoCandidateNodes(f"{request.sharding} needs {low} node(s), {len(known)} are up")
    return closest


class _Ports:
    """Compute ports for one plan: the lowest port of a node's range whose address neither
    ``taken`` (the State's) nor an earlier rank of this plan holds."""

    def __init__(self, taken: frozenset[str]) -> None:
        self._taken = taken

    def free_on(self, node: NodeCapacity, also: Collection[str] = ()) -> str | None:
        compute = node.compute
        if compute is None:
            return None
        for port in range(compute.first_port, compute.last_port + 1):
            address = compute_address(compute.host, port)
            if address not in self._taken and address not in also:
                return address
        return None


def _tensor_family(needs: ModelNeeds, policy: PlacementPolicy) -> UnsupportedSharding | None:
    families = policy.tensor_families
    if families is None or needs.family in families:
        return None
    return UnsupportedSharding(
        f"tensor sharding uses mlx-lm's shard(), which the {needs.family!r} family does not "
        f"have; place {needs.model} as a pipeline (any family) or single"
    )


def _divides(needs: ModelNeeds, n: int) -> bool:
    return needs.heads % n == 0 and needs.kv_heads % n == 0


def _heads_arithmetic(needs: ModelNeeds, counts: range) -> str:
    """Why no count in ``counts`` splits ``needs``' heads evenly, count by count."""
    parts = []
    for n in counts[:4]:
        bad = []
        if needs.heads % n:
            bad.append(f"{needs.heads} heads")
        if needs.kv_heads % n:
            bad.append(f"{needs.kv_heads} kv heads")
        parts.append(f"{' and '.join(bad)} do not divide over {n} ranks")
    more = f"; nor over {counts[4]}..{counts[-1]} ranks" if len(counts) > 4 else ""
    return (
        f"tensor sharding splits attention heads evenly over the ranks: {'; '.join(parts)}"
        f"{more} (use min_nodes/max_nodes for a count that divides, or a pipeline)"
    )


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


def _node_counts(request: PlacementRequest, available: int) -> tuple[int, int]:
    if request.sharding == "single":
        return 1, 1
    high = available if request.max_nodes is None else min(request.max_nodes, available)
    return max(2, request.min_nodes), high  # a sharded instance has two ranks at least


def _attempt(
    request: PlacementRequest,
    needs: ModelNeeds,
    chosen: Sequence[NodeCapacity],
    policy: PlacementPolicy,
    ports: _Ports,
) -> Plan | NotEnoughMemory | NoComputePort:
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
        address = ""
        if request.sharding != "single":
            found = ports.free_on(node, [s.address for s in shards])
            if found is None:  # nodes sharing a host: earlier ranks took its last ports
                assert node.compute is not None
                return NoComputePort(node.node, node.compute.first_port, node.compute.last_port)
            address = found
        shards.append(ShardPlan(rank, node.node, layers, need, have, address))
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
