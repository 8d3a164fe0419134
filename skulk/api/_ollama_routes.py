"""The Ollama routes: ``/api/chat``, ``/api/generate`` (NDJSON streams), ``/api/tags``,
``/api/show``, ``/api/ps``, ``/api/version``.

Requests take the same path as every other format's: parsed (:mod:`skulk.api._ollama_parse`)
into the neutral :class:`~skulk.api._request.GenerateRequest`, routed to an instance anywhere in the
cluster, driven by :mod:`skulk.api._stream` (a stream is committed only once its first item is
here; the request owns its generation, cancelled when the client goes away). Only the framing
is Ollama's own: one JSON object per line (``application/x-ndjson``), and a failure after the
stream started ends it with an ``{"error": "…"}`` line. Errors before that are plain responses
in Ollama's envelope (:mod:`skulk.api._error_formats`). ``/api/embed`` and ``/api/embeddings``
live in :mod:`skulk.api._embeddings`.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import aclosing

from quart import Response
from quart_trio import QuartTrio

from skulk import __version__
from skulk.api._errors import ApiError
from skulk.api._guard import close_with_request
from skulk.api._http_errors import json_response
from skulk.api._ollama_format import Clock, loaded, running, show, tags
from skulk.api._ollama_parse import (
    OLLAMA_API_VERSION,
    OllamaRequest,
    parse_chat,
    parse_generate,
    parse_show,
)
from skulk.api._request import GenerateRequest
from skulk.api._stream import (
    ROUTING_ERRORS,
    Items,
    OpenedStream,
    complete,
    open_stream,
    routing_error,
)
from skulk.routing import Router, Served
from skulk.wire.runner import GenerationEnd

log = logging.getLogger("skulk.api")

NDJSON = "application/x-ndjson"

Start = Callable[[GenerateRequest], tuple[Served, Items]]
Body = Callable[[], Awaitable[object]]


def install_ollama_routes(app: QuartTrio, router: Router, start: Start, body: Body) -> None:
    """Add the Ollama routes to ``app``: ``start`` routes a request and makes its generation
    (not started; :class:`ApiError` when nothing can serve it), ``body`` reads the request's
    JSON body (400/415 otherwise)."""

    @app.post("/api/chat")
    async def chat() -> Response:
        clock = Clock()  # from the request's arrival, as Ollama's total_duration
        return await _answer(parse_chat(await body()), clock)

    @app.post("/api/generate")
    async def generate() -> Response:
        clock = Clock()
        return await _answer(parse_generate(await body()), clock)

    @app.get("/api/tags")
    async def list_models() -> Response:
        return json_response(tags({m.id: router.card(m.id) for m in router.models()}), 200)

    @app.get("/api/ps")
    async def running_models() -> Response:
        ready = [m.id for m in router.models() if m.status == "ready"]
        return json_response(running({m: router.card(m) for m in ready}), 200)

    @app.post("/api/show")
    async def show_model() -> Response:
        model = parse_show(await body())
        card = router.card(model)
        if card is None:
            raise ApiError.model_not_found(model)
        return json_response(show(card), 200)

    @app.get("/api/version")
    async def version() -> Response:
        return json_response({"version": OLLAMA_API_VERSION, "skulk": __version__}, 200)

    async def _answer(req: OllamaRequest, clock: Clock) -> Response:
        if req.prompt is None:  # Ollama's "load the model": it is, if it can be routed
            try:
                router.route(req.model)
            except ROUTING_ERRORS as exc:
                raise routing_error(exc) from None
            return _one(loaded(req.kind, req.model), stream=req.stream)
        request = req.generate_request(clock)
        route, items = start(request)
        items = _stamped(items, clock)
        if not req.stream:
            response = json_response(await complete(items, request), 200)
        else:
            opened = await open_stream(items, request)
            close_with_request(opened.aclose)  # cancelled on the runner however the body ends
            response = Response(ndjson_body(opened), status=200, content_type=NDJSON)
            response.timeout = None  # Quart's RESPONSE_TIMEOUT would cut long streams
        response.headers["x-skulk-instance"] = route.instance
        response.headers["x-skulk-node"] = route.node
        return response


def _one(body: dict[str, object], *, stream: bool) -> Response:
    """A one-object answer: an NDJSON stream of one line when the client asked for a stream."""
    if not stream:
        return json_response(body, 200)
    return Response(ndjson_line(body), status=200, content_type=NDJSON)


async def _stamped(items: Items, clock: Clock) -> AsyncGenerator[str | GenerationEnd, None]:
    """``items`` passed on, marking on ``clock`` when the first one arrived (the end of prompt
    evaluation); closing this closes ``items`` (which cancels the generation)."""
    async with aclosing(items):
        async for item in items:
            clock.mark()
            yield item


def ndjson_line(obj: object) -> bytes:
    """One NDJSON line: compact JSON, a newline."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


async def ndjson_body(opened: OpenedStream) -> AsyncGenerator[bytes, None]:
    """The NDJSON body of an opened stream; a failure after it started (the runner crashed, a
    deadline) ends it with an ``{"error": …}`` line, never a cut connection. Closes
    ``opened`` when it ends."""
    try:
        async with aclosing(opened.events()) as events:
            async for event in events:
                yield ndjson_line(event.data)
    except ApiError as exc:
        for event in opened.failure(exc):
            yield ndjson_line(event.data)
    except Exception:
        log.exception("a stream failed after it started")
        for event in opened.failure(ApiError.server_error("internal server error")):
            yield ndjson_line(event.data)
    finally:
        await opened.aclose()
