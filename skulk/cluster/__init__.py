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
"""

from ._apply import apply
from ._duties import LeaderView, Reachable, failed_nodes, next_commands
from ._machine import ClusterMachine, decode_result, encode_command
from ._placement import (
    ModelNeeds,
    NoCandidateNodes,
    NodeCapacity,
    NotEnoughMemory,
    PlacementFailure,
    PlacementInfoPending,
    PlacementPolicy,
    PlacementRequest,
    Plan,
    ShardPlan,
    UnknownModel,
    model_needs,
    node_capacities,
    plan,
)
from ._state import Instance, Node, Runner, State, state_hash

__all__ = [
    "ClusterMachine",
    "Instance",
    "LeaderView",
    "ModelNeeds",
    "NoCandidateNodes",
    "Node",
    "NodeCapacity",
    "NotEnoughMemory",
    "PlacementFailure",
    "PlacementInfoPending",
    "PlacementPolicy",
    "PlacementRequest",
    "Plan",
    "Reachable",
    "Runner",
    "ShardPlan",
    "State",
    "UnknownModel",
    "apply",
    "decode_result",
    "encode_command",
    "failed_nodes",
    "model_needs",
    "next_commands",
    "node_capacities",
    "plan",
    "state_hash",
]
