"""Telemetry: every node's readings (memory, load, compute ports, fetches in progress), gossiped
over the federation mesh into one last-writer-wins view per node.

It sits above :mod:`skulk.federation` (the gossip driver reads and writes the mesh's links) and
below whoever shows or plans with the readings (``serve``, the API, the control plane).

The sans-IO core: a lattice of entries and the store one node keeps of it::

    from skulk.telemetry import TelemetryStore, TelemetryView, TelemetryConfig, next_epoch

    store = TelemetryStore(node_id, next_epoch(home))   # epoch: bumped once per start-up

See :mod:`skulk.telemetry._view` for the merge order, :mod:`skulk.telemetry._store` for expiry,
tombstones and caps, and :mod:`skulk.wire.telemetry` for the frames.

The gossip driver (the single consumer of ``mesh.events``) and this node's readings::

    from skulk.telemetry import TelemetryGossip, sample_readings, FetchBoard

    gossip = TelemetryGossip(mesh, store, lambda: sample_readings(node_id, listen, api))
    await nursery.start(gossip.run)
    gossip.nodes_json()  # the body of GET /v1/cluster/nodes

See :mod:`skulk.telemetry._gossip` for the rounds, the replies and what is skipped.
:class:`FetchBoard` collects this node's weight fetches in progress (and recent failed ones) for its
readings; :class:`TransferBoard` the whole models coming onto it (Hub downloads, spreads).
"""

from ._epoch import next_epoch
from ._fetchboard import FetchBoard
from ._gossip import DEFAULT_FANOUT, TelemetryGossip
from ._readings import sample_readings
from ._store import TelemetryConfig, TelemetryStore
from ._transferboard import TransferBoard
from ._view import TelemetryView

__all__ = [
    "DEFAULT_FANOUT",
    "FetchBoard",
    "TelemetryConfig",
    "TelemetryGossip",
    "TelemetryStore",
    "TelemetryView",
    "TransferBoard",
    "next_epoch",
    "sample_readings",
]
