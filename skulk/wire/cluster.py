"""Commands of the replicated cluster State, and their results (Raft command entries).

A :data:`ClusterCommand` is what the leader proposes; committed, every replica applies it with
:func:`skulk.cluster.apply`, which answers a :data:`ClusterResult` (``Applied`` or a typed
``Rejected``), carried back to the proposer as the entry's result bytes. Commands are concrete
decisions: timestamps (``at``, milliseconds since the Unix epoch) are the leader's clock,
written into the command, and a :class:`PlaceInstance` names every shard's node and layers, so
applying reads no clock, telemetry or randomness. ``specs/cluster.md`` states what each command
checks; ``specs/wire.cddl`` is the wire shape.
"""

from __future__ import annotations

from typing import Literal

import attrs

NodeStatus = Literal["up", "down", "left"]
Sharding = Literal["single", "pipeline", "tensor"]
"""``single`` is one shard holding every layer; ``pipeline`` splits layers across ranks;
``tensor`` splits every layer (each rank holds the full layer range)."""
InstanceStatus = Literal["placed", "failed"]
DownloadStatus = Literal["downloading", "failed"]
"""A Hub download a node runs for the cluster: ``downloading`` until its card is registered
(the entry is then dropped), or ``failed`` with a typed reason."""
RunnerPhase = Literal["pending", "fetching", "connecting", "loading", "ready", "failed", "stopped"]
"""``fetching``: the node is fetching the shard's weights from a peer; ``connecting``: the
runner is joining its instance's compute group (pipeline and tensor instances only)."""
RejectReason = Literal[
    "unknown_node",
    "node_not_up",
    "node_in_use",
    "unknown_model",
    "model_in_use",
    "duplicate_instance",
    "unknown_instance",
    "bad_shards",
    "bad_layers",
    "unknown_rank",
    "wrong_node",
    "bad_value",
    "undecodable",
    "duplicate_download",
    "model_exists",
    "unknown_download",
    "key_reused",
]


@attrs.frozen
class DemoSource:
    """The built-in demo model, generated from ``seed``."""

    seed: int


@attrs.frozen
class PathSource:
    """Weights in a local directory (the same path on every node that runs a shard)."""

    path: str


@attrs.frozen
class HubSource:
    """A model from the Hugging Face Hub: ``repo`` (``org/name``) at ``commit`` (the 40-hex
    commit the asked revision resolved to). Peers fetch it from its holders by manifest hash."""

    repo: str
    commit: str


@attrs.frozen
class ImportedSource:
    """A local model directory imported into a node's model store by content; ``origin`` is
    the path it was imported from on that node (shown to people only: peers fetch it from its
    holders by manifest hash, never by path)."""

    origin: str


ModelSource = DemoSource | PathSource | HubSource | ImportedSource


@attrs.frozen
class Architecture:
    family: str
    layers: int
    hidden_size: int
    heads: int
    kv_heads: int
    vocab: int


@attrs.frozen
class ModelCard:
    id: str
    source: ModelSource
    architecture: Architecture
    weight_bytes: int
    context_length: int
    manifest_sha256: str | None = None
    """sha256 (hex) of the model's weight manifest (:mod:`skulk.models`): every file and
    tensor with its byte range and hash; a node fetching weights from a peer checks the
    manifest against this, then every byte against the manifest. ``None`` for the demo model
    (every node generates it)."""
    holders: tuple[str, ...] = ()
    """Nodes known to hold the whole model (sorted): where peers fetch its weights from."""


@attrs.frozen
class Download:
    """Node ``node`` downloads Hub model ``model`` (the card id it will register: ``org/repo``,
    or ``org/repo@revision`` for a revision other than the default) from ``repo`` at
    ``commit``; ``total_bytes`` is the size the check found. ``reason`` is a ``failed``
    download's typed failure (``disk_full``, ``hub_unreachable``, ``hash_mismatch``,
    ``node_down``, a :class:`skulk.hub.HubError` reason), ``detail`` says more."""

    model: str
    repo: str
    commit: str
    node: str
    total_bytes: int
    status: DownloadStatus
    changed_at: int
    reason: str | None = None
    detail: str = ""


@attrs.frozen
class Shard:
    """Rank ``rank`` of an instance runs on ``node`` and holds layers ``[start, end)``."""

    rank: int
    node: str
    start: int
    end: int
    address: str = ""
    """Where this rank's runner joins the instance's compute group (``host:port`` of the
    ``mlx.distributed`` ring), chosen at placement; empty for a ``single`` instance."""


@attrs.frozen
class ClusterConfig:
    """Cluster-wide settings the leader's placement uses (integers: replicas compare them
    exactly). ``overhead_percent``: weights * this / 100; ``floor_bytes``: kept free per node."""

    overhead_percent: int = 120
    floor_bytes: int = 512 * 1024 * 1024
    node_down_after_ms: int = 5000
    node_remove_after_ms: int = 600_000


# ---- commands ------------------------------------------------------------------------------------


@attrs.frozen
class UpsertNode:
    """A node joined (or rejoined, or changed addresses): it is ``up`` as of ``at``."""

    node: str
    api_address: str
    federation_address: str
    at: int


@attrs.frozen
class NodeStatusChanged:
    """The leader's verdict on a known node: ``up``, ``down`` or ``left`` as of ``at``.
    Instances on it are kept; moving them is a later, separate decision."""

    node: str
    status: NodeStatus
    at: int


@attrs.frozen
class RemoveNode:
    """Forget a node for good; refused while any instance has a shard on it."""

    node: str


@attrs.frozen
class RegisterModel:
    """Add a model card, or replace one that no instance uses; a card equal to the one in use
    but for ``holders`` adds its holders (another node has the whole model now)."""

    card: ModelCard


@attrs.frozen
class PlaceInstance:
    """The leader's concrete plan: ``instance`` of ``model`` with these shards, as of ``at``
    (``replaces``: instead of that instance, atomically)."""

    instance: str
    model: str
    sharding: Sharding
    shards: tuple[Shard, ...]
    at: int
    replaces: str | None = None
    """A move: this existing instance is deleted in the same step (refused if it is gone), so
    a re-placement never leaves two instances, whatever is retried or committed late."""
    key: str | None = None
    """The asker's idempotency key: applied, the State remembers it with this instance
    (:class:`~skulk.cluster.KeyedAsk`), and a later ``PlaceInstance`` with the same key changes
    nothing (a retry of a placement that was committed already)."""


@attrs.frozen
class DeleteInstance:
    """Remove an instance and its runner records. With ``key`` (the asker's idempotency key),
    the State remembers the deletion, and a repeat with the same key and instance changes
    nothing and is ``Applied`` again, even though the instance is gone."""

    instance: str
    key: str | None = None


@attrs.frozen
class SetInstanceStatus:
    """Mark an instance ``failed`` (no node left to run it) or ``placed`` again."""

    instance: str
    status: InstanceStatus
    at: int


@attrs.frozen
class ReportRunner:
    """The node running rank ``rank`` of ``instance`` reports a phase change (never per-token
    traffic); ``failure`` is a snake_case reason when ``phase`` is ``failed``."""

    instance: str
    rank: int
    node: str
    phase: RunnerPhase
    failure: str | None
    at: int


@attrs.frozen
class SetConfig:
    config: ClusterConfig


@attrs.frozen
class StartDownload:
    """Node ``node`` downloads ``model`` from the Hub (``repo`` at ``commit``, ``total_bytes``):
    the leader's choice. Replaces a ``failed`` entry of the same model and node; refused
    (``duplicate_download``) while another node downloads the model, and (``model_exists``)
    once the model has a card."""

    model: str
    repo: str
    commit: str
    node: str
    total_bytes: int
    at: int


@attrs.frozen
class DownloadFailed:
    """``node``'s download of ``model`` ended in a terminal failure (``reason``, ``detail``):
    its entry becomes ``failed``, and the leader re-places the download away from it."""

    model: str
    node: str
    reason: str
    detail: str
    at: int


@attrs.frozen
class ReleaseModel:
    """``node`` no longer holds ``model`` (its store evicted or removed it): it leaves the
    card's holders, so no peer asks it for the model's weights. Idempotent."""

    model: str
    node: str


ClusterCommand = (
    UpsertNode
    | NodeStatusChanged
    | RemoveNode
    | RegisterModel
    | PlaceInstance
    | DeleteInstance
    | SetInstanceStatus
    | ReportRunner
    | SetConfig
    | StartDownload
    | DownloadFailed
    | ReleaseModel
)

# ---- results -------------------------------------------------------------------------------------


@attrs.frozen
class Applied:
    """The command changed the State (or left it equal, for an idempotent repeat)."""


@attrs.frozen
class Rejected:
    """The command was refused and the State is unchanged; ``detail`` is for humans."""

    reason: RejectReason
    detail: str


ClusterResult = Applied | Rejected

# ---- calls to the leader (rpc ``control.call``) --------------------------------------------------


@attrs.frozen
class PlacementAsk:
    """Any node asks the leader to plan (and, unless ``dry_run``, commit) an instance;
    ``if_absent``: only if the model has no instance yet (``--model M`` is idempotent).
    ``key``: the idempotency key (the HTTP client's ``Idempotency-Key``, else one the asking
    node chose): an ask whose key the State already holds answers the instance that key
    placed, and plans nothing (a retry after a lost answer places no second instance)."""

    model: str
    sharding: Sharding
    nodes: tuple[str, ...]
    excluded_nodes: tuple[str, ...]
    min_nodes: int
    max_nodes: int | None
    dry_run: bool
    if_absent: bool
    key: str | None = None


@attrs.frozen
class RemoveNodeAsk:
    """Any node asks the leader to remove ``node`` for good (State and Raft membership)."""

    node: str


@attrs.frozen
class PullAsk:
    """Make sure Hub model ``model`` (``repo`` at ``commit``, ``total_bytes``, as the asking
    node's check found them) gets into the cluster: the leader answers :class:`Pulling`
    (``existed``: a card or a running download was already there) after committing a
    :class:`StartDownload` on the node it chooses (an up node with room for ``total_bytes``,
    the most free store space first, ``prefer`` first among equals), or refuses
    (``disk_full`` with ``need``/``have`` when no node has room)."""

    model: str
    repo: str
    commit: str
    total_bytes: int
    prefer: tuple[str, ...] = ()


ControlCall = PlacementAsk | RemoveNodeAsk | PullAsk


@attrs.frozen
class PlannedShard:
    rank: int
    node: str
    start: int
    end: int
    need_bytes: int
    available_bytes: int
    address: str = ""
    """The rank's compute-group address (``host:port``); empty for a ``single`` plan."""


@attrs.frozen
class Planned:
    """A dry run's plan (nothing committed)."""

    model: str
    sharding: Sharding
    shards: tuple[PlannedShard, ...]


@attrs.frozen
class Placed:
    """The instance is committed (``existed``: an ``if_absent`` ask found one already)."""

    instance: str
    existed: bool


@attrs.frozen
class NodeRemoved:
    node: str


@attrs.frozen
class ControlRefused:
    """A typed refusal: a placement failure's name (``not_enough_memory`` with ``node``,
    ``need``, ``have``; ``no_candidate_nodes``; ``unknown_model``; ``placement_info_pending``;
    ``unsupported_sharding``; ``no_compute_port`` with ``node``), a State rejection's reason,
    or ``not_leader`` / ``no_quorum`` / ``unavailable`` (the leader's Raft storage failed)."""

    code: str
    message: str
    node: str | None = None
    need: int | None = None
    have: int | None = None


@attrs.frozen
class Pulling:
    """The answer to a :class:`PullAsk`: ``node`` downloads ``model`` (``None`` when the model
    already has a card: nothing to download); ``existed``: nothing new was committed."""

    model: str
    node: str | None
    existed: bool


ControlReply = Planned | Placed | NodeRemoved | Pulling | ControlRefused
