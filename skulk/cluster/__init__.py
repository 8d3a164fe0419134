"""The cluster layer's pure core: the replicated State, its commands and ``apply()``.

Nothing here does I/O (no Trio, no MLX, no clock): the leader decides (placement plans,
timestamps) and commits a :data:`~skulk.wire.cluster.ClusterCommand`; every replica runs
:func:`apply` on it and gets the same :class:`State`. :class:`ClusterMachine` adapts this to
the Raft ``StateMachine`` protocol; :func:`plan` is the leader's placement planner (its plans
become ``PlaceInstance`` commands); :func:`next_commands` is the leader's duties (upserts,
``down`` verdicts, re-placements, removals). ``skulk.control`` runs them on a live node.
Normative description: ``specs/cluster.md``.

Quick use::

    from skulk.cluster import State, apply
    from skulk.wire.cluster import UpsertNode

    state, result = apply(State(), UpsertNode("a", "127.0.0.1:8000", "127.0.0.1:9000", at=0))

Through Raft: a command travels as ``encode_command(command)`` (:data:`COMMAND_CODEC`); the
submitter reads ``decode_result(data)`` (:data:`RESULT_CODEC`). The leader's side::

    from skulk.cluster import plan, PlacementRequest, next_commands, LeaderView

:func:`plan` answers a :class:`Plan` or a typed :data:`PlacementFailure`
(:class:`NotEnoughMemory`, :class:`NoCandidateNodes`, ...); :func:`state_hash` is the State's
canonical digest (replicas compare it). :func:`node_health` derives a node's health (level and
reasons with remedies) from its telemetry and the State.
"""

from ._apply import COMMAND_CODEC, apply
from ._downloads import choose_downloader, download_commands, store_room
from ._duties import (
    LeaderView,
    Reachable,
    culprit_nodes,
    failed_nodes,
    next_commands,
)
from ._health import LATE_AFTER_S, HealthReason, NodeHealth, down_after_s, node_health
from ._machine import RESULT_CODEC, ClusterMachine, decode_result, encode_command
from ._placement import (
    ModelNeeds,
    NoCandidateNodes,
    NoComputePort,
    NodeCapacity,
    NotEnoughMemory,
    PlacementFailure,
    PlacementInfoPending,
    PlacementPolicy,
    PlacementRequest,
    Plan,
    UnknownModel,
    UnsupportedSharding,
    addresses_in_use,
    held_bytes,
    model_needs,
    node_capacities,
    plan,
)
from ._ports import MAX_COMPUTE_PORTS, usable_compute_ports
from ._state import (
    KEY_MAX_LENGTH,
    KEYS_KEPT,
    Instance,
    KeyedAsk,
    State,
    canonical_bytes,
    state_hash,
)

__all__ = [
    "COMMAND_CODEC",
    "KEYS_KEPT",
    "KEY_MAX_LENGTH",
    "LATE_AFTER_S",
    "MAX_COMPUTE_PORTS",
    "RESULT_CODEC",
    "ClusterMachine",
    "HealthReason",
    "Instance",
    "KeyedAsk",
    "LeaderView",
    "ModelNeeds",
    "NoCandidateNodes",
    "NoComputePort",
    "NodeCapacity",
    "NodeHealth",
    "NotEnoughMemory",
    "PlacementFailure",
    "PlacementInfoPending",
    "PlacementPolicy",
    "PlacementRequest",
    "Plan",
    "Reachable",
    "State",
    "UnknownModel",
    "UnsupportedSharding",
    "addresses_in_use",
    "apply",
    "canonical_bytes",
    "choose_downloader",
    "culprit_nodes",
    "decode_result",
    "down_after_s",
    "download_commands",
    "encode_command",
    "failed_nodes",
    "held_bytes",
    "model_needs",
    "next_commands",
    "node_capacities",
    "node_health",
    "plan",
    "state_hash",
    "store_room",
    "usable_compute_ports",
]
