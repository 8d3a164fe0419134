"""The Quart-Trio application: OpenAI-compatible routes, health and the WebSocket endpoint.

Every request runs under :class:`~skulk.api._guard.RequestGuard` (whole body first, one log
line, owned cleanup) and every error is the JSON envelope (:mod:`skulk.api._http_errors`).
"""

from __future__ import annotations

import logging

import attrs
import trio
from quart import Response, request
from quart_trio import QuartTrio

from skulk.api._guard import RequestGuard, close_with_request
from skulk.api._http_errors import install_error_handlers, json_response
from skulk.api._json_body import LARGE_BODY, MAX_BODY, parse_json_body
from skulk.api._openai import ApiError, parse_chat_completions, parse_completions
from skulk.api._stream import Request, complete, open_stream, sse_body, unavailable_error
from skulk.api._ws import serve_websocket
from skulk.consensus import ConsensusService
from skulk.federation import Mesh, TelemetryGossip
from skulk.runner import Runner
from skulk.worker import ModelService, ModelUnavailable

log = logging.getLogger("skulk.api")

#: How long a request body may take to arrive (408 after).
BODY_TIMEOUT = 60.0


def create_app(
    service: ModelService,
    cluster: Mesh | None = None,
    gossip: TelemetryGossip | None = None,
    consensus: ConsensusService | None = None,
) -> QuartTrio:
    """The HTTP API for a node serving ``service``'s model, in ``cluster``'s mesh."""
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

    @app.get("/health")
    async def health() -> Response:
        s = service.status()
        body: dict[str, object] = {
            "status": "ok" if s.ready else s.state,
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
        healthy = s.ready
        if consensus is not None:
            raft = consensus.status_json()
            body["consensus"] = {k: raft[k] for k in ("healthy", "unavailable", "role", "leader")}
            if not raft["healthy"]:  # e.g. its disk is full: it takes no part in decisions
                healthy = False
                body["status"] = "consensus_unavailable"
        return _json(body, 200 if healthy else 503)

    @app.get("/v1/diagnostics/node")
    async def diagnostics() -> Response:
        return _json(
            {
                "model": attrs.asdict(service.status()),
                "runners": [_runner_diagnostics(r) for r in service.recent_runners()],
            },
            200,
        )

    @app.post("/v1/diagnostics/node/retry")
    async def retry() -> Response:
        """An operator's "try the failed model again now" (ends a crash-loop cool-down)."""
        if not service.retry_now():
            s = service.status()
            raise ApiError(
                409,
                f"model {s.model_id} is {s.state}, not failed: there is nothing to retry",
                type="invalid_request_error",
                code="not_failed",
            )
        return _json({"retrying": True, "model": service.model_id}, 202)

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
        return _json(gossip.nodes_json() if gossip is not None else {"nodes": []}, 200)

    def model_card() -> dict[str, object]:
        s = service.status()
        card: dict[str, object] = {
            "id": s.model_id,
            "object": "model",
            "created": 0,
            "owned_by": "skulk",
            "status": s.state,
        }
        if s.failure_reason:
            card["failure"] = {"reason": s.failure_reason, "message": s.failure_message}
        return card

    @app.get("/v1/models")
    async def models() -> Response:
        return _json({"object": "list", "data": [model_card()]}, 200)

    @app.get("/v1/models/<path:model_id>")
    async def model(model_id: str) -> Response:
        """One model card (``models.retrieve``); ids may contain slashes (``org/name``)."""
        if model_id != service.model_id:
            raise ApiError.model_not_found(model_id)
        return _json(model_card(), 200)

    @app.post("/v1/chat/completions")
    async def chat_completions() -> Response:
        return await _generate(parse_chat_completions(await _body()))

    @app.post("/v1/completions")
    async def completions() -> Response:
        return await _generate(parse_completions(await _body()))

    async def _generate(req: Request) -> Response:
        if req.model != service.model_id:
            raise ApiError.model_not_found(req.model)
        if not service.status().ready:
            raise unavailable_error(ModelUnavailable(service.status()))
        if not req.stream:
            return _json(await complete(service, req), 200)
        # Commit to a stream only once the first token (or the end) is here: an earlier failure
        # is a plain error response. The request owns the generation from here on, so it is
        # cancelled on the runner even if the response body is never iterated.
        opened = await open_stream(service, req)
        close_with_request(opened.aclose)
        response = Response(sse_body(opened), status=200, content_type="text/event-stream")
        response.headers["Cache-Control"] = "no-cache"
        response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut long streams
        return response

    @app.websocket("/v1/ws")
    async def ws() -> None:
        await serve_websocket(service)

    return app


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
        "events": [attrs.asdict(e) for e in runner.flight_events()],
    }


def _json(body: object, status: int) -> Response:
    return json_response(body, status)
