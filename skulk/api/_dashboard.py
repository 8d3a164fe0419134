"""The dashboard: a page at ``/`` and its live feed, on every node.

``GET /`` answers the page and ``GET /dashboard/<file>`` its assets: plain files shipped in the
package (``skulk/api/dashboard/``: HTML, CSS and JavaScript modules, nothing to build). They
hold no cluster data, so they are open like ``/health`` even with API keys set; everything the
page shows comes from the API, with the key the operator types into the page.

``GET /v1/dashboard/events`` is the feed: a ``text/event-stream`` that sends a ``snapshot``
event at once and then every :data:`TICK` seconds. A snapshot is exactly what this node's own
routes answer (:data:`SOURCES`: ``/v1/cluster/nodes``, ``/v1/instances``,
``/v1/cluster/links``, ``/v1/cluster/raft``, ``/v1/downloads`` and ``/v1/store`` (the
Models view: downloads with their progress, every node's store), and the cluster timeline
every :data:`TIMELINE_EVERY` ticks), each read by calling the route in-process: the page sees what
the REST API says, and nothing is computed twice. A route that fails gives ``null`` for its
part and its message under ``errors`` (one that raises is logged, as its 500 would be); one
slower than :data:`SOURCE_TIMEOUT` keeps its last answer. The feed takes no query parameters
(any is a 400 naming it). It ends when the page goes away (or the node stops: Hypercorn's
graceful timeout cuts it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, Mapping
from importlib import resources
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio

from skulk.api._errors import ApiError
from skulk.api._sse import sse_event
from skulk.clock import wall

log = logging.getLogger("skulk.api")

#: Seconds between snapshots.
TICK = 1.0
#: The timeline is gathered from every node: every this many ticks, not every tick.
TIMELINE_EVERY = 3
#: The longest one source may take before its last answer is reused.
SOURCE_TIMEOUT = 2.5
#: Snapshot part → the route (path and query) that answers it.
SOURCES: Mapping[str, str] = {
    "nodes": "/v1/cluster/nodes",
    "instances": "/v1/instances",
    "links": "/v1/cluster/links",
    "raft": "/v1/cluster/raft",
    "downloads": "/v1/downloads",
    "store": "/v1/store",
}
TIMELINE = ("timeline", "/v1/diagnostics/cluster/timeline?limit=300")
#: The route of the feed.
EVENTS_PATH = "/v1/dashboard/events"

_CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}


def _assets() -> dict[str, bytes]:
    """The page's files by name (read once: they are small and never change at run time)."""
    folder = resources.files("skulk.api") / "dashboard"
    found = {}
    for entry in folder.iterdir():
        suffix = "." + entry.name.rsplit(".", 1)[-1]
        if entry.is_file() and suffix in _CONTENT_TYPES:
            found[entry.name] = entry.read_bytes()
    return found


ASSETS = _assets()
#: The paths that answer without an API key (the page and its assets hold no cluster data).
OPEN_PATHS = frozenset({"/", *(f"/dashboard/{name}" for name in ASSETS)})


def _asset(name: str) -> Response:
    body = ASSETS.get(name)
    if body is None:
        raise ApiError.not_found(f"no dashboard file {name!r}")
    content_type = _CONTENT_TYPES["." + name.rsplit(".", 1)[-1]]
    response = Response(body, status=200, content_type=content_type)
    response.headers["Cache-Control"] = "no-cache"
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


async def read_route(app: QuartTrio, target: str) -> tuple[object, str | None]:
    """What ``GET target`` answers on ``app``, called in-process: ``(body, None)``, or
    ``(None, message)`` when the route fails or does not exist here."""
    path, _, query = target.partition("?")
    try:
        endpoint, args = app.url_map.bind("dashboard").match(path, method="GET")
    except Exception:  # werkzeug's NotFound / MethodNotAllowed: no such route on this node
        return None, f"{path} is not served by this node"
    view: Any = app.ensure_async(app.view_functions[endpoint])  # Quart's union adds nothing
    try:
        async with app.test_request_context(path, query_string=_query(query)):
            response = await app.make_response(await view(**args))
        if not isinstance(response, Response):  # never: every route answers a Quart Response
            raise TypeError(f"{path} answered {type(response).__name__}")
        status = response.status_code
        body = json.loads(await response.get_data(as_text=True))
    except ApiError as exc:
        return None, exc.message
    except Exception:  # a bug in a route: as its 500 would, it fails its part, not the feed
        log.exception("dashboard: reading %s failed", path)
        return None, f"{path} failed on this node (see its log)"
    if status >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        return None, str(message or f"{path} answered {status}")
    return body, None


def _query(query: str) -> dict[str, Any]:
    pairs = (item.partition("=") for item in query.split("&") if item)
    return {name: value for name, _, value in pairs}


class Feed:
    """One open feed's last answers, so a slow source keeps its previous part."""

    def __init__(self, app: QuartTrio, node_id: str) -> None:
        self.app = app
        self.node_id = node_id
        self.parts: dict[str, object] = {}
        self.errors: dict[str, str] = {}
        self.ticks = 0

    async def snapshot(self) -> dict[str, object]:
        """Read every source (the timeline every :data:`TIMELINE_EVERY` ticks) at once."""
        sources = dict(SOURCES)
        if self.ticks % TIMELINE_EVERY == 0:
            sources[TIMELINE[0]] = TIMELINE[1]
        self.ticks += 1
        async with trio.open_nursery() as nursery:
            for name, target in sources.items():
                nursery.start_soon(self._read, name, target)
        return {
            "at": wall(),
            "node_id": self.node_id,
            **{name: self.parts.get(name) for name in (*SOURCES, TIMELINE[0])},
            "errors": dict(self.errors),
        }

    async def _read(self, name: str, target: str) -> None:
        with trio.move_on_after(SOURCE_TIMEOUT):
            body, error = await read_route(self.app, target)
            self.parts[name] = body
            if error is None:
                self.errors.pop(name, None)
            else:
                self.errors[name] = error

    async def frames(self) -> AsyncGenerator[bytes, None]:
        """The feed's SSE body: a snapshot now, then one each :data:`TICK` seconds."""
        while True:
            started = trio.current_time()
            snap = await self.snapshot()
            yield b"event: snapshot\n" + sse_event(snap)
            await trio.sleep_until(started + TICK)


def install_dashboard(app: QuartTrio, node_id: str) -> None:
    """Add ``/``, ``/dashboard/<file>`` and :data:`EVENTS_PATH` to ``app``."""

    @app.get("/")
    async def dashboard_page() -> Response:
        return _asset("index.html")

    @app.get("/dashboard/<name>")
    async def dashboard_asset(name: str) -> Response:
        return _asset(name)

    @app.get(EVENTS_PATH)
    async def dashboard_events() -> Response:
        for name in request.args:
            raise ApiError.unknown_parameter(name)
        response = Response(
            Feed(app, node_id).frames(), status=200, content_type="text/event-stream"
        )
        response.headers["Cache-Control"] = "no-cache"
        response.timeout = None  # the feed runs until the page closes it
        return response
