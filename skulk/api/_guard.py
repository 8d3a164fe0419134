"""The ASGI layer between Hypercorn and the Quart app: whole bodies, one log line, owned cleanup.

:class:`RequestGuard` wraps the app (``app.asgi_app = RequestGuard(app.asgi_app, ...)``) and,
for every HTTP request:

1. **Reads the whole request body before the app sees the request**, at most ``max_body``
   bytes within ``body_timeout`` seconds. The app then never answers while the body is still in
   flight. That matters: Hypercorn 0.18 (h11) loses a keep-alive connection whose response
   ended before the request body did. Its ``H11Protocol._maybe_recycle`` (in
   ``hypercorn/protocol/h11.py``) then closes the connection from inside the app's final
   ``send``; closing tells the app ``http.disconnect``, quart-trio cancels the task that is
   doing the closing, the socket is never closed, the late body is dropped (``stream is None``)
   and h11 waits for a ``start_next_cycle`` that never comes: the next request on the connection
   is never answered (clients time out). With the body read first, h11 is in ``DONE`` on both
   sides when the response ends and recycles the connection normally.
2. Answers, without calling the app, **413** when the body is larger than ``max_body`` (if it
   is no larger than ``drain_limit`` it is read and dropped, so the connection stays usable;
   a larger one, declared or sent, is answered at once with ``Connection: close``) and **408**
   with ``Connection: close`` when the body does not arrive in time. Both in the JSON envelope.
3. **Shields the final ``send``** of every response (bounded), so Hypercorn's end-of-response
   work (recycling or closing the connection, re-arming its keep-alive timer) is not cut short
   by the cancellation quart-trio starts when Hypercorn reports the stream closed.
4. **Closes what the request owns** (:func:`close_with_request`) when the request ends —
   normally, by error, by cancellation or because the client went away before the response
   body was ever iterated — shielded and bounded.
5. **Logs the request exactly once** on ``skulk.access``, when it ends, with the status sent
   (``-`` if none) and ``incomplete`` when the response was cut short. Hypercorn's own access
   log is off (``hc.accesslog = None`` in ``skulk.serve``): it logs from two places that race
   (``HTTPStream._send_closed`` sets its state only after the last send, while the client's
   close arrives as ``StreamClosed``), so a fast client got two lines, one with ``- -``.

6. **Names the request** (:mod:`skulk.tracing`): its id is the client's ``x-request-id``
   header when it sends a valid one, else a fresh one; everything the request does runs in its
   :func:`~skulk.tracing.request_scope` (log lines, error bodies, the routing hop carry it) and
   every response, error or not, streamed or not, has the ``x-request-id`` header. An invalid
   header (over 128 characters, a character outside ``A-Z a-z 0-9 . _ : - + = / @``, or the
   header given twice) is answered 400 naming ``x-request-id``, under a fresh id.

WebSocket connections get 4, 5 and 6 (status 101, logged when the socket ends; the id in the
accept's headers; an invalid id refuses the socket with a 400).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, MutableMapping
from contextvars import ContextVar
from typing import Any, cast

import attrs
import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable
from hypercorn.typing import Scope as ASGIScope

from skulk.api._error_formats import render_error
from skulk.api._errors import ApiError
from skulk.tracing import (
    REQUEST_ID_HEADER,
    check_request_id,
    new_request_id,
    request_scope,
)

# Inside, ASGI's shapes loosely typed: Hypercorn's TypedDict unions add nothing at this level.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[ASGIScope, ASGIReceiveCallable, ASGISendCallable], Awaitable[None]]
Cleanup = Callable[[], Awaitable[None]]

#: How long the last ``send`` of a response may take once shielded (it writes to a socket).
FINAL_SEND_DEADLINE = 10.0
#: How long a request's owned cleanups may take, together, once shielded.
CLEANUP_DEADLINE = 10.0

log = logging.getLogger("skulk.api")
_owned: ContextVar[list[Cleanup] | None] = ContextVar("skulk_request_owned", default=None)


def close_with_request(aclose: Cleanup) -> None:
    """Make the current request own a resource: ``aclose`` is awaited when the request ends,
    however it ends (see :class:`RequestGuard`); it must be idempotent, since the code that
    uses the resource normally closes it first. Call it from a route handler (or anything the
    handler started) running under a :class:`RequestGuard`; elsewhere it raises
    :class:`RuntimeError`.
    """
    owned = _owned.get()
    if owned is None:
        raise RuntimeError("close_with_request() outside a request run by RequestGuard")
    owned.append(aclose)


@attrs.define
class _Exchange:
    """What one request did, for its log line."""

    status: int | None = None
    length: str = "-"
    complete: bool = False


class RequestGuard:
    """Wraps an ASGI app; see the module docstring for what it guarantees per request."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body: int,
        body_timeout: float,
        drain_limit: int | None = None,
        access_log: logging.Logger | None = None,
    ) -> None:
        self.app = app
        self.max_body = max_body
        self.body_timeout = body_timeout
        self.drain_limit = 4 * max_body if drain_limit is None else max(drain_limit, max_body)
        self.access_log = access_log

    async def __call__(
        self, asgi_scope: ASGIScope, asgi_receive: ASGIReceiveCallable, asgi_send: ASGISendCallable
    ) -> None:
        if asgi_scope["type"] not in ("http", "websocket"):
            await self.app(asgi_scope, asgi_receive, asgi_send)  # lifespan
            return
        scope = cast(Scope, asgi_scope)
        receive = cast(Receive, asgi_receive)
        send = cast(Send, asgi_send)
        started = time.monotonic()
        exchange = _Exchange()
        owned: list[Cleanup] = []
        request_id, refusal = _request_id(scope)
        what = f"{scope.get('method', 'GET')} {clip(str(scope.get('path', '')), 200)}"
        with request_scope(request_id, received=what):
            token = _owned.set(owned)
            try:
                tracked = _tracking(send, exchange, request_id)
                if refusal is not None:
                    await _refuse(scope, tracked, refusal)
                elif scope["type"] == "http":
                    await self._http(scope, receive, tracked)
                else:
                    await self._app(scope, receive, tracked)
            except Exception:
                if exchange.status is None:
                    exchange.status = 500  # what Hypercorn answers for an app that failed
                raise
            finally:
                _owned.reset(token)
                if owned:
                    await _close_all(owned)
                self._log(scope, exchange, time.monotonic() - started)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = _content_length(scope)
        if declared is not None and declared > self.drain_limit:
            await _reply(scope, send, ApiError.too_large(self.max_body), close=True)
            return
        body = bytearray()
        received = 0
        with trio.move_on_after(self.body_timeout) as waiting:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # the client is gone: nobody to answer
                chunk = message.get("body", b"")
                received += len(chunk)
                if received > self.drain_limit:
                    await _reply(scope, send, ApiError.too_large(self.max_body), close=True)
                    return
                if received <= self.max_body:
                    body += chunk
                if not message.get("more_body", False):
                    break
        if waiting.cancelled_caught:
            await _reply(scope, send, ApiError.body_timeout(self.body_timeout), close=True)
            return
        if received > self.max_body:  # read and dropped: the connection stays usable
            await _reply(scope, send, ApiError.too_large(self.max_body), close=False)
            return
        await self._app(scope, _replay(bytes(body), receive), send)

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(
            cast(ASGIScope, scope), cast(ASGIReceiveCallable, receive), cast(ASGISendCallable, send)
        )

    def _log(self, scope: Scope, exchange: _Exchange, seconds: float) -> None:
        if self.access_log is None:
            return
        client = scope.get("client")
        where = f"{client[0]}:{client[1]}" if client else "-"
        method = scope.get("method", "GET")
        target = bytes(scope.get("raw_path") or b"").decode("latin-1") or scope.get("path", "")
        if query := scope.get("query_string"):
            target += "?" + bytes(query).decode("latin-1")
        agent = _header(scope, b"user-agent") or "-"
        self.access_log.info(
            '%s "%s %s HTTP/%s" %s %s %.1fms "%s"%s',
            where,
            method,
            clip(target, 300),
            scope.get("http_version", "1.1"),
            exchange.status if exchange.status is not None else "-",
            exchange.length,
            seconds * 1000,
            clip(agent, 200),
            "" if exchange.complete or exchange.status is None else " incomplete",
        )


def _request_id(scope: Scope) -> tuple[str, ApiError | None]:
    """The request's id (the client's ``x-request-id``, else a fresh one) and, when the client
    sent an invalid one, the 400 to answer (under a fresh id)."""
    sent = [
        bytes(value).decode("latin-1")
        for key, value in scope.get("headers", ())
        if bytes(key).lower() == REQUEST_ID_HEADER.encode()
    ]
    if not sent:
        return new_request_id(), None
    if len(sent) > 1:
        why = f"{REQUEST_ID_HEADER} is given {len(sent)} times"
        return new_request_id(), ApiError.invalid(REQUEST_ID_HEADER, why)
    try:
        return check_request_id(sent[0]), None
    except ValueError as exc:
        return new_request_id(), ApiError.invalid(REQUEST_ID_HEADER, f"{REQUEST_ID_HEADER}: {exc}")


async def _refuse(scope: Scope, send: Send, error: ApiError) -> None:
    """Answer ``error`` without calling the app (a WebSocket: refused before it opens)."""
    if scope["type"] == "http":
        await _reply(scope, send, error, close=False)
    elif "websocket.http.response" in scope.get("extensions", {}):
        body = json.dumps(render_error(str(scope.get("path", "")), error)).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        start = {"type": "websocket.http.response.start", "status": error.status}
        await send({**start, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
    else:
        await send({"type": "websocket.close", "code": 1008})


def _tracking(send: Send, exchange: _Exchange, request_id: str) -> Send:
    """``send`` that records the status, adds the ``x-request-id`` header and shields
    (bounded) the response's last message."""
    id_header = (REQUEST_ID_HEADER.encode(), request_id.encode())

    async def tracked(message: Message) -> None:
        kind = message["type"]
        if kind in ("http.response.start", "websocket.http.response.start", "websocket.accept"):
            message = {**message, "headers": [*message.get("headers", ()), id_header]}
        if kind in ("http.response.start", "websocket.http.response.start"):
            exchange.status = int(message["status"])
            for name, value in message.get("headers", ()):
                if bytes(name).lower() == b"content-length":
                    exchange.length = bytes(value).decode("latin-1")
        elif kind == "websocket.accept":
            exchange.status = 101
            exchange.complete = True
        elif kind == "websocket.close" and exchange.status is None:
            exchange.status = 403  # closed before accepting: Hypercorn answers 403
            exchange.complete = True
        if kind == "http.response.body" and not message.get("more_body", False):
            with trio.move_on_after(FINAL_SEND_DEADLINE, shield=True):
                await send(message)
                exchange.complete = True
            return
        await send(message)

    return tracked


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that hands the app the whole body at once, then the real messages
    (``http.disconnect`` when the connection ends)."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]

    async def replay() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replay


async def _reply(scope: Scope, send: Send, error: ApiError, *, close: bool) -> None:
    body = json.dumps(render_error(str(scope.get("path", "")), error)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    if close:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": error.status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def _close_all(owned: list[Cleanup]) -> None:
    with trio.move_on_after(CLEANUP_DEADLINE, shield=True):
        for aclose in reversed(owned):
            try:
                await aclose()
            except Exception:
                log.exception("closing a resource of a finished request failed")


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if bytes(key).lower() == name:
            return bytes(value).decode("latin-1")
    return None


def _content_length(scope: Scope) -> int | None:
    value = _header(scope, b"content-length")
    if value is None or not value.strip().isdigit():
        return None  # absent (h11 has already refused a malformed one)
    return int(value)


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
