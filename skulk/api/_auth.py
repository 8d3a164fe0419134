"""API keys: one check in front of every route but ``/health``.

With keys configured (``--api-key``, ``SKULK_API_KEY``, ``--api-key-file``), every HTTP request
and WebSocket handshake must carry one of them, as each client format sends its key:

* ``Authorization: Bearer <key>`` — the ``openai`` and ``ollama`` clients, curl, the CLI;
* ``x-api-key: <key>`` — the ``anthropic`` client.

A request without one of the keys is answered 401 in the envelope of the format its path speaks
(OpenAI ``invalid_api_key``, Anthropic ``authentication_error``, Ollama ``{"error": …}``) with
``WWW-Authenticate: Bearer``; a WebSocket handshake is refused with the same 401. The check runs
as the app's first ``before_request`` / ``before_websocket`` hook, after the request guard has
read the whole body (answering before the body has arrived would wedge the keep-alive
connection: see :mod:`skulk.api._guard`), so the route never runs and unknown paths are 401
too (nobody without a key learns which routes exist). Only ``/health`` stays open (load
balancers probe it, and it tells nothing a key protects), and the dashboard's static page and
assets (``/``, ``/dashboard/<file>``), which hold no data: the page asks for the key.

Each presented key is compared with *every* configured key with :func:`hmac.compare_digest`,
never stopping at the first match, so the time taken does not tell which key, or how much of
one, was right. The node-to-node mesh does not come through here: it is authenticated by the
cluster secret.
"""

from __future__ import annotations

import hmac
import ipaddress
from collections.abc import Iterable, Sequence

from quart import request, websocket
from quart_trio import QuartTrio

from skulk.api._dashboard import OPEN_PATHS as DASHBOARD_PATHS
from skulk.api._errors import ApiError

#: Paths answered without a key: the health probe, and the dashboard's page and assets (they
#: hold no cluster data; the page calls the API with the key the operator gives it).
OPEN_PATHS = frozenset({"/health", *DASHBOARD_PATHS})
#: What a 401 asks for (RFC 6750); the ``x-api-key`` header is accepted as well.
CHALLENGE = 'Bearer realm="skulk"'


class ApiKeys:
    """The configured keys, and the one check of a request's headers against them."""

    def __init__(self, keys: Iterable[str]) -> None:
        self._keys = tuple(key.encode("ascii") for key in keys)
        if not self._keys:
            raise ValueError("ApiKeys needs at least one key")

    def __len__(self) -> int:
        return len(self._keys)

    def matches(self, presented: str) -> bool:
        """Whether ``presented`` is one of the keys, in time independent of which one."""
        given = presented.encode("latin-1", "replace")  # header values arrive as latin-1
        found = False
        for key in self._keys:
            found |= hmac.compare_digest(given, key)
        return found

    def check(self, authorization: str | None, x_api_key: str | None) -> None:
        """Raise the 401 :class:`ApiError` unless the request's ``Authorization`` (a bearer
        token) or ``x-api-key`` header carries one of the keys."""
        presented = presented_keys(authorization, x_api_key)
        if not presented:
            raise unauthorized(
                "Missing API key: send it as 'Authorization: Bearer <key>' (or 'x-api-key: <key>')."
            )
        # Every presented key is checked (no short cut): a wrong bearer beside a right
        # x-api-key is still let in, as either header alone would be.
        results = [self.matches(key) for key in presented]
        if not any(results):
            raise unauthorized("Incorrect API key provided.")


def presented_keys(authorization: str | None, x_api_key: str | None) -> list[str]:
    """The keys a request presents: the token of its ``Authorization: Bearer`` header and its
    ``x-api-key`` header."""
    keys = []
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        keys.append(token.strip())
    if api_key := (x_api_key or "").strip():
        keys.append(api_key)
    return keys


def unauthorized(message: str) -> ApiError:
    """401 with the ``WWW-Authenticate`` challenge."""
    err = ApiError.unauthorized(message)
    err.headers = {"WWW-Authenticate": CHALLENGE}
    return err


def install_api_keys(app: QuartTrio, keys: Sequence[str]) -> None:
    """Require one of ``keys`` on every route of ``app`` but :data:`OPEN_PATHS` (nothing to do
    without keys). Call before the app's other hooks and routes, so the check runs first."""
    if not keys:
        return
    api_keys = ApiKeys(keys)

    @app.before_request
    async def require_key() -> None:
        if request.scope["path"] not in OPEN_PATHS:
            headers = request.headers
            api_keys.check(headers.get("authorization"), headers.get("x-api-key"))

    @app.before_websocket
    async def require_key_ws() -> None:
        if websocket.scope["path"] not in OPEN_PATHS:
            headers = websocket.headers
            api_keys.check(headers.get("authorization"), headers.get("x-api-key"))


def exposure_warning(host: str, *, has_keys: bool) -> str | None:
    """The start-up warning for an API bound where other machines reach it with no key
    (``None`` when the host is loopback or keys are set)."""
    if has_keys or is_loopback(host):
        return None
    where = host or "every interface"
    return (
        f"the HTTP API binds {where}, reachable from other machines, and has no API key: "
        "anyone who can reach it can use every model and change the cluster (placements, "
        "deletions, node removal). Set --api-key, SKULK_API_KEY or --api-key-file, or bind "
        "127.0.0.1."
    )


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (``127.0.0.0/8``, ``::1``)."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
