"""The Quart-Trio application: OpenAI-compatible routes, health and the WebSocket endpoint."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

import attrs
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from skulk.api._openai import (
    SSE_DONE,
    ApiError,
    parse_chat_completions,
    parse_completions,
    sse_event,
)
from skulk.api._stream import Request, complete, stream_chunks, unavailable_error
from skulk.api._ws import serve_websocket
from skulk.consensus import ConsensusService
from skulk.federation import Mesh, TelemetryGossip
from skulk.runner import Runner
from skulk.worker import ModelService, ModelUnavailable

log = logging.getLogger("skulk.api")


def create_app(
    service: ModelService,
    cluster: Mesh | None = None,
    gossip: TelemetryGossip | None = None,
    consensus: ConsensusService | None = None,
) -> QuartTrio:
    """The HTTP API for a node serving ``service``'s model, in ``cluster``'s mesh."""
    app = QuartTrio("skulk")
    app.config["MAX_CONTENT_LENGTH"] = 16 * 1024 * 1024

    @app.errorhandler(ApiError)
    async def api_error(exc: ApiError) -> Response:
        return _json(exc.envelope(), exc.status)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        status = exc.code or 500
        kind = {404: "not_found_error"}.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        code = exc.name.lower().replace(" ", "_")
        err = ApiError(status, exc.description or exc.name, type=kind, code=code)
        return _json(err.envelope(), status)

    @app.errorhandler(Exception)
    async def internal_error(exc: Exception) -> Response:
        log.exception("unhandled error in %s %s", request.method, request.path)
        err = ApiError.server_error("internal server error", code="internal")
        return _json(err.envelope(), 500)

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

    @app.get("/v1/models")
    async def models() -> Response:
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
        return _json({"object": "list", "data": [card]}, 200)

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

        async def events() -> AsyncIterator[bytes]:
            # A client disconnect cancels this generator; leaving it cancels the generation.
            try:
                async for chunk in stream_chunks(service, req):
                    yield sse_event(chunk)
            except ApiError as exc:
                yield sse_event(exc.envelope())
            yield SSE_DONE

        response = Response(events(), status=200, content_type="text/event-stream")
        response.headers["Cache-Control"] = "no-cache"
        response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut long streams
        return response

    @app.websocket("/v1/ws")
    async def ws() -> None:
        await serve_websocket(service)

    return app


async def _body() -> object:
    raw = await request.get_data(as_text=False)
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise ApiError.invalid(
            None, f"request body is not valid JSON: {exc}", code="invalid_json"
        ) from None


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
    return Response(json.dumps(body), status=status, content_type="application/json")
