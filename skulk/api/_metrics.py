"""``GET /metrics``: this node's Prometheus metrics (:class:`~skulk.metrics.NodeMetrics`), in
the Prometheus text format.

Like every route but ``/health`` it needs the API key when keys are set (Prometheus sends one
with ``authorization: {credentials: …}`` in its scrape config, as ``Authorization: Bearer``).
The families read at scrape time from this node's parts are in
:mod:`skulk.api._metric_sources`; :func:`install_metrics_route` sets the sources the app
itself knows of (engine and runners, Raft and its traffic, links, gossip, the State
and its size (:mod:`skulk.api._state_cost`)), ``skulk.serve`` the
others (routing, weight transfers).
"""

from __future__ import annotations

from functools import partial

from quart import Response
from quart_trio import QuartTrio

from skulk.api._metric_sources import (
    consensus_families,
    control_families,
    gossip_families,
    link_families,
    raft_transport_families,
    service_families,
)
from skulk.api._node_routes import LocalServices
from skulk.api._state_cost import StateCostSource
from skulk.cluster import State
from skulk.consensus import ConsensusService
from skulk.control import ClusterControl
from skulk.federation import Mesh
from skulk.metrics import CONTENT_TYPE, NodeMetrics
from skulk.telemetry import TelemetryGossip


def install_metrics_route(
    app: QuartTrio,
    metrics: NodeMetrics,
    local: LocalServices,
    *,
    consensus: ConsensusService[State] | None = None,
    cluster: Mesh | None = None,
    gossip: TelemetryGossip | None = None,
    control: ClusterControl | None = None,
) -> None:
    """Add ``GET /metrics`` to ``app``, serving ``metrics`` with the sources of the parts
    given (those not given are left out)."""
    metrics.set_source("services", partial(service_families, local))
    if consensus is not None:
        metrics.set_source("raft", partial(consensus_families, consensus.driver.statistics))
        metrics.set_source(
            "raft_transport", partial(raft_transport_families, consensus.transport.statistics)
        )
    if cluster is not None:
        metrics.set_source("links", partial(link_families, cluster.links))
    if gossip is not None:
        metrics.set_source("gossip", partial(gossip_families, gossip))
    if control is not None:
        metrics.set_source("state", partial(control_families, control))
        metrics.set_source("state_cost", StateCostSource(control))

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), status=200, content_type=CONTENT_TYPE)
