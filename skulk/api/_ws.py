"""``GET /v1/ws``: several chat completions streamed over one WebSocket.

Client → server (JSON text messages)::

    {"id": "<client id>", "type": "chat.completions", "body": <chat completions request>}
    {"id": "<client id>", "type": "cancel"}

Server → client, per request id: ``{"id", "type": "chunk", "data": <chat.completion.chunk>}``
messages, then exactly one ``{"id", "type": "done"}`` or ``{"id", "type": "error", "error":
{...}}`` (a cancelled request ends with an error whose ``code`` is ``"cancelled"``). A message
that cannot be attributed to a request gets an error with ``"id": null``. Closing the socket
cancels everything in flight. A body with ``n`` > 1 is served as over SSE
(:mod:`skulk.api._choices`): its chunks carry each choice's ``index``.

A request can fail only itself: a bad body (``param`` names the field inside ``body``, e.g.
``messages[0].content`` for a lone surrogate), a failure before the first token (then the
error is the request's only message) or after it, even a bug, ends that request with its
error message; the socket and the other requests on it go on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import trio
from quart import websocket
from quart_trio import QuartTrio

from skulk.api._choices import choice_count, open_choices
from skulk.api._errors import ApiError
from skulk.api._json_body import LARGE_BODY, MAX_BODY, check_json_value
from skulk.api._openai_parse import parse_chat_completions
from skulk.api._stream import Items, Opened, Request, open_stream
from skulk.routing import Served

log = logging.getLogger("skulk.api")

Start = Callable[[Request], tuple[Served, Items]]
StartChoices = Callable[[Request], tuple[Served, list[Items]]]

#: Requests one socket may have in flight; more are refused with ``too_many_requests``.
MAX_IN_FLIGHT = 32


async def serve_websocket(start: Start, start_choices: StartChoices) -> None:
    """Serve one socket; ``start(request)`` routes a request and returns its generation (not
    started yet), raising :class:`ApiError` when it cannot be served; ``start_choices`` does
    the same for a request with ``n`` > 1 (one generation per choice)."""
    ws: Any = websocket
    send_lock = trio.Lock()
    active: dict[str, trio.CancelScope] = {}

    async def send(message: dict[str, object]) -> None:
        async with send_lock:
            await ws.send(json.dumps(message))

    async def error(rid: str | None, err: ApiError) -> None:
        await send({"id": rid, "type": "error", "error": err.envelope()["error"]})

    async def relay(rid: str, opened: Opened) -> None:
        """Send ``opened``'s events as the request's chunks; closes it."""
        async with aclosing(opened), aclosing(opened.events()) as events:
            async for event in events:
                if isinstance(event.data, str):
                    continue  # SSE's [DONE]: the socket says "done" instead
                await send({"id": rid, "type": "chunk", "data": event.data})

    async def relay_choices(rid: str, req: Request) -> None:
        """:func:`relay` for a request with ``n`` > 1: its choices run in tasks of a nursery of
        its own, which ends once they are closed. A failure is raised after the nursery, not
        from inside it (where it would arrive wrapped in an exception group)."""
        _, choices = start_choices(req)
        failed: list[Exception] = []
        async with trio.open_nursery() as nursery:
            try:
                await relay(rid, await open_choices(nursery, choices, req))
            except Exception as exc:
                failed.append(exc)
        if failed:
            raise failed[0]

    async def run_request(rid: str, body: object, scope: trio.CancelScope) -> None:
        try:
            with scope:
                try:
                    check_json_value(body)
                    if isinstance(body, dict):
                        body = {**body, "stream": True}  # always streamed over the socket
                    req = parse_chat_completions(body).generate_request()
                    if choice_count(req) > 1:
                        await relay_choices(rid, req)
                    else:
                        _, items = start(req)
                        await relay(rid, await open_stream(items, req))
                except ApiError as exc:
                    await error(rid, exc)
                    return
                except Exception:
                    log.exception("WebSocket request %r failed", rid)
                    await error(rid, ApiError.server_error("internal error", code="internal"))
                    return
                await send({"id": rid, "type": "done"})
            if scope.cancelled_caught:
                await error(rid, ApiError(499, "request cancelled by the client", code="cancelled"))
        finally:
            active.pop(rid, None)

    async with trio.open_nursery() as nursery:
        while True:
            raw = await ws.receive()
            if len(raw) > MAX_BODY:  # as for an HTTP body: the runner frame must fit
                await error(None, ApiError.too_large(MAX_BODY))
                continue
            try:
                if len(raw) >= LARGE_BODY:  # megabytes of JSON would stall the event loop
                    message = await trio.to_thread.run_sync(json.loads, raw)
                else:
                    message = json.loads(raw)
            except (TypeError, ValueError, RecursionError):
                await error(None, _bad("message is not valid JSON text", None))
                continue
            if not isinstance(message, dict):
                await error(None, _bad("message must be a JSON object", None))
                continue
            rid = message.get("id")
            if not isinstance(rid, str) or not rid:
                await error(None, _bad("id must be a non-empty string", "id"))
                continue
            try:
                check_json_value(rid, "id")  # an id we could not even send back
            except ApiError as exc:
                await error(None, exc)
                continue
            kind = message.get("type")
            if kind == "cancel":
                if (scope := active.get(rid)) is not None:
                    scope.cancel()
                continue
            if kind != "chat.completions":
                await error(rid, _bad('type must be "chat.completions" or "cancel"', "type"))
                continue
            if rid in active:
                await error(rid, _bad("a request with this id is already in flight", "id"))
                continue
            if len(active) >= MAX_IN_FLIGHT:
                await error(
                    rid,
                    ApiError(
                        429,
                        f"at most {MAX_IN_FLIGHT} requests in flight per socket",
                        type="rate_limit_error",
                        code="too_many_requests",
                    ),
                )
                continue
            if "body" not in message:
                await error(rid, _bad("body is required", "body"))
                continue
            active[rid] = trio.CancelScope()
            nursery.start_soon(run_request, rid, message["body"], active[rid])


def _bad(message: str, param: str | None) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_message")


def install_websocket_route(app: QuartTrio, start: Start, start_choices: StartChoices) -> None:
    """Add ``/v1/ws`` to ``app`` (:func:`serve_websocket` with ``start`` and
    ``start_choices``)."""

    @app.websocket("/v1/ws")
    async def ws() -> None:
        await serve_websocket(start, start_choices)
