"""A small blocking client for a node's HTTP API, as the client commands use it.

:class:`ApiClient` sends one JSON request and returns the decoded JSON answer of a 2xx
response. Everything else is raised as one of three :class:`ClientError` subclasses, each a
value with a name and the exit status the command line gives it:

* :class:`ApiRefused` — the server answered with an error (its envelope's ``code`` and
  ``message``; a response that is not the envelope gets ``code`` ``http_<status>``);
* :class:`BadResponse` — a 2xx answer that is not the JSON the command expects;
* :class:`ApiUnreachable` — no answer at all: connection refused, unknown host, a bad URL, or a
  deadline passed (``connect`` for the connection, ``timeout`` for the whole answer's reads).

The transport is injectable (``httpx.MockTransport`` in tests). Proxy settings of the
environment are ignored (``trust_env=False``): the API is usually on loopback, and an
``HTTP_PROXY`` without a matching ``NO_PROXY`` would send it elsewhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import ClassVar
from urllib.parse import quote

import attrs
import httpx

#: The address of the local node's API (``python -m skulk serve``'s default port).
DEFAULT_API = "http://127.0.0.1:52415"
#: Seconds allowed to open the connection; the whole exchange gets the command's ``--timeout``.
CONNECT_TIMEOUT = 3.0


class ClientError(Exception):
    """A request that did not give the answer asked for; ``exit_status`` is the CLI's."""

    exit_status: ClassVar[int] = 1

    def describe(self) -> str:
        """One line for stderr, without the ``skulk:`` prefix."""
        raise NotImplementedError


@attrs.define(eq=False)
class ApiRefused(ClientError):
    """The server answered ``status`` with an error: ``code`` and ``message`` from its envelope
    (``envelope`` is the whole body, or ``None`` when the body was not the envelope)."""

    status: int
    code: str
    message: str
    envelope: Mapping[str, object] | None = None

    def describe(self) -> str:
        if self.status == 401:  # the node requires a key: say how to give it
            return f"{self.code}: {self.message} (pass --api-key KEY or set SKULK_API_KEY)"
        return f"{self.code}: {self.message}"


@attrs.define(eq=False)
class BadResponse(ClientError):
    """A 2xx answer from ``url`` that is not what the command expects (``detail`` says how)."""

    url: str
    detail: str

    def describe(self) -> str:
        return f"bad_response: {self.url}: {self.detail}"


@attrs.define(eq=False)
class ApiUnreachable(ClientError):
    """No answer from the API at ``api``; ``reason`` is short (``connection refused``)."""

    exit_status: ClassVar[int] = 2

    api: str
    reason: str
    timed_out: bool = False

    def describe(self) -> str:
        if self.timed_out:
            return f"no answer from the Skulk API at {self.api} ({self.reason})"
        return (
            f"cannot reach the Skulk API at {self.api} ({self.reason}); "
            "start a node with `python -m skulk serve`, or point --api / SKULK_API at one"
        )


def normalize_api(api: str) -> str:
    """``api`` as a base URL: ``http://`` added when no scheme is given, no trailing slash."""
    api = api.strip()
    if "://" not in api:
        api = f"http://{api}"
    return api.rstrip("/")


def quote_segment(value: str) -> str:
    """``value`` as one path segment (a ``/`` in an id cannot reach another route)."""
    return quote(value, safe="")


class ApiClient:
    """JSON requests to the API at ``api`` (see the module docstring); a context manager.

    ``timeout`` bounds every read and write of one request (seconds); connecting gets at most
    :data:`CONNECT_TIMEOUT`. ``api_key`` is sent as ``Authorization: Bearer``. ``transport``
    replaces the network (tests).
    """

    def __init__(
        self,
        api: str,
        *,
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
        api_key: str | None = None,
    ) -> None:
        self.api = normalize_api(api)
        self._timeout = timeout
        headers = {"Accept": "application/json", "User-Agent": "skulk-cli"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.Client(
            timeout=httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT)),
            transport=transport,
            trust_env=False,
            headers=headers,
        )

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def get(self, path: str) -> Mapping[str, object]:
        return self.request("GET", path)

    def post(self, path: str, body: Mapping[str, object]) -> Mapping[str, object]:
        return self.request("POST", path, body)

    def delete(self, path: str) -> Mapping[str, object]:
        return self.request("DELETE", path)

    def request(
        self, method: str, path: str, body: Mapping[str, object] | None = None
    ) -> Mapping[str, object]:
        """The JSON object of a 2xx answer to ``method path``; a :class:`ClientError` if not."""
        url = self.api + path
        try:
            response = self._http.request(method, url, json=body)
        except (httpx.InvalidURL, httpx.TransportError) as exc:
            raise self._unreachable(exc) from None
        if response.is_success:
            decoded = _json_object(response)
            if decoded is None:
                raise BadResponse(url, f"HTTP {response.status_code} without a JSON object")
            return decoded
        raise _refusal(response)

    def stream_lines(
        self, method: str, path: str, body: Mapping[str, object] | None = None
    ) -> Iterator[Mapping[str, object]]:
        """The JSON objects of an NDJSON answer to ``method path``, one per line as they
        come (``timeout`` bounds the wait for each read); a :class:`ClientError` if the
        answer is an error, a line is not a JSON object, or the connection fails."""
        url = self.api + path
        try:
            with self._http.stream(method, url, json=body) as response:
                if not response.is_success:
                    response.read()
                    raise _refusal(response)
                for raw in response.iter_lines():
                    if not raw.strip():
                        continue
                    try:
                        decoded = json.loads(raw)
                    except ValueError:
                        raise BadResponse(url, "a line of the stream is not JSON") from None
                    if not isinstance(decoded, dict):
                        raise BadResponse(url, "a line of the stream is not a JSON object")
                    yield decoded
        except (httpx.InvalidURL, httpx.TransportError) as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc: httpx.InvalidURL | httpx.TransportError) -> ApiUnreachable:
        """Why no answer came, as the CLI says it."""
        if isinstance(exc, httpx.TimeoutException):
            which = "connect" if isinstance(exc, httpx.ConnectTimeout) else "read"
            limit = min(self._timeout, CONNECT_TIMEOUT) if which == "connect" else self._timeout
            return ApiUnreachable(self.api, f"{which} timeout after {limit:g}s", True)
        if isinstance(exc, httpx.ConnectError):
            return ApiUnreachable(self.api, _connect_reason(exc))
        if isinstance(exc, httpx.UnsupportedProtocol):
            return ApiUnreachable(self.api, "not an http:// or https:// URL")
        return ApiUnreachable(self.api, str(exc) or type(exc).__name__)


def _connect_reason(exc: httpx.ConnectError) -> str:
    text = str(exc)
    if "refused" in text.lower():
        return "connection refused"
    return text or "cannot connect"


def _json_object(response: httpx.Response) -> dict[str, object] | None:
    try:
        decoded = json.loads(response.content)
    except ValueError:
        return None
    return decoded if isinstance(decoded, dict) else None


def _refusal(response: httpx.Response) -> ApiRefused:
    """The error of a non-2xx ``response``: its envelope if it is one, else ``http_<status>``."""
    body = _json_object(response)
    error = body.get("error") if body is not None else None
    if body is not None and isinstance(error, dict):
        code = error.get("code")
        message = error.get("message")
        return ApiRefused(
            response.status_code,
            code if isinstance(code, str) and code else f"http_{response.status_code}",
            message if isinstance(message, str) else "",
            body,
        )
    text = " ".join(response.text.split())[:200] or response.reason_phrase
    return ApiRefused(response.status_code, f"http_{response.status_code}", text)
