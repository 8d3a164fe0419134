"""The replicated cluster State: a frozen value, canonical so equal States are equal bytes.

Every collection is a tuple sorted by its key (node id, model id, instance id, (instance,
rank)), never a dict or a set: two replicas that applied the same commands hold equal States
that hash equally (:func:`state_hash`) and encode to the same snapshot.
"""

from __future__ import annotations

import hashlib
from typing import Literal

import attrs
import cbor2

from ..wire import Codec
from ..wire.cluster import (
    ClusterConfig,
    Download,
    InstanceStatus,
    ModelCard,
    NodeStatus,
    RunnerPhase,
    Shard,
    Sharding,
)


@attrs.frozen
class Node:
    """A cluster member: where its API and federation listeners are, and its committed
    ``status`` with the leader's time of the last change (``changed_at``, ms since epoch)."""

    id: str
    api_address: str
    federation_address: str
    status: NodeStatus
    changed_at: int


@attrs.frozen
class Instance:
    """A placed model: ``shards`` in rank order (0..n-1), each with its node and layers."""

    id: str
    model: str
    sharding: Sharding
    shards: tuple[Shard, ...]
    status: InstanceStatus
    changed_at: int


@attrs.frozen
class Runner:
    """Rank ``rank`` of ``instance`` as last reported by its node (``pending`` until then)."""

    instance: str
    rank: int
    node: str
    phase: RunnerPhase
    failure: str | None
    changed_at: int


KEYS_KEPT = 1024
"""How many idempotency keys the State remembers (:class:`KeyedAsk`): the newest; the oldest
is forgotten when a keyed command adds one more."""
KEY_MAX_LENGTH = 255
"""The longest idempotency key a command may carry (characters)."""


@attrs.frozen
class KeyedAsk:
    """An idempotency key the State remembers: a ``place`` or ``delete`` of ``instance``
    committed with it; ``order`` numbers keyed commands (the oldest key goes first)."""

    key: str
    kind: Literal["place", "delete"]
    instance: str
    order: int


@attrs.frozen
class State:
    """The whole cluster State. Build it with :func:`skulk.cluster.apply`, not by hand: the
    tuples must stay sorted by key and unique (``nodes`` by id, ``models`` by id,
    ``instances`` by id, ``runners`` by (instance, rank), ``downloads`` by (model, node),
    ``keys`` by key)."""

    nodes: tuple[Node, ...] = ()
    models: tuple[ModelCard, ...] = ()
    instances: tuple[Instance, ...] = ()
    runners: tuple[Runner, ...] = ()
    config: ClusterConfig = attrs.field(factory=ClusterConfig)
    downloads: tuple[Download, ...] = ()
    keys: tuple[KeyedAsk, ...] = ()
    """The last :data:`KEYS_KEPT` idempotency keys placements and deletions were committed
    with (a retried ask answers as the first did)."""

    def node(self, node_id: str) -> Node | None:
        return next((n for n in self.nodes if n.id == node_id), None)

    def model(self, model_id: str) -> ModelCard | None:
        return next((m for m in self.models if m.id == model_id), None)

    def instance(self, instance_id: str) -> Instance | None:
        return next((i for i in self.instances if i.id == instance_id), None)

    def download(self, model: str) -> Download | None:
        """The running (``downloading``) download of ``model``, if any."""
        return next(
            (d for d in self.downloads if d.model == model and d.status == "downloading"), None
        )

    def keyed(self, key: str) -> KeyedAsk | None:
        """What the idempotency key ``key`` was committed with, if the State remembers it."""
        return next((k for k in self.keys if k.key == key), None)

    def downloads_of(self, model: str) -> tuple[Download, ...]:
        """Every download entry of ``model`` (running and failed), by node."""
        return tuple(d for d in self.downloads if d.model == model)


STATE_CODEC: Codec[State] = Codec(State, max_frame_size=256 * 1024 * 1024)
"""The strict codec for a State image (tagged map, like a frame)."""


def canonical_bytes(state: State) -> bytes:
    """``state`` as canonical CBOR: equal States give equal bytes."""
    return cbor2.dumps(STATE_CODEC.unstructure(state), canonical=True)


def state_hash(state: State) -> str:
    """sha256 (hex) of :func:`canonical_bytes`: replicas at the same applied index must agree."""
    return hashlib.sha256(canonical_bytes(state)).hexdigest()
