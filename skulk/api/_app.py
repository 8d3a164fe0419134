"""The Quart-Trio application: the client formats' routes (OpenAI Chat Completions, Completions
and Responses, Anthropic Messages; any model of the cluster, through the router), health,
diagnostics, the cluster routes and the WebSocket endpoint.

Every request runs under :class:`~skulk.api._guard.RequestGuard` (whole body first, one log
line, owned cleanup) and every error is the JSON envelope (:mod:`skulk.api._http_errors`).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

import attrs
import trio
from quart import Response, request
from quart_trio import QuartTrio

from skulk.api._anthropic import parse_count_tokens, parse_messages
from skulk.api._auth import install_api_keys
from skulk.api._choices import choice_count, choice_params, complete_choices, open_choices
from skulk.api._cluster_routes import install_cluster_routes
from skulk.api._diagnostic_routes import install_timeline_route
from skulk.api._embeddings import install_embedding_routes
from skulk.api._guard import RequestGuard, close_with_request
from skulk.api._http_errors import install_error_handlers, json_response
from skulk.api._json_body import LARGE_BODY, MAX_BODY, parse_json_body
from skulk.api._ollama_routes import install_ollama_routes
from skulk.api._openai import ApiError, parse_chat_completions, parse_completions
from skulk.api._openapi import openapi_document
from skulk.api._responses_parse import parse_responses
from skulk.api._stream import (
    ROUTING_ERRORS,
    Items,
    Opened,
    Request,
    complete,
    count_prompt_tokens,
    open_stream,
    routing_error,
    sse_body,
)
from skulk.api._ws import serve_websocket
from skulk.cluster import State
from skulk.consensus import ConsensusService
from skulk.control import ClusterControl
from skulk.diagnostics import ClusterTimeline
from skulk.federation import Mesh, TelemetryGossip
from skulk.routing import ModelListing, Route, Router
from skulk.runner import Runner
from skulk.wire.runner import EngineStats
from skulk.worker import ModelService, ModelStatus

log = logging.getLogger("skulk.api")

#: How long a request body may take to arrive (408 after).
BODY_TIMEOUT = 60.0


class LocalServices(Protocol):
    """The model services this node runs, by instance id (:class:`~skulk.worker.Reconciler`)."""

    @property
    def services(self) -> Mapping[str, ModelService]: ...


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
) -> QuartTrio:
    """The HTTP API of a node: requests for any model go through ``router``; ``local`` are
    the instances this node runs (health, diagnostics); ``control`` adds the cluster routes;
    ``timeline`` adds ``GET /v1/diagnostics/cluster/timeline``; ``api_keys``, when given, are
    required on every route but ``/health`` (:mod:`skulk.api._auth`)."""
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
        install_cluster_routes(app, control, _body, readings)
    if timeline is not None:
        install_timeline_route(app, timeline)

    def only_service() -> ModelService | None:
        """The one instance this node runs, if it runs exactly one (the usual single node)."""
        services = list(local.services.values())
        return services[0] if len(services) == 1 else None

    @app.get("/openapi.json")
    async def openapi() -> Response:
        """The OpenAPI document of the routes installed here (behind the key, when set)."""
        document = openapi_document(cluster=control is not None, timeline=timeline is not None)
        return _json(document, 200)

    @app.get("/health")
    async def health() -> Response:
        body: dict[str, object] = {"node": router.node_id}
        services = dict(local.services)
        if (one := only_service()) is not None:
            body.update(_service_health(one.status()))
        body["instances"] = {i: svc.status().state for i, svc in sorted(services.items())}
        # Healthy while this node can serve something: a local instance is ready, or some
        # model is ready anywhere (routed there). One instance loading or failed beside a
        # ready one does not take the node out of a load balancer.
        healthy = any(svc.status().ready for svc in services.values()) or any(
            m.status == "ready" for m in router.models()
        )
        status = "ok" if healthy else (one.status().state if one else "no_ready_model")
        body["status"] = status
        if consensus is not None:
            raft = consensus.status_json()
            body["consensus"] = {k: raft[k] for k in ("healthy", "unavailable", "role", "leader")}
            if not raft["healthy"]:  # e.g. its disk is full: it takes no part in decisions
                healthy = False
                body["status"] = "consensus_unavailable"
        return _json(body, 200 if healthy else 503)

    @app.get("/v1/diagnostics/node")
    async def diagnostics() -> Response:
        services = dict(local.services)
        body: dict[str, object] = {}
        if (one := only_service()) is not None:
            body["model"] = attrs.asdict(one.status())
        body["instances"] = {i: attrs.asdict(svc.status()) for i, svc in sorted(services.items())}
        body["runners"] = [
            _runner_diagnostics(r) for svc in services.values() for r in svc.recent_runners()
        ]
        return _json(body, 200)

    @app.post("/v1/diagnostics/node/retry")
    async def retry() -> Response:
        """An operator's "try the failed models here again now" (ends crash-loop cool-downs)."""
        retried = [i for i, svc in sorted(local.services.items()) if svc.retry_now()]
        if not retried:
            raise ApiError(
                409,
                "no model on this node is failed: there is nothing to retry",
                type="invalid_request_error",
                code="not_failed",
            )
        return _json({"retrying": True, "instances": retried}, 202)

    @app.get("/v1/cluster/links")
    async def cluster_links() -> Response:
        return _json(cluster.links_json() if cluster is not None else {"links": []}, 200)

    @app.get("/v1/cluster/raft")
    async def cluster_raft() -> Response:
        if consensus is None:
            return _json({"error": {"message": "consensus is not running"}}, 503)
        return _json(consensus.status_json(), 200)

    @app.get("/v1/cluster/nodes")
    async def cluster_nodes() -> Response:
        """Every node: gossiped readings, and its committed status in the State."""
        rows = gossip.nodes_json()["nodes"] if gossip is not None else []
        assert isinstance(rows, list)
        state = control.state if control is not None else None
        seen = set()
        for row in rows:
            node = state.node(row["node_id"]) if state is not None else None
            row["status"] = node.status if node is not None else None
            seen.add(row["node_id"])
        for node in state.nodes if state is not None else ():
            if node.id not in seen:  # in the State, no readings (down for a while)
                rows.append({"node_id": node.id, "status": node.status, "age_s": None})
        return _json({"nodes": rows}, 200)

    def model_card(listing: ModelListing) -> dict[str, object]:
        card: dict[str, object] = {
            "id": listing.id,
            "object": "model",
            "created": 0,
            "owned_by": "skulk",
            "status": listing.status,
            "instances": list(listing.instances),
        }
        if listing.failure:
            card["failure"] = listing.failure
        if (registered := router.card(listing.id)) is not None:
            # the length of its embeddings (/v1/embeddings): the model's hidden size
            card["embedding_dimensions"] = registered.architecture.hidden_size
        return card

    @app.get("/v1/models")
    async def models() -> Response:
        return _json({"object": "list", "data": [model_card(m) for m in router.models()]}, 200)

    @app.get("/v1/models/<path:model_id>")
    async def model(model_id: str) -> Response:
        """One model card (``models.retrieve``); ids may contain slashes (``org/name``)."""
        found = next((m for m in router.models() if m.id == model_id), None)
        if found is None:
            raise ApiError.model_not_found(model_id)
        return _json(model_card(found), 200)

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Response:
        return await _generate(parse_chat_completions(await _body()).generate_request())

    @app.post("/v1/completions")
    async def completions() -> Response:
        return await _generate(parse_completions(await _body()).generate_request())

    @app.post("/v1/responses")
    async def responses() -> Response:
        return await _generate(parse_responses(await _body()))

    @app.post("/v1/messages")
    async def messages() -> Response:
        # ``anthropic-version`` is accepted whatever its value: we serve one shape of the
        # Messages API (see docs/api.md).
        return await _generate(parse_messages(await _body()))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens() -> Response:
        req = parse_count_tokens(await _body())
        route = _route(req)
        count = await count_prompt_tokens(router.count_tokens(route, req.prompt), req)
        return _routed(_json({"input_tokens": count}, 200), route)

    def start(req: Request) -> tuple[Route, Items]:
        """Route ``req`` and make its generation (not started); :class:`ApiError` when no
        instance can take it."""
        route = _route(req)
        return route, router.generate(route, req.prompt, req.params)

    def start_choices(req: Request) -> tuple[Route, list[Items]]:
        """Route ``req`` once and make the generation of each of its choices (not started),
        all on that instance (they batch on its runner), each with its own seed."""
        route = _route(req)
        params = choice_params(req.params, choice_count(req))
        return route, [router.generate(route, req.prompt, p) for p in params]

    def _route(req: Request) -> Route:
        try:
            return router.route(req.model)
        except ROUTING_ERRORS as exc:
            raise routing_error(exc) from None

    async def _generate(req: Request) -> Response:
        if choice_count(req) > 1:
            return await _generate_choices(req)
        route, items = start(req)
        if not req.stream:
            response = _json(await complete(items, req), 200)
        else:
            # Commit to a stream only once the first token (or the end) is here: an earlier
            # failure is a plain error response. The request owns the generation from here on,
            # so it is cancelled on the runner even if the response body is never iterated.
            opened = await open_stream(items, req)
            close_with_request(opened.aclose)
            response = _sse_response(opened)
        return _routed(response, route)

    async def _generate_choices(req: Request) -> Response:
        """As :func:`_generate`, for a request with several choices (:mod:`skulk.api._choices`)."""
        route, choices = start_choices(req)
        if not req.stream:
            response = _json(await complete_choices(choices, req), 200)
        else:
            # The choices run in tasks of the app's nursery, since the response body outlives
            # this handler; the request owns them, as a single generation above.
            opened = await open_choices(app.nursery, choices, req)
            close_with_request(opened.aclose)
            response = _sse_response(opened)
        return _routed(response, route)

    install_ollama_routes(app, router, start, _body)
    install_embedding_routes(app, router, _body)

    @app.websocket("/v1/ws")
    async def ws() -> None:
        await serve_websocket(start, start_choices)

    return app


def _sse_response(opened: Opened) -> Response:
    response = Response(sse_body(opened), status=200, content_type="text/event-stream")
    response.headers["Cache-Control"] = "no-cache"
    response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut long streams
    return response


def _routed(response: Response, route: Route) -> Response:
    """``response`` saying which instance and node served it."""
    response.headers["x-skulk-instance"] = route.instance
    response.headers["x-skulk-node"] = route.node
    return response


def _service_health(s: ModelStatus) -> dict[str, object]:
    """The health fields of one model service."""
    body: dict[str, object] = {
        "model": s.model_id,
        "state": s.state,
        "progress": {"loaded": s.loaded, "total": s.total},
        "restarts": s.restarts,
    }
    if s.failure_reason:
        body["failure"] = {"reason": s.failure_reason, "message": s.failure_message}
    body["breaker"] = {
        "state": s.breaker,
        "crash_loops": s.crash_loop_trips,
        "retry_in": s.retry_in,
    }
    return body


async def _body() -> object:
    """The request's JSON body, checked by :func:`parse_json_body` (400 otherwise); 415 for a
    body declared as something JSON cannot be (a form upload, an image). No Content-Type,
    ``text/plain`` and ``application/x-www-form-urlencoded`` — what ``curl -d`` sends unless
    told otherwise — are read as JSON."""
    mimetype = request.mimetype
    if mimetype and mimetype not in _READ_AS_JSON and not mimetype.endswith("+json"):
        raise ApiError.unsupported_media_type(mimetype)
    raw = await request.get_data(as_text=False)
    if len(raw) >= LARGE_BODY:  # megabytes of JSON would stall every stream on the loop
        return await trio.to_thread.run_sync(parse_json_body, raw)
    return parse_json_body(raw)


#: Content types whose bodies are read as JSON (besides ``…+json`` and none at all).
_READ_AS_JSON = frozenset({"application/json", "text/plain", "application/x-www-form-urlencoded"})


def _runner_diagnostics(runner: Runner) -> dict[str, object]:
    """A runner's state, deadlines and flight-recorder timeline, for operators."""
    failure = runner.failure
    return {
        **attrs.asdict(runner.statistics()),
        "failure": None
        if failure is None
        else {"reason": failure.reason, "message": failure.message, "tail": list(failure.tail)},
        "deadlines": runner.config.deadlines(),
        "engine": _engine_diagnostics(runner.engine_statistics()),
        "events": [attrs.asdict(e) for e in runner.flight_events()],
    }


def _engine_diagnostics(stats: EngineStats | None) -> dict[str, object] | None:
    """The runner's engine counters, with the speculation acceptance rate (``None`` while
    nothing was drafted); ``None`` until the runner sent some (a sharded rank never does)."""
    if stats is None:
        return None
    return {**attrs.asdict(stats), "acceptance_rate": stats.acceptance_rate}


def _json(body: object, status: int) -> Response:
    return json_response(body, status)
