"""The cluster's control plane on a node: its handle on the replicated State (submit commands,
watch changes), placements and node removals decided by the leader, and the leader's duties
(node liveness, re-placement, removal). Pure decisions live in :mod:`skulk.cluster`; this
package is the I/O around them (Raft through :mod:`skulk.consensus`, the mesh, telemetry)."""

from ._control import CONTROL_METHOD, ClusterControl, ControlUnavailable, now_ms

__all__ = ["CONTROL_METHOD", "ClusterControl", "ControlUnavailable", "now_ms"]
