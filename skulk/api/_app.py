"""The Quart-Trio application: it only wires. Each route family installs itself
(``install_*(app, ...)``): the client formats (OpenAI Chat Completions, Completions and
Responses; Anthropic Messages; Ollama; embeddings; the WebSocket), each through the router to
any model of the cluster; the node's health and diagnostics; the mesh and cluster routes; the
model routes (pulls, downloads, the model store); the OpenAPI document; ``/metrics``
(Prometheus); the dashboard at ``/`` (:mod:`skulk.api._dashboard`).

Every request runs under :class:`~skulk.api._guard.RequestGuard` (whole body first, one log
line, owned cleanup) and every error is the JSON envelope (:mod:`skulk.api._http_errors`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from quart_trio import QuartTrio

from skulk.api._anthropic_routes import install_anthropic_routes
from skulk.api._auth import install_api_keys
from skulk.api._cluster_routes import install_cluster_routes
from skulk.api._dashboard import install_dashboard
from skulk.api._diagnostic_routes import install_request_route, install_timeline_route
from skulk.api._embeddings import install_embedding_routes
from skulk.api._guard import RequestGuard
from skulk.api._http_errors import install_error_handlers
from skulk.api._json_body import MAX_BODY
from skulk.api._metrics import install_metrics_route
from skulk.api._model_routes import install_model_routes
from skulk.api._node_routes import LocalServices, install_mesh_routes, install_node_routes
from skulk.api._ollama_routes import install_ollama_routes
from skulk.api._openai_routes import install_openai_routes
from skulk.api._openapi import install_openapi_route
from skulk.api._serving import Generations, read_body
from skulk.api._ws import install_websocket_route
from skulk.cluster import State
from skulk.consensus import ConsensusService
from skulk.control import ClusterControl
from skulk.diagnostics import ClusterTimeline
from skulk.federation import Mesh
from skulk.routing import Router
from skulk.store import ModelStore
from skulk.telemetry import TelemetryGossip

#: How long a request body may take to arrive (408 after).
BODY_TIMEOUT = 60.0


def create_app(
    router: Router,
    local: LocalServices,
    *,
    control: ClusterControl | None = None,
    cluster: Mesh | None = None,
    gossip: TelemetryGossip | None = None,
    consensus: ConsensusService[State] | None = None,
    timeline: ClusterTimeline | None = None,
    api_keys: Sequence[str] = (),
    store: ModelStore | None = None,
) -> QuartTrio:
    """The HTTP API of a node: requests for any model go through ``router``; ``local`` are
    the instances this node runs (health, diagnostics); ``control`` adds the cluster routes
    and the model routes (pulls, downloads, stores); ``store`` is this node's model store
    (what ``GET /v1/store`` shows and ``DELETE /v1/store/{model}`` removes from); ``timeline``
    adds ``GET /v1/diagnostics/cluster/timeline``; ``api_keys``, when given, are required on
    every route but ``/health`` (:mod:`skulk.api._auth`)."""
    app = QuartTrio("skulk", static_folder=None)  # no /static route: every path is ours
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY
    app.config["BODY_TIMEOUT"] = BODY_TIMEOUT
    app.asgi_app = RequestGuard(  # type: ignore[method-assign,assignment]
        app.asgi_app,
        max_body=MAX_BODY,
        body_timeout=BODY_TIMEOUT,
        access_log=logging.getLogger("skulk.access"),
    )
    install_error_handlers(app)
    install_api_keys(app, api_keys)  # every route but /health needs a key, when keys are set
    if control is not None:
        readings = (
            (lambda: {n: e.readings for n, e in gossip.store.view.items()})
            if gossip is not None
            else None
        )
        install_cluster_routes(app, control, read_body, readings)
        install_model_routes(app, control, read_body, store=store, readings=readings)
    if timeline is not None:
        install_timeline_route(app, timeline)
        install_request_route(app, timeline)  # GET /v1/requests/{id}: one request, every node
    install_openapi_route(app, cluster=control is not None, timeline=timeline is not None)
    install_node_routes(app, router, local, consensus)
    install_mesh_routes(app, cluster, gossip, consensus, control)
    install_metrics_route(  # the router's metrics: it observes the requests
        app,
        router.metrics,
        local,
        consensus=consensus,
        cluster=cluster,
        gossip=gossip,
        control=control,
    )
    generations = Generations(app, router)
    install_openai_routes(app, router, generations)
    install_anthropic_routes(app, router, generations)
    install_ollama_routes(app, router, generations.start, read_body)
    install_embedding_routes(app, router, read_body)
    install_websocket_route(app, generations.start, generations.start_choices)
    install_dashboard(app, router.node_id)  # the page at / and its live feed
    return app
