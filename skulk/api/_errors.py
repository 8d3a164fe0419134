"""Every API failure as one typed exception, whatever the format answers it in.

Every way a request can fail is an :class:`ApiError` built by one of its named constructors, so
the HTTP layer needs exactly one ``except ApiError as e`` that answers ``e.status`` with
``e.envelope()`` (or, mid-stream, ``sse_event(e.envelope())``, which is what OpenAI sends when a
stream fails after it started).
"""

from __future__ import annotations

import json

from skulk.tracing import current_request_id

# OpenAI's own ``error.type`` values (the openai client picks its exception class from the HTTP
# status, not from these, but other clients log and branch on them).
INVALID_REQUEST = "invalid_request_error"
NOT_FOUND = "not_found_error"
AUTHENTICATION = "authentication_error"
RATE_LIMIT = "rate_limit_error"
SERVER = "server_error"
TIMEOUT = "timeout_error"


def show(value: object) -> str:
    """A value as the client wrote it (JSON), cut short so a huge value cannot flood a log."""
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError, RecursionError):  # not JSON-like, or absurdly deep
        return f"<{json_type(value)}>"
    return text if len(text) <= 80 else text[:77] + "..."


def clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters: names a client chose (a model, an unknown field)
    are echoed in errors, and a megabyte-long name must not come back in full."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def json_type(value: object) -> str:
    """The JSON name of a value's type, for "expected X, got Y" messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


class ApiError(Exception):
    """A request failure with its HTTP status and OpenAI error fields.

    ``param`` names the offending field as a path into the request body
    (``"temperature"``, ``"messages[1].content[0].type"``, ``"stream_options.include_usage"``),
    or is ``None`` when no single field is to blame. ``code`` is a stable snake_case name
    (``"invalid_type"``, ``"unsupported_parameter"``, ``"model_not_found"``, ...) that clients and
    tests may branch on; ``message`` is for humans and may change.
    """

    status: int
    message: str
    type: str
    param: str | None
    code: str | None

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = INVALID_REQUEST,  # shadows the builtin: the OpenAI field is called "type"
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.headers: dict[str, str] = {}  # extra response headers (e.g. Retry-After)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def __repr__(self) -> str:
        return (
            f"ApiError(status={self.status}, message={self.message!r}, type={self.type!r}, "
            f"param={self.param!r}, code={self.code!r})"
        )

    def envelope(self) -> dict[str, object]:
        """The JSON body OpenAI sends with an error status (and as a mid-stream SSE event)."""
        error: dict[str, object] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        if (request_id := current_request_id()) is not None:  # under a request: its id
            error["request_id"] = request_id
        return {"error": error}

    # ---- 400: the request is wrong ----------------------------------------------------------

    @classmethod
    def invalid(cls, param: str | None, message: str, *, code: str = "invalid_value") -> ApiError:
        """400: the value of ``param`` is not acceptable (out of range, malformed, ...)."""
        return cls(400, message, param=param, code=code)

    @classmethod
    def invalid_type(cls, param: str, expected: str, value: object) -> ApiError:
        """400: ``param`` has the wrong JSON type (``expected`` e.g. ``"a string"``)."""
        return cls.invalid(
            param,
            f"Invalid type for '{param}': expected {expected}, but got {json_type(value)}.",
            code="invalid_type",
        )

    @classmethod
    def missing(cls, param: str) -> ApiError:
        """400: a required field is absent."""
        return cls.invalid(
            param, f"Missing required parameter: '{param}'.", code="missing_required_parameter"
        )

    @classmethod
    def unsupported(cls, param: str, value: object, *, supported: str | None = None) -> ApiError:
        """400: a well-formed value this server cannot honour (rather than silently ignore).

        ``supported`` says which values are accepted, e.g. ``"1 or null"``; ``None`` means the
        field is not supported at all beyond its no-op default.
        """
        tail = f"This server supports only {supported}." if supported else "It is not supported."
        return cls.invalid(
            param,
            f"Unsupported value for '{param}': {show(value)}. {tail}",
            code="unsupported_parameter",
        )

    @classmethod
    def unknown_parameter(cls, param: str) -> ApiError:
        """400: a field the format does not define (OpenAI rejects these too)."""
        param = clip(param)
        return cls.invalid(
            param,
            f"Unrecognized request argument supplied: {param}",
            code="unknown_parameter",
        )

    @classmethod
    def bad_body(cls, message: str = "The request body must be a JSON object.") -> ApiError:
        """400: the body is not a JSON object (or not JSON at all: pass the parser's message)."""
        return cls.invalid(None, message, code="invalid_body")

    # ---- other statuses, for the HTTP layer -------------------------------------------------

    @classmethod
    def not_found(cls, message: str, *, code: str = "not_found") -> ApiError:
        """404: no such route (or resource other than a model)."""
        return cls(404, message, type=NOT_FOUND, code=code)

    @classmethod
    def too_large(cls, limit: int) -> ApiError:
        """413: the request body is larger than the server reads (``limit`` bytes)."""
        return cls(
            413,
            f"The request body is larger than {limit} bytes.",
            code="request_entity_too_large",
        )

    @classmethod
    def body_timeout(cls, seconds: float) -> ApiError:
        """408: the request body did not arrive within ``seconds``."""
        return cls(
            408, f"The request body did not arrive within {seconds:g} s.", code="request_timeout"
        )

    @classmethod
    def unsupported_media_type(cls, mimetype: str) -> ApiError:
        """415: the body is declared as something other than JSON."""
        return cls(
            415,
            f"Unsupported Content-Type '{clip(mimetype)}': send the body as application/json.",
            code="unsupported_media_type",
        )

    @classmethod
    def model_not_found(cls, model: str) -> ApiError:
        """404: no model of that name is known to the cluster."""
        return cls(
            404,
            f"The model '{clip(model)}' does not exist.",
            type=NOT_FOUND,
            param="model",
            code="model_not_found",
        )

    @classmethod
    def unauthorized(cls, message: str = "Missing or incorrect API key.") -> ApiError:
        """401: the bearer API key is absent or wrong."""
        return cls(401, message, type=AUTHENTICATION, code="invalid_api_key")

    @classmethod
    def over_capacity(cls, message: str = "The server is over capacity; retry later.") -> ApiError:
        """429: the bounded request queue is full."""
        return cls(429, message, type=RATE_LIMIT, code="over_capacity")

    @classmethod
    def unavailable(cls, message: str, *, code: str = "no_ready_instance") -> ApiError:
        """503: nothing can serve the request right now (no ready instance, cluster not ready)."""
        return cls(503, message, type=SERVER, code=code)

    @classmethod
    def timeout(cls, message: str = "The request deadline was exceeded.") -> ApiError:
        """504: the request's deadline passed before it finished."""
        return cls(504, message, type=TIMEOUT, code="deadline_exceeded")

    @classmethod
    def server_error(cls, message: str, *, code: str | None = None) -> ApiError:
        """500: our fault (an engine error, a bug)."""
        return cls(500, message, type=SERVER, code=code)
