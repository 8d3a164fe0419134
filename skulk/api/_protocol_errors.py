"""The answers Hypercorn gives before (or instead of) the app, in the JSON error envelope.

Some requests never reach the app, and Hypercorn answers them itself with an empty body:

* **HTTP that h11 cannot parse** (no ``Host``, a malformed ``Content-Length``, a bad chunk
  size, a header without a colon, bytes that are not HTTP at all, an unsupported
  ``Transfer-Encoding``) — ``H11Protocol._send_error_response``, with h11's status hint, which is
  501 for a transfer coding it does not implement: a 5xx for the client's mistake;
* **a WebSocket upgrade without a valid handshake** (no key, an unknown version) —
  ``WSStream._send_error_response`` (400);
* an app that fails without answering — ``HTTPStream._send_error_response`` (500; ours answers
  every exception itself, so this is a last resort).

That breaks the rule that every error is the JSON envelope. :func:`envelope_hypercorn_errors`
replaces those three methods so the answers carry the envelope, with 4xx statuses for the
client's mistakes (h11's 4xx hints kept, its 5xx hints made 400), and still close the connection
as Hypercorn does. It patches Hypercorn (0.17 and 0.18 have these methods): call it once, before
serving. If a later Hypercorn lacks one, it logs a warning and leaves that one alone (and the
fuzz test, which sends such requests, fails).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import h11
from hypercorn.protocol import events as hc_events
from hypercorn.protocol import h11 as hc_h11
from hypercorn.protocol import http_stream as hc_http
from hypercorn.protocol import ws_stream as hc_ws

from skulk.api._errors import SERVER, ApiError

log = logging.getLogger("skulk.api")

Headers = list[tuple[bytes, bytes]]


def error_response(status_hint: int, what: str) -> tuple[int, Headers, bytes]:
    """The status, headers and body of an answer Hypercorn gives instead of the app (sans-IO).

    ``what`` is ``"http"`` (an unparseable request), ``"websocket"`` (a bad upgrade handshake)
    or ``"app"`` (the app failed without answering)."""
    if what == "app":
        status = status_hint
        error = ApiError(status, "internal server error", type=SERVER, code="internal")
    else:
        status = status_hint if 400 <= status_hint < 500 else 400
        if what == "websocket":
            reason, code = "the WebSocket upgrade request is not valid", "invalid_websocket_upgrade"
        elif status_hint == 501:
            reason = "the request uses a Transfer-Encoding this server does not implement"
            code = "invalid_http"
        elif status == 431:
            reason, code = "the request headers are too large", "invalid_http"
        else:
            reason, code = "the request is not valid HTTP/1.1", "invalid_http"
        error = ApiError(status, f"{reason}; the connection is closed", code=code)
    body = json.dumps(error.envelope()).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(body)),
        (b"connection", b"close"),
    ]
    return status, headers, body


async def _h11_error(self: Any, status_code: int) -> None:
    status, headers, body = error_response(status_code, "http")
    extra = list(self.config.response_headers("h11"))
    await self._send_h11_event(h11.Response(status_code=status, headers=headers + extra))
    await self._send_h11_event(h11.Data(data=body))
    await self._send_h11_event(h11.EndOfMessage())


async def _send_stream_error(self: Any, status: int, headers: Headers, body: bytes) -> None:
    sid = self.stream_id
    await self.send(hc_events.Response(stream_id=sid, headers=headers, status_code=status))
    await self.send(hc_events.Body(stream_id=sid, data=body))
    await self.send(hc_events.EndBody(stream_id=sid))


async def _http_stream_error(self: Any, status_code: int) -> None:
    what = "app" if status_code >= 500 else "http"
    await _send_stream_error(self, *error_response(status_code, what))
    self.state = hc_http.ASGIHTTPState.CLOSED


async def _ws_stream_error(self: Any, status_code: int) -> None:
    await _send_stream_error(self, *error_response(status_code, "websocket"))


_PATCHES = (
    (hc_h11, "H11Protocol", _h11_error),
    (hc_http, "HTTPStream", _http_stream_error),
    (hc_ws, "WSStream", _ws_stream_error),
)


def envelope_hypercorn_errors() -> None:
    """Make Hypercorn's own error answers the JSON envelope (see the module docstring)."""
    for module, name, replacement in _PATCHES:
        cls: Any = getattr(module, name, None)
        if cls is None or not hasattr(cls, "_send_error_response"):
            log.warning("hypercorn has no %s._send_error_response: its errors stay bare", name)
            continue
        cls._send_error_response = replacement
