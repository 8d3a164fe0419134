"""The dashboard's routes in process: the page and its assets ship in the package and stay open
with API keys set (they hold no data), the feed needs the key, refuses query parameters, and
each snapshot is what the node's own routes answer (a failing route gives null and its
message, never a failed feed)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from importlib import resources
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from skulk.api import create_app
from skulk.api._dashboard import ASSETS, OPEN_PATHS, SOURCES, Feed, read_route
from skulk.routing import Admission, Router
from skulk.wire.telemetry import NodeReadings

from .test_cluster_routes import app_for
from .test_control_placement import GEMMA, GIB, LLAMA, cluster, make, readings

KEY = "dash-key"


@pytest.fixture
async def node() -> AsyncIterator[tuple[Any, Any]]:
    seen: Mapping[str, NodeReadings] = {n: readings(n, 2 * GIB) for n in "abc"}
    control, driver = make(cluster(LLAMA, GEMMA), seen)
    app = app_for(driver, control, seen)
    async with app.test_app() as test_app:
        yield app, test_app.test_client()


def keyed_app() -> Any:
    state = SimpleNamespace(instances=(), nodes=(), models=())
    router = Router("a", lambda: state, lambda i: None, lambda p: False, None, Admission())  # type: ignore[arg-type]
    local = SimpleNamespace(services={})
    return create_app(router, local, api_keys=[KEY])  # type: ignore[arg-type]


def test_the_package_carries_the_page_and_its_modules() -> None:
    folder = resources.files("skulk.api") / "dashboard"
    shipped = {entry.name for entry in folder.iterdir()}
    assert {"index.html", "app.js", "api.js", "style.css"} <= shipped == set(ASSETS)
    # Every module the page imports is an asset (a missing one is a blank page, not an error).
    for name, body in ASSETS.items():
        text = body.decode()
        for line in text.splitlines():
            if line.startswith("import ") and " from " in line:
                imported = line.rsplit(" from ", 1)[1].strip(' ";').removeprefix("./")
                assert imported in ASSETS, f"{name} imports {imported}, which does not ship"
    assert '<script type="module" src="/dashboard/app.js">' in ASSETS["index.html"].decode()


async def test_the_page_and_assets_are_served_with_their_types(node: tuple[Any, Any]) -> None:
    _, client = node
    page = await client.get("/")
    assert page.status_code == 200 and page.mimetype == "text/html"
    assert "<title>Skulk</title>" in await page.get_data(as_text=True)
    script = await client.get("/dashboard/app.js")
    assert script.status_code == 200 and script.mimetype == "text/javascript"
    assert script.headers["X-Content-Type-Options"] == "nosniff"
    css = await client.get("/dashboard/style.css")
    assert css.mimetype == "text/css"


@pytest.mark.parametrize(
    "path", ["/dashboard/nope.js", "/dashboard/_dashboard.py", "/dashboard/", "/dashboard"]
)
async def test_anything_else_under_dashboard_is_a_404_envelope(
    node: tuple[Any, Any], path: str
) -> None:
    _, client = node
    response = await client.get(path)
    assert response.status_code == 404
    assert "error" in await response.get_json()


async def test_with_keys_the_page_is_open_and_the_feed_needs_the_key() -> None:
    app = keyed_app()
    async with app.test_app() as test_app:
        client = test_app.test_client()
        for path in sorted(OPEN_PATHS):
            assert (await client.get(path)).status_code == 200, path
        assert (await client.get("/dashboard/nope.js")).status_code == 401  # not a real asset
        refused = await client.get("/v1/dashboard/events")
        assert refused.status_code == 401
        assert (await refused.get_json())["error"]["code"] == "invalid_api_key"
        status, frames = await first_frames(app, 1, KEY)
        assert status == 200 and frames[0].startswith(b"event: snapshot\ndata: ")


@pytest.mark.parametrize("query", ["x=1", "limit=5", "since=0"])
async def test_the_feed_refuses_query_parameters_naming_them(
    node: tuple[Any, Any], query: str
) -> None:
    _, client = node
    response = await client.get(f"/v1/dashboard/events?{query}")
    assert response.status_code == 400
    body = await response.get_json()
    assert body["error"]["param"] == query.split("=")[0]


async def first_frames(app: Any, count: int, key: str | None = None) -> tuple[int, list[bytes]]:
    """The feed's status and first ``count`` body frames; then the client goes away (which
    must end the feed: the call returns)."""
    headers = [(b"host", b"node")]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {
        "type": "http", "asgi": {"spec_version": "2.3"}, "http_version": "1.1",
        "method": "GET", "scheme": "http", "path": "/v1/dashboard/events",
        "raw_path": b"/v1/dashboard/events", "query_string": b"", "root_path": "",
        "headers": headers, "client": ("127.0.0.1", 1), "server": ("node", 80), "extensions": {},
    }  # fmt: skip
    gone = trio.Event()
    asked: list[bool] = []
    status: list[int] = []
    frames: list[bytes] = []

    async def receive() -> dict[str, Any]:
        if not asked:
            asked.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            status.append(message["status"])
        elif message["type"] == "http.response.body":
            if message["body"]:
                frames.append(message["body"])
            if len(frames) >= count or not message.get("more_body", False):
                gone.set()

    with trio.fail_after(10):
        await app(scope, receive, send)
    return status[0], frames


def parse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in raw.decode().split("\n\n"):
        lines = block.splitlines()
        if not lines:
            continue
        name = lines[0].removeprefix("event: ")
        data = "\n".join(line.removeprefix("data: ") for line in lines[1:])
        events.append((name, json.loads(data)))
    return events


async def test_the_feed_streams_snapshots_of_the_routes(node: tuple[Any, Any]) -> None:
    app, client = node
    status, frames = await first_frames(app, 2)  # one at once, then one per tick
    assert status == 200
    (name, snap), (name2, _) = parse_events(b"".join(frames))
    assert name == name2 == "snapshot"
    assert snap["node_id"] == "a"
    for part, path in SOURCES.items():
        answer = await client.get(path)
        if answer.status_code == 200:
            expected = await answer.get_json()
            if part == "nodes":  # readings age between the two reads
                assert [r["node_id"] for r in snap[part]["nodes"]] == [
                    r["node_id"] for r in expected["nodes"]
                ]
            else:
                assert snap[part] == expected, part
        else:
            assert snap[part] is None and part in snap["errors"]
    assert [e["kind"] for e in snap["timeline"]["events"]] == ["phase", "phase"]
    assert snap["timeline"]["unanswered"][0]["node"] == "b"  # the silent node, not a stall
    assert snap["errors"]["raft"] == "consensus is not running"


async def test_a_route_the_node_lacks_or_that_fails_is_a_message(node: tuple[Any, Any]) -> None:
    app, _ = node
    assert await read_route(app, "/v1/no/such/route") == (
        None,
        "/v1/no/such/route is not served by this node",
    )
    body, error = await read_route(app, "/v1/diagnostics/cluster/timeline?limit=0")
    assert body is None and error is not None and "limit" in error
    body, error = await read_route(app, "/v1/instances")
    assert error is None and body == {"instances": []}


async def test_a_slow_route_keeps_its_last_answer(node: tuple[Any, Any], monkeypatch: Any) -> None:
    app, _ = node
    feed = Feed(app, "a")
    first = await feed.snapshot()
    assert first["instances"] == {"instances": []}
    import skulk.api._dashboard as dashboard

    async def stalled(app: Any, target: str) -> tuple[object, str | None]:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    monkeypatch.setattr(dashboard, "read_route", stalled)
    monkeypatch.setattr(dashboard, "SOURCE_TIMEOUT", 0.05)
    with trio.fail_after(5):
        second = await feed.snapshot()
    assert second["instances"] == first["instances"] and second["at"] >= first["at"]


async def test_the_feed_carries_the_downloads_and_the_stores(node: tuple[Any, Any]) -> None:
    """The Models view's parts: ``/v1/downloads`` and ``/v1/store`` as the node answers them."""
    app, client = node
    snap = await Feed(app, "a").snapshot()
    assert snap["downloads"] == await (await client.get("/v1/downloads")).get_json()
    assert snap["downloads"] == {"downloads": [], "transfers": []}
    assert snap["store"] == await (await client.get("/v1/store")).get_json()
    store, errors = snap["store"], snap["errors"]
    assert isinstance(store, dict) and store["node"] == "a"
    assert isinstance(errors, dict) and "downloads" not in errors and "store" not in errors
