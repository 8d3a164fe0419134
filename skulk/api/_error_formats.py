"""Which error envelope a path answers in: each client format has its own.

An :class:`~skulk.api._errors.ApiError` is our format-neutral error (status, message,
offending parameter, code, type); :func:`render_error` shapes it for the route the client called:

* Anthropic (``/v1/messages…``): ``{"type": "error", "error": {"type": …, "message": …}}``,
  the type chosen by status as Anthropic documents it;
* Ollama (``/api/…``): ``{"error": "message"}``;
* everything else: OpenAI's ``{"error": {"message", "type", "param", "code"}}``.

Under a request (:class:`~skulk.api._guard.RequestGuard`), each envelope also carries the
request's id, ``request_id``: inside the ``error`` object (OpenAI, Anthropic), at the top
level (Ollama).

Every place that answers an error — the app's handlers, the request guard below the app,
mid-stream error events — goes through here, so a client never sees another format's shape.
"""

from __future__ import annotations

from skulk.api._errors import ApiError
from skulk.tracing import current_request_id

ANTHROPIC_PREFIX = "/v1/messages"
OLLAMA_PREFIX = "/api/"

#: Anthropic's error ``type`` for each status it documents; others fall back by class.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}


def anthropic_envelope(err: ApiError) -> dict[str, object]:
    """``err`` in Anthropic's envelope (also its SSE ``error`` event's data)."""
    kind = _ANTHROPIC_TYPES.get(err.status)
    if kind is None:
        kind = "invalid_request_error" if err.status < 500 else "api_error"
    error: dict[str, object] = {"type": kind, "message": err.message}
    if (request_id := current_request_id()) is not None:
        error["request_id"] = request_id
    return {"type": "error", "error": error}


def ollama_envelope(err: ApiError) -> dict[str, object]:
    """``err`` in Ollama's envelope (also a failed NDJSON stream's last line)."""
    if (request_id := current_request_id()) is not None:
        return {"error": err.message, "request_id": request_id}
    return {"error": err.message}


def render_error(path: str, err: ApiError) -> dict[str, object]:
    """The JSON body for ``err`` answered on ``path`` (the request path as sent)."""
    if path == ANTHROPIC_PREFIX or path.startswith(ANTHROPIC_PREFIX + "/"):
        return anthropic_envelope(err)
    if path.startswith(OLLAMA_PREFIX):
        return ollama_envelope(err)
    return err.envelope()
