"""The cluster's control plane on a node: its handle on the replicated State (submit commands,
watch changes), placements and node removals decided by the leader, and the leader's duties
(node liveness, re-placement, removal). Pure decisions live in :mod:`skulk.cluster`; this
package is the I/O around them (Raft through :mod:`skulk.consensus`, the mesh, telemetry).

The tour:

- :class:`ClusterControl` (``_control``): the one object a node makes; serve its
  :meth:`~ClusterControl.handle_rpc` under :data:`CONTROL_METHOD` and start its ``run``.
  Inside: the asks the leader decides (``_asks``), what it sees (``_sight``), its duties
  (``_duties``), and which model families tensor sharding works for (``_families``).
- :class:`ControlUnavailable`: the cluster cannot decide now (no leader, no quorum).
- :func:`now_ms`: the clock committed timestamps use.
- :class:`PullStatus`, :class:`PullFailed` (``_pull``): pulling a Hub model into the cluster.
"""

from ._control import ClusterControl
from ._pull import PullFailed, PullStatus, hub_model_id
from ._rpc import CONTROL_METHOD, ControlUnavailable
from ._sight import now_ms

__all__ = [
    "CONTROL_METHOD",
    "ClusterControl",
    "ControlUnavailable",
    "PullFailed",
    "PullStatus",
    "hub_model_id",
    "now_ms",
]
