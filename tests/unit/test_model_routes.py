"""The model routes (skulk.api._model_routes) with a fake control whose ``pull`` is an async
generator, the telemetry as a fixed snapshot, and a real model store on tmp_path."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import attrs
import jsonschema
import pytest
import trio

from skulk.api import create_app
from skulk.api._openapi import openapi_document
from skulk.cluster import Instance, State
from skulk.control import ControlUnavailable
from skulk.hub import (
    Gated,
    HashMismatch,
    HubUnreachable,
    NoWeights,
    OfflineMissing,
    RepoNotFound,
    RevisionNotFound,
    UnsupportedArchitecture,
)
from skulk.routing import Admission, Router
from skulk.store import ModelStore, StoreFull
from skulk.wire.cluster import Architecture, Download, HubSource, ModelCard, Shard
from skulk.wire.telemetry import ModelTransfer, NodeReadings, StoredModelReading, StoreReading

from .test_control_placement import GIB, readings
from .test_store import make_model, safetensors

COMMIT = "c" * 40
WAIT = object()  # in a script: the pull waits there forever


@attrs.frozen
class Status:
    """A PullStatus as the control yields it."""

    model: str = "org/m"
    phase: str = "downloading"
    repo: str = "org/m"
    commit: str = COMMIT
    total_bytes: int = 300
    downloader: str | None = "a"
    holders: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ("a", "b")
    transfers: tuple[tuple[str, ModelTransfer], ...] = ()
    done_bytes: int = 0
    target_bytes: int = 300


class PullFailed(Exception):
    """As skulk.control.PullFailed: a reason and a message."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def transfer(file: str, done: int, total: int = 100, overall: int = 0) -> ModelTransfer:
    return ModelTransfer("org/m", "hub", overall or done, 300, file, done, total, 10.0, 2.0, 1.0)


@attrs.define
class FakeState:
    models: tuple[ModelCard, ...] = ()
    instances: tuple[Instance, ...] = ()
    downloads: tuple[Download, ...] = ()

    def model(self, model_id: str) -> ModelCard | None:
        return next((c for c in self.models if c.id == model_id), None)


class FakeControl:
    """``pull`` plays ``script`` (statuses, exceptions to raise, WAIT); it counts pulls
    started and closed."""

    node_id = "a"

    def __init__(self, script: Sequence[object] = (), state: FakeState | None = None) -> None:
        self.script = list(script)
        self.scripts: dict[str, list[object]] = {}  # by name, else script
        self.state = state or FakeState()
        self.asked: list[str] = []
        self.closed = 0
        self.waiting = trio.Event()
        self.pulls: list[AsyncIterator[Status]] = []

    def pull(self, name: str) -> AsyncIterator[Status]:
        # kept referenced, so the garbage collector's finaliser never closes one: only the
        # route (an aclose, or a cancellation while the pull waits) counts in ``closed``
        self.pulls.append(self._pull(name))
        return self.pulls[-1]

    async def _pull(self, name: str) -> AsyncIterator[Status]:
        self.asked.append(name)
        try:
            for item in self.scripts.get(name, self.script):
                if item is WAIT:
                    self.waiting.set()
                    await trio.sleep_forever()
                if isinstance(item, Exception):
                    raise item
                assert isinstance(item, Status)
                yield item
        finally:
            self.closed += 1


class FakeGossip:
    def __init__(self, seen: Mapping[str, NodeReadings]) -> None:
        self.seen = seen

    @property
    def store(self) -> Any:
        return SimpleNamespace(view={n: SimpleNamespace(readings=r) for n, r in self.seen.items()})


def app_for(
    control: FakeControl,
    seen: Mapping[str, NodeReadings] | None = None,
    store: ModelStore | None = None,
    api_keys: Sequence[str] = (),
) -> Any:
    router = Router("a", State, lambda i: None, lambda p: False, None, Admission())  # type: ignore[arg-type]
    return create_app(
        router,
        SimpleNamespace(services={}),  # type: ignore[arg-type]
        control=control,  # type: ignore[arg-type]
        gossip=FakeGossip(seen or {}),  # type: ignore[arg-type]
        store=store,
        api_keys=api_keys,
    )


async def call(
    app: Any, method: str, path: str, body: object = None, raw: bytes | None = None
) -> tuple[int, bytes]:
    async with app.test_app() as test_app:
        client = test_app.test_client()
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else b"")
        with trio.fail_after(10):
            response = await client.open(
                path, method=method, data=data, headers={"content-type": "application/json"}
            )
            return response.status_code, await response.get_data()


def lines(data: bytes) -> list[dict[str, Any]]:
    return [json.loads(line) for line in data.decode().splitlines()]


CHECKING = Status(phase="checking", downloader=None)
DOWNLOADING = [
    Status(transfers=(("a", transfer("model-1.safetensors", 50)),), done_bytes=50),
    Status(transfers=(("a", transfer("model-1.safetensors", 100)),), done_bytes=100),
    Status(transfers=(("a", transfer("model-2.safetensors", 80, 200, 180)),), done_bytes=180),
]
SPREADING = Status(phase="spreading", holders=("a",), done_bytes=350, target_bytes=600)
DONE = Status(phase="done", holders=("a", "b"), done_bytes=600, target_bytes=600)
SCRIPT = [CHECKING, *DOWNLOADING, SPREADING, DONE]


# ---- POST /v1/pulls --------------------------------------------------------------------------


async def test_a_streamed_pull_is_ndjson_statuses_ending_done() -> None:
    control = FakeControl(SCRIPT)
    status, data = await call(app_for(control), "POST", "/v1/pulls", {"model": "org/m"})
    assert status == 200
    got = lines(data)
    assert [g["phase"] for g in got] == [
        "checking", "downloading", "downloading", "downloading", "spreading", "done"
    ]  # fmt: skip
    assert got[1]["transfers"][0] == {
        "node": "a", "model": "org/m", "source": "hub", "file": "model-1.safetensors",
        "file_done": 50, "file_total": 100, "bytes_done": 50, "bytes_total": 300,
        "rate_bps": 10.0, "eta_s": 2.0, "started_at": 1.0,
    }  # fmt: skip
    assert got[-1]["holders"] == ["a", "b"] and got[-1]["done_bytes"] == got[-1]["target_bytes"]
    assert control.asked == ["org/m"] and control.closed == 1


async def test_a_pull_not_streamed_answers_the_last_status() -> None:
    control = FakeControl(SCRIPT)
    body = {"model": " org/m@v2 ", "stream": False}
    status, data = await call(app_for(control), "POST", "/v1/pulls", body)
    assert status == 200
    assert json.loads(data)["phase"] == "done"
    assert control.asked == ["org/m@v2"]


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (RepoNotFound("org/m"), 404, "repo_not_found"),
        (RevisionNotFound("org/m", "v9"), 404, "revision_not_found"),
        (OfflineMissing("org/m", "not in the store nor the Hub cache"), 404, "offline_missing"),
        (NoWeights("org/m"), 422, "no_weights"),
        (HashMismatch("org/m", "w.safetensors", "a" * 64, "b" * 64), 502, "hash_mismatch"),
        (Gated("org/m", 401, had_token=False), 401, "gated"),
        (Gated("org/m", 403, had_token=True), 403, "gated"),
        (UnsupportedArchitecture("org/m", "bert"), 422, "unsupported_architecture"),
        (HubUnreachable("org/m", "http://hub", 3, "refused"), 502, "hub_unreachable"),
        (PullFailed("disk_full", "no node has room for 300 bytes"), 507, "disk_full"),
        (StoreFull(300, 10, 0, limit="budget"), 507, "disk_full"),
        (PullFailed("node_down", "the downloader went down"), 502, "node_down"),
        (ControlUnavailable("no_quorum", "no quorum"), 503, "no_quorum"),
        (
            PullFailed("placement_info_pending", "no store reading yet"),
            503,
            "placement_info_pending",
        ),
        (PullFailed("node_not_up", "b is not up"), 503, "node_not_up"),
        (PullFailed("duplicate_download", "c downloads it"), 409, "duplicate_download"),
    ],
)
async def test_a_failure_before_the_download_is_its_typed_status(
    error: Exception, status: int, code: str
) -> None:
    control = FakeControl([CHECKING, error])
    got, data = await call(app_for(control), "POST", "/v1/pulls", {"model": "org/m"})
    assert got == status
    envelope = json.loads(data)["error"]
    assert envelope["code"] == code and envelope["message"]
    assert control.closed == 1
    if status == 503:  # the cluster is not ready: try again soon
        assert await retry_after(app_for(FakeControl([CHECKING, error]))) == "1"


async def retry_after(app: Any) -> str | None:
    """The ``Retry-After`` header of ``POST /v1/pulls`` of org/m."""
    async with app.test_app() as test_app:
        response = await test_app.test_client().post("/v1/pulls", json={"model": "org/m"})
        value: str | None = response.headers.get("Retry-After")
        return value


async def test_a_failure_after_the_stream_started_is_its_last_line() -> None:
    control = FakeControl([CHECKING, DOWNLOADING[0], PullFailed("hash_mismatch", "bad bytes")])
    status, data = await call(app_for(control), "POST", "/v1/pulls", {"model": "org/m"})
    assert status == 200
    got = lines(data)
    assert got[-1]["error"]["code"] == "hash_mismatch"
    assert got[-1]["error"]["message"] == "bad bytes"
    assert [g.get("phase") for g in got[:-1]] == ["checking", "downloading"]


@pytest.mark.parametrize("path", ["/v1/pulls", "/api/pull"])
async def test_a_failure_of_a_pull_not_streamed_is_its_typed_status(path: str) -> None:
    control = FakeControl([CHECKING, DOWNLOADING[0], PullFailed("hash_mismatch", "bad bytes")])
    status, data = await call(app_for(control), "POST", path, {"model": "org/m", "stream": False})
    assert status == 502
    error = json.loads(data)["error"]
    assert (error if isinstance(error, str) else error["message"]) == "bad bytes"
    assert control.closed == 1


async def test_a_bug_in_the_pull_is_a_500_before_the_stream_and_a_line_after() -> None:
    before = FakeControl([CHECKING, RuntimeError("boom")])
    status, data = await call(app_for(before), "POST", "/v1/pulls", {"model": "org/m"})
    assert status == 500 and json.loads(data)["error"]["code"] == "internal"
    after = FakeControl([DOWNLOADING[0], RuntimeError("boom")])
    status, data = await call(app_for(after), "POST", "/v1/pulls", {"model": "org/m"})
    assert status == 200 and lines(data)[-1]["error"]["code"] == "internal"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({}, "model", "missing_required_parameter"),
        ({"model": None}, "model", "missing_required_parameter"),
        ({"model": 3}, "model", "invalid_type"),
        ({"model": ["org/m"]}, "model", "invalid_type"),
        ({"model": ""}, "model", "invalid_value"),
        ({"model": "just-a-name"}, "model", "invalid_value"),
        ({"model": "org/m/extra"}, "model", "invalid_value"),
        ({"model": "/abs/path"}, "model", "invalid_value"),
        ({"model": "org/m@"}, "model", "invalid_value"),
        ({"model": "org/" + "x" * 100_000}, "model", "invalid_value"),
        ({"model": "org/m\u0000"}, "model", "invalid_value"),
        ({"model": "org/m", "stream": "yes"}, "stream", "invalid_type"),
        ({"model": "org/m", "stream": 1}, "stream", "invalid_type"),
        ({"model": "org/m", "revision": "main"}, "revision", "unknown_parameter"),
    ],
)
async def test_bad_pull_bodies_are_400_naming_the_field(
    body: dict[str, object], param: str, code: str
) -> None:
    control = FakeControl(SCRIPT)
    status, data = await call(app_for(control), "POST", "/v1/pulls", body)
    assert status == 400
    error = json.loads(data)["error"]
    assert (error["param"], error["code"]) == (param, code)
    assert len(error["message"]) < 600  # a huge name is not echoed back in full
    assert control.asked == []


@pytest.mark.parametrize("raw", [b"", b"{", b"[]", b'"org/m"', b"null", b'{"model": NaN}'])
async def test_a_pull_body_that_is_not_a_json_object_is_400(raw: bytes) -> None:
    control = FakeControl(SCRIPT)
    status, data = await call(app_for(control), "POST", "/v1/pulls", raw=raw)
    assert status == 400 and json.loads(data)["error"]["code"].startswith("invalid")
    assert control.asked == []


async def test_a_client_that_leaves_mid_stream_closes_its_pull_only() -> None:
    """One client goes away while its pull waits on the cluster: its status generator is
    closed; another pull running meanwhile goes on to its end."""
    control = FakeControl([CHECKING, DOWNLOADING[0], DONE])
    control.scripts["org/leaving"] = [CHECKING, DOWNLOADING[0], WAIT]
    app = app_for(control)
    async with app.test_app():
        async with trio.open_nursery() as nursery:
            with trio.fail_after(10):
                nursery.start_soon(leave_after_a_line, app, {"model": "org/leaving"})
                await control.waiting.wait()  # its first lines are out; the pull waits
                status, data = await call(app, "POST", "/v1/pulls", {"model": "org/staying"})
    assert status == 200 and lines(data)[-1]["phase"] == "done"
    assert control.asked == ["org/leaving", "org/staying"] and control.closed == 2


@pytest.mark.parametrize("path", ["/v1/pulls", "/api/pull"])
async def test_a_client_that_leaves_during_the_check_closes_its_pull(path: str) -> None:
    """The client goes away before any line (the Hub check still runs): the pull is closed,
    the request ends, nothing hangs."""
    control = FakeControl([WAIT])
    app = app_for(control)
    async with app.test_app():
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(leave_after_a_line, app, {"model": "org/m"}, path, control)
    assert control.asked == ["org/m"] and control.closed == 1


async def leave_after_a_line(
    app: Any, body: dict[str, object], path: str = "/v1/pulls", waiting: Any = None
) -> None:
    """``POST /v1/pulls`` in a plain ASGI call whose client goes away once a line of the
    body has come; returns when the request has ended."""
    scope = {
        "type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2),
        "headers": [(b"content-type", b"application/json")], "extensions": {},
    }  # fmt: skip
    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    gone = trio.Event()

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        if waiting is not None:  # leave once the pull waits, before any line
            await waiting.waiting.wait()
            gone.set()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            gone.set()

    await app(scope, receive, send)


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/v1/pulls"), ("POST", "/api/pull"), ("GET", "/v1/downloads"),
     ("GET", "/v1/store"), ("DELETE", "/v1/store/org/m")],
)  # fmt: skip
async def test_the_model_routes_need_the_key_when_keys_are_set(method: str, path: str) -> None:
    control = FakeControl(SCRIPT)
    status, _ = await call(app_for(control, api_keys=("k1",)), method, path, {"model": "org/m"})
    assert status == 401 and control.asked == []


# ---- POST /api/pull (Ollama) -----------------------------------------------------------------


async def test_the_ollama_pull_stream_has_a_bar_per_file_then_success() -> None:
    control = FakeControl(SCRIPT)
    status, data = await call(app_for(control), "POST", "/api/pull", {"model": "org/m"})
    assert status == 200
    got = lines(data)
    assert got[0] == {"status": "pulling manifest"}
    assert got[-3:] == [
        {"status": "verifying sha256 digest"},
        {"status": "writing manifest"},
        {"status": "success"},
    ]
    bars = [g for g in got if "digest" in g]
    assert all(g["digest"].startswith("sha256:") and len(g["digest"]) == 71 for g in bars)
    first, second = bars[0]["digest"], bars[3]["digest"]
    assert [b["completed"] for b in bars if b["digest"] == first] == [50, 100, 100]
    assert {b["total"] for b in bars if b["digest"] == first} == {100}
    assert [b["completed"] for b in bars if b["digest"] == second][:1] == [80]
    spread = [g for g in got if g["status"].startswith("spreading")]
    assert spread == [
        {"status": "spreading to 1 node", "digest": spread[0]["digest"], "total": 600,
         "completed": 350}
    ]  # fmt: skip


async def test_the_ollama_pull_takes_name_insecure_and_stream_false() -> None:
    control = FakeControl(SCRIPT)
    body = {"name": "org/m", "insecure": False, "stream": False}
    status, data = await call(app_for(control), "POST", "/api/pull", body)
    assert (status, json.loads(data)) == (200, {"status": "success"})


async def test_ollama_pull_errors_are_ollama_envelopes() -> None:
    control = FakeControl([RepoNotFound("org/nope")])
    status, data = await call(app_for(control), "POST", "/api/pull", {"model": "org/nope"})
    assert status == 404 and "org/nope" in json.loads(data)["error"]
    mid = FakeControl([DOWNLOADING[0], PullFailed("hub_unreachable", "the Hub went away")])
    status, data = await call(app_for(mid), "POST", "/api/pull", {"model": "org/m"})
    assert status == 200 and lines(data)[-1]["error"] == "the Hub went away"
    for body in ({}, {"model": 1}, {"model": "x"}, {"model": "org/m", "insecure": "no"}):
        status, data = await call(app_for(control), "POST", "/api/pull", body)
        assert status == 400 and isinstance(json.loads(data)["error"], str)


@pytest.mark.parametrize(
    "body",
    [
        {"model": "hf.co/"}, {"model": "org/m:"}, {"model": ":latest"}, {"model": "org/m:q4"},
        {"model": "org/m x"}, {"model": "org/\u0000"}, {"model": "../../etc"},
        {"model": "org/" + "x" * 100_000},
        {"model": "", "name": "org/m"}, {"model": None, "name": 5}, {"name": None},
        {"model": "org/m", "stream": "false"}, {"model": "org/m", "stream": None, "x": 1},
        [], "org/m",
    ],
)  # fmt: skip
async def test_odd_ollama_pull_bodies_are_400_without_a_pull(body: object) -> None:
    control = FakeControl(SCRIPT)
    status, data = await call(app_for(control), "POST", "/api/pull", body)
    assert status == 400
    error = json.loads(data)["error"]
    assert isinstance(error, str) and 0 < len(error) < 600
    assert control.asked == []


async def test_the_ollama_pull_takes_model_before_name_and_strips_it() -> None:
    control = FakeControl(SCRIPT)
    body = {"model": " hf.co/org/m:latest ", "name": "other/x", "stream": False}
    status, _ = await call(app_for(control), "POST", "/api/pull", body)
    assert status == 200 and control.asked == ["org/m"]


# ---- GET /v1/downloads, GET /v1/store, DELETE /v1/store/{model} ----------------------------


def card(model: str, sha: str, holders: tuple[str, ...]) -> ModelCard:
    arch = Architecture("llama", 2, 8, 2, 2, 32)
    return ModelCard(model, HubSource(model, COMMIT), arch, 300, 128, sha, holders)


async def test_downloads_show_the_state_and_every_nodes_transfers() -> None:
    failed = Download("org/m", "org/m", COMMIT, "b", 300, "failed", 4, "disk_full", "full")
    running = Download("org/m", "org/m", COMMIT, "a", 300, "downloading", 5)
    control = FakeControl(state=FakeState(downloads=(failed, running)))
    seen = {
        "a": attrs.evolve(readings("a", GIB), transfers=(transfer("x.safetensors", 5),)),
        "b": readings("b", GIB),
    }
    status, data = await call(app_for(control, seen), "GET", "/v1/downloads")
    assert status == 200
    body = json.loads(data)
    assert [(d["node"], d["status"], d["reason"]) for d in body["downloads"]] == [
        ("b", "failed", "disk_full"), ("a", "downloading", None)
    ]  # fmt: skip
    assert [(t["node"], t["file"], t["bytes_done"]) for t in body["transfers"]] == [
        ("a", "x.safetensors", 5)
    ]


@pytest.fixture
def store(tmp_path: Path) -> ModelStore:
    store = ModelStore(tmp_path / "store", budget_bytes=10 * GIB, disk_free=lambda: 100 * GIB)
    store.import_directory(
        make_model(tmp_path / "src", {"model.safetensors": safetensors(b"\0" * 64)}), "org/m"
    )
    return store


async def test_store_shows_this_node_every_node_and_the_holders(store: ModelStore) -> None:
    (stored,) = store.models()
    control = FakeControl(state=FakeState(models=(card("org/m", stored.sha256, ("a", "b")),)))
    theirs = StoredModelReading(stored.sha256, ("org/m",), 9, 2.0)
    reading = StoreReading(1000, None, 5000, (theirs,))
    seen = {"b": attrs.evolve(readings("b", GIB), store=reading), "c": readings("c", GIB)}
    status, data = await call(app_for(control, seen, store), "GET", "/v1/store")
    assert status == 200
    body = json.loads(data)
    assert body["node"] == "a"
    (mine,) = body["store"]["stored"]
    assert (mine["sha256"], mine["names"], mine["models"], mine["holders"]) == (
        stored.sha256, ["org/m"], ["org/m"], ["a", "b"]
    )  # fmt: skip
    assert body["store"]["budget_bytes"] == 10 * GIB
    assert [n["node"] for n in body["nodes"]] == ["b"]  # c has no store reading
    assert body["nodes"][0]["stored"][0]["holders"] == ["a", "b"]
    assert body["models"][0]["source"] == {"kind": "hub", "repo": "org/m", "commit": COMMIT}


async def test_rm_model_removes_it_by_name_or_hash(store: ModelStore, tmp_path: Path) -> None:
    (stored,) = store.models()
    status, data = await call(app_for(FakeControl(), store=store), "DELETE", "/v1/store/org/m")
    assert status == 200 and json.loads(data)["removed"]["sha256"] == stored.sha256
    assert store.models() == []
    again = store.import_directory(tmp_path / "src", "other")
    path = f"/v1/store/{again.sha256}"
    status, _ = await call(app_for(FakeControl(), store=store), "DELETE", path)
    assert status == 200 and store.models() == []


async def test_rm_model_is_refused_while_an_instance_uses_it(store: ModelStore) -> None:
    (stored,) = store.models()
    instance = Instance("i1", "org/m", "single", (Shard(0, "b", 0, 2),), "ready", 3)
    state = FakeState(models=(card("org/m", stored.sha256, ("a",)),), instances=(instance,))
    app = app_for(FakeControl(state=state), store=store)
    status, data = await call(app, "DELETE", "/v1/store/org/m")
    assert status == 409
    error = json.loads(data)["error"]
    assert error["code"] == "model_in_use" and "i1" in error["message"]
    assert store.models() == [stored]


@pytest.mark.parametrize(
    "path", ["/v1/store/nope", "/v1/store/org/nope", "/v1/store/" + "x" * 5000, "/v1/store/..%2F.."]
)
async def test_rm_model_of_an_unknown_model_is_404(store: ModelStore, path: str) -> None:
    status, data = await call(app_for(FakeControl(), store=store), "DELETE", path)
    assert status == 404
    error = json.loads(data)["error"]
    assert error["code"] in ("model_not_found", "not_found") and len(error["message"]) < 300
    assert len(store.models()) == 1


async def test_without_a_store_the_store_routes_still_answer() -> None:
    status, data = await call(app_for(FakeControl()), "GET", "/v1/store")
    assert status == 200 and json.loads(data)["store"] is None
    status, data = await call(app_for(FakeControl()), "DELETE", "/v1/store/org/m")
    assert status == 404 and json.loads(data)["error"]["code"] == "model_not_found"


async def test_the_answers_match_the_documented_schemas(store: ModelStore) -> None:
    document = openapi_document()
    paths: dict[str, Any] = document["paths"]  # type: ignore[assignment]
    (stored,) = store.models()
    control = FakeControl(SCRIPT, FakeState(models=(card("org/m", stored.sha256, ("a",)),)))
    app = app_for(control, {"b": readings("b", GIB)}, store)
    for method, path, doc_path, body in [
        ("POST", "/v1/pulls", "/v1/pulls", {"model": "org/m", "stream": False}),
        ("POST", "/api/pull", "/api/pull", {"model": "org/m", "stream": False}),
        ("GET", "/v1/downloads", "/v1/downloads", None),
        ("GET", "/v1/store", "/v1/store", None),
        ("DELETE", "/v1/store/org/m", "/v1/store/{model}", None),
    ]:
        status, data = await call(app, method, path, body)
        assert status == 200, (path, data)
        answer = paths[doc_path][method.lower()]["responses"]["200"]["content"]
        schema = {**answer["application/json"]["schema"], "components": document["components"]}
        jsonschema.validate(json.loads(data), schema)
