"""The cluster layer's pure core: the replicated State, its commands and ``apply()``.

Nothing here does I/O (no Trio, no MLX, no clock): the leader decides (placement plans,
timestamps) and commits a :data:`~skulk.wire.cluster.ClusterCommand`; every replica runs
:func:`apply` on it and gets the same :class:`State`. :class:`ClusterMachine` adapts this to
the Raft ``StateMachine`` protocol; :func:`plan` is the leader's placement planner (its plans
become ``PlaceInstance`` commands). Not yet wired into ``serve``: the consensus ``Registry``
still runs. Normative description: ``specs/cluster.md``.

Quick use::

    from skulk.cluster import State, apply
    from skulk.wire.cluster import UpsertNode

    state, result = apply(State(), UpsertNode("a", "127.0.0.1:8000", "127.0.0.1:9000", at=0))
"""

from ._apply import apply
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
    "Runner",
    "ShardPlan",
    "State",
    "UnknownModel",
    "apply",
    "decode_result",
    "encode_command",
    "model_needs",
    "node_capacities",
    "plan",
    "state_hash",
]
