"""Every error the app answers is the JSON error envelope: routing, HTTP and unexpected ones.

:func:`install_error_handlers` makes sure of it:

* :class:`ApiError` → its status and envelope;
* werkzeug's HTTP errors (404 unknown route, 405 with its ``Allow`` header, 413, ...) → the
  envelope, the 404 naming the method and path;
* any other exception → 500 ``internal`` (and a log line with the traceback);
* routing never redirects or guesses (an empty path segment, ``//``, is not merged away and a
  trailing slash is not redirected: a client gets a 404 naming the path it sent, not an HTML
  308), and an ``after_request`` check turns any HTML
  error page that still slips through (Quart returns werkzeug's routing exceptions as they are)
  into the envelope. HTML with a success status (a future dashboard page) is left alone.
"""

from __future__ import annotations

import json
import logging

from quart import Response, has_request_context, has_websocket_context, request, websocket
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import WebsocketMismatch

from skulk.api._error_formats import render_error
from skulk.api._errors import INVALID_REQUEST, SERVER, ApiError, clip

log = logging.getLogger("skulk.api")


def install_error_handlers(app: QuartTrio) -> None:
    """Route errors of ``app`` to the JSON envelope; call before adding routes (see above)."""
    # Strict slashes (the default) never redirect here: no rule ends with "/", so "/health/"
    # is simply not found. Merging "//" would redirect, so it is off.
    app.url_map.merge_slashes = False
    for rule in app.url_map.iter_rules():
        rule.merge_slashes = False

    @app.before_request
    @app.before_websocket
    async def no_empty_segments() -> None:
        # werkzeug drops leading slashes before matching ("//health" would be /health), while
        # "/v1//x" is a 404: refuse both, so a client with a doubled slash learns about it.
        if "//" in _where():
            raise NotFound()

    @app.errorhandler(ApiError)
    async def api_error(exc: ApiError) -> Response:
        response = error_response(exc)
        response.headers.update(exc.headers)
        return response

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        if isinstance(exc, WebsocketMismatch):
            message = (
                f"{_where()} is a WebSocket route: connect with a WebSocket upgrade."
                if has_request_context()
                else f"{_where()} is not a WebSocket route."
            )
            err = ApiError.invalid(None, message, code="websocket_mismatch")
        else:
            err = _http_error(exc.code or 500, exc.description or exc.name, exc.name)
        response = error_response(err)
        if isinstance(exc, MethodNotAllowed) and exc.valid_methods:
            response.headers["Allow"] = ", ".join(sorted(exc.valid_methods))
        return response

    @app.errorhandler(Exception)
    async def internal_error(exc: Exception) -> Response:
        log.exception("unhandled error in %s", _where())
        return error_response(ApiError.server_error("internal server error", code="internal"))

    @app.after_request
    async def no_html_errors(response: Response) -> Response:
        if response.status_code < 300 or response.mimetype != "text/html":
            return response
        status = 404 if response.status_code < 400 else response.status_code  # no redirects
        return error_response(_http_error(status, "", ""))


def _path() -> str:
    """The path of the request (or WebSocket) being handled, as sent; ``""`` outside one."""
    if has_request_context():
        return str(request.scope["path"])
    if has_websocket_context():
        return str(websocket.scope["path"])
    return ""


def error_response(err: ApiError) -> Response:
    """``err`` as a JSON response in the envelope of the format the request's path speaks."""
    return json_response(render_error(_path(), err), err.status)


def _where() -> str:
    """``METHOD /path`` of the request (or WebSocket) being handled, the path as sent."""
    if has_request_context():
        scope = request.scope
    elif has_websocket_context():
        scope = websocket.scope
    else:
        return "-"
    return f"{scope.get('method', 'GET')} {clip(scope['path'], 200)}"


def _http_error(status: int, description: str, name: str) -> ApiError:
    where = _where()
    if status == 404:
        return ApiError.not_found(f"Unknown route: {where}.")
    if status == 405:
        return ApiError(
            405, f"Method not allowed: {where}.", type=INVALID_REQUEST, code="method_not_allowed"
        )
    kind = SERVER if status >= 500 else INVALID_REQUEST
    code = name.lower().replace(" ", "_") or None
    return ApiError(status, description or name or f"HTTP {status}", type=kind, code=code)


def json_response(body: object, status: int) -> Response:
    """``body`` as a JSON response."""
    return Response(json.dumps(body), status=status, content_type="application/json")
