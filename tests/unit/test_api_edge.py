"""The API's edge, in process: the app (Quart-Trio test client, or plain ASGI calls) over a fake
model service that records what reaches it. No sockets, no runner.

Each request can fail only itself: bad input is a 400 naming the field before anything reaches
the service; errors known before the first token are plain errors, not streams; a stream whose
body is never sent still cancels its generation; every error is the JSON envelope.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Any

import pytest
import trio
from quart_trio import QuartTrio

from skulk.api import create_app
from skulk.cluster import State, apply
from skulk.engine.protocol import TO_RUNNER
from skulk.routing import Admission, Router
from skulk.wire.cluster import (
    Architecture,
    ModelCard,
    PathSource,
    PlaceInstance,
    RegisterModel,
    Shard,
    UpsertNode,
)
from skulk.wire.runner import (
    ChatMessage,
    ChatPrompt,
    Generate,
    GenerationEnd,
    Prompt,
    SamplingParams,
    TextPrompt,
    Usage,
)
from skulk.worker import ModelStatus, ModelUnavailable, RequestFailure

MODEL = "org/fake-model"
USER = [{"role": "user", "content": "hi"}]
DONE = GenerationEnd("stop", Usage(prompt_tokens=2, completion_tokens=2))

#: The start of a valid chat body, for appending raw JSON fields.
PRE = b'{"model": "org/fake-model", "messages": [{"role": "user", "content": "x"}], '
#: A script step: text or the end (yielded), an exception (raised), or WAIT (block forever).
WAIT = object()


class FakeService:
    """What the app needs of :class:`~skulk.worker.ModelService`, scripted.

    ``generate`` encodes the runner frame first, as the real service does, so a value that
    cannot travel to a runner fails here the way it would there.
    """

    model_id = MODEL

    def __init__(self, script: Sequence[object] = ("Hel", "lo", DONE)) -> None:
        self.script = list(script)
        self.by_text: dict[str, list[object]] = {}  # a prompt's (last) text picks its own script
        self.state = "ready"
        self.started = 0
        self.closed = 0

    def status(self) -> ModelStatus:
        return ModelStatus(MODEL, self.state)  # type: ignore[arg-type]

    def recent_runners(self) -> tuple[()]:
        return ()

    def retry_now(self) -> bool:
        return False

    async def generate(
        self, prompt: Prompt, params: SamplingParams
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        TO_RUNNER.encode(Generate(request_id="r", prompt=prompt, params=params))
        self.started += 1
        text = prompt.text if isinstance(prompt, TextPrompt) else prompt.messages[-1].content
        try:
            for step in self.by_text.get(text, self.script):
                if isinstance(step, BaseException):
                    raise step
                if step is WAIT:
                    await trio.sleep_forever()
                assert isinstance(step, str | GenerationEnd)
                yield step
        finally:
            self.closed += 1


class FakeNode:
    """One node running ``service`` as instance ``i1`` of :data:`MODEL`, in a real cluster
    State, behind a real :class:`~skulk.routing.Router` (no peers: nothing is remote)."""

    def __init__(self, service: FakeService) -> None:
        card = ModelCard(MODEL, PathSource("/m"), Architecture("llama", 2, 8, 2, 2, 10), 1, 64)
        state = State()
        for command in (
            UpsertNode("n1", "http://n1", "ws://n1", 0),
            RegisterModel(card),
            PlaceInstance("i1", MODEL, "single", (Shard(0, "n1", 0, 2),), 0),
        ):
            state, _ = apply(state, command)
        self.state = state
        self.services = {"i1": service}


def app_for(
    service: FakeService, admission: Admission | None = None, api_keys: tuple[str, ...] = ()
) -> QuartTrio:
    node = FakeNode(service)
    router = Router(
        "n1",
        lambda: node.state,
        lambda i: node.services.get(i),  # type: ignore[arg-type,return-value]
        lambda peer: False,
        None,  # type: ignore[arg-type]  # nothing is remote here
        admission or Admission(),
    )
    return create_app(router, node, api_keys=api_keys)  # type: ignore[arg-type]


@pytest.fixture
async def fake() -> FakeService:
    return FakeService()


@pytest.fixture
async def client(fake: FakeService) -> AsyncIterator[Any]:
    async with app_for(fake).test_app() as test_app:
        yield test_app.test_client()


async def call(client: Any, method: str, path: str, body: object = None, **kw: Any) -> Any:
    if body is not None and "data" not in kw:
        kw["data"] = json.dumps(body)
        kw.setdefault("headers", {"content-type": "application/json"})
    with trio.fail_after(10):
        return await client.open(path, method=method, **kw)


async def error(response: Any, status: int) -> dict[str, Any]:
    assert response.status_code == status, await response.get_data()
    assert response.mimetype == "application/json"
    err: dict[str, Any] = json.loads(await response.get_data())["error"]
    assert set(err) == {"message", "type", "param", "code", "request_id"}
    assert err["request_id"] == response.headers["x-request-id"]  # every error names its request
    return err


# ---- bad input never reaches the service -----------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'"messages": [{"role": "user", "content": "\\udc00"}]', "messages[0].content"),
        (b'"messages": [{"role": "user", "content": "\xed\xa0\x80"}]', "messages[0].content"),
        (b'"messages": [{"role": "\\udc00", "content": "x"}]', "messages[0].role"),
        (b'"messages": [{"role": "user", "name": "\\ud800", "content": "x"}]', "messages[0].name"),
        (b'"stop": "\\udc00", "messages": [{"role": "user", "content": "x"}]', "stop"),
        (
            b'"metadata": {"k": "\\udfff"}, "messages": [{"role": "user", "content": "x"}]',
            "metadata.k",
        ),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_lone_surrogates_are_400s_that_never_reach_the_service(
    client: Any, fake: FakeService, raw: bytes, param: str, stream: bool
) -> None:
    body = b'{"model": "org/fake-model", "stream": %s, %s}' % (b"true" if stream else b"false", raw)
    response = await call(client, "POST", "/v1/chat/completions", data=body)
    err = await error(response, 400)
    assert (err["param"], err["code"], err["type"]) == (
        param,
        "invalid_unicode",
        "invalid_request_error",
    )
    assert fake.started == 0


async def test_the_fake_fails_like_the_runner_frame_on_a_surrogate() -> None:
    """What the edge check prevents: the frame encoder fails on a lone surrogate."""
    service = FakeService()
    with pytest.raises(Exception, match=r"surrogate|encod"):
        await anext(
            service.generate(ChatPrompt((ChatMessage("user", "\udc00"),)), SamplingParams())
        )


@pytest.mark.parametrize(
    ("raw", "param", "code"),
    [
        (
            PRE + b'"temperature": NaN}',
            "temperature",
            "invalid_value",
        ),
        (
            PRE + b'"top_p": -Infinity}',
            "top_p",
            "invalid_value",
        ),
        (
            PRE + b'"seed": 1e999}',
            "seed",
            "invalid_value",
        ),
        (
            PRE + b'"max_tokens": 1e2}',
            "max_tokens",
            "invalid_type",
        ),
        (b'{"model": "org/fake-model", "messages": %d}' % 2**70, "messages", "invalid_type"),
        (b"[" * 50_000, None, "invalid_json"),
        (b"1" * 5000, None, "invalid_json"),
        (b"\xff", None, "invalid_json"),
        (b"", None, "invalid_json"),
        (b"[]", None, "invalid_body"),
    ],
)
async def test_hostile_bodies_are_400s(
    client: Any, fake: FakeService, raw: bytes, param: str | None, code: str
) -> None:
    err = await error(await call(client, "POST", "/v1/chat/completions", data=raw), 400)
    assert (err["param"], err["code"]) == (param, code)
    assert fake.started == 0


async def test_huge_integers_are_range_errors(client: Any, fake: FakeService) -> None:
    for field in ("max_tokens", "seed", "top_k", "max_completion_tokens"):
        for value in (2**70, -(2**70)):
            body = {"model": MODEL, "messages": USER, field: value}
            err = await error(await call(client, "POST", "/v1/chat/completions", body), 400)
            assert err["param"] == field
    assert fake.started == 0


@pytest.mark.parametrize("content_type", ["multipart/form-data", "image/png", "application/xml"])
async def test_a_body_declared_as_not_json_is_415(client: Any, content_type: str) -> None:
    body = json.dumps({"model": MODEL, "messages": USER}).encode()
    response = await call(
        client, "POST", "/v1/chat/completions", data=body, headers={"content-type": content_type}
    )
    assert (await error(response, 415))["code"] == "unsupported_media_type"


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded"])
async def test_curl_default_content_types_are_read_as_json(
    client: Any, fake: FakeService, content_type: str
) -> None:
    body = json.dumps({"model": MODEL, "messages": USER}).encode()
    response = await call(
        client, "POST", "/v1/chat/completions", data=body, headers={"content-type": content_type}
    )
    assert response.status_code == 200, await response.get_data()


async def test_json_without_a_content_type_is_read(client: Any, fake: FakeService) -> None:
    body = json.dumps({"model": MODEL, "messages": USER}).encode()
    response = await call(client, "POST", "/v1/chat/completions", data=body, headers={})
    assert response.status_code == 200
    response = await call(
        client, "POST", "/v1/completions", data=b'{"model": "org/fake-model", "prompt": "x"}',
        headers={"content-type": "application/vnd.api+json; charset=utf-8"},
    )  # fmt: skip
    assert response.status_code == 200


# ---- errors before the first token are plain errors ------------------------------------------


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (RequestFailure("prompt_too_long", "too long"), 400, "prompt_too_long"),
        (RequestFailure("empty_prompt", "no tokens"), 400, "empty_prompt"),
        (RequestFailure("invalid_request", "temperature must be >= 0"), 400, "invalid_request"),
        (RequestFailure("runner_crashed", "gone"), 500, "runner_crashed"),
        (RequestFailure("runner_wedged", "stuck"), 504, "runner_wedged"),
        (ModelUnavailable(ModelStatus(MODEL, "restarting")), 503, "model_not_ready"),
    ],
)
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
async def test_stream_that_fails_before_its_first_token_is_a_plain_error(
    fake: FakeService, route: str, failure: Exception, status: int, code: str
) -> None:
    fake.script = [failure]
    body = {"model": MODEL, "stream": True, "max_tokens": 3}
    body |= {"messages": USER} if "chat" in route else {"prompt": "x"}
    async with app_for(fake).test_app() as test_app:
        response = await call(test_app.test_client(), "POST", route, body)
    err = await error(response, status)
    assert err["code"] == code
    if code in ("prompt_too_long", "empty_prompt"):
        assert err["param"] == ("messages" if "chat" in route else "prompt")
    assert fake.closed == fake.started == 1


async def test_failure_mid_stream_ends_with_an_error_event_then_done(fake: FakeService) -> None:
    fake.script = ["Hel", RequestFailure("runner_crashed", "gone")]
    body = {"model": MODEL, "messages": USER, "stream": True}
    async with app_for(fake).test_app() as test_app:
        response = await call(test_app.test_client(), "POST", "/v1/chat/completions", body)
    assert response.status_code == 200 and response.mimetype == "text/event-stream"
    events = [e for e in (await response.get_data()).decode().split("\n\n") if e]
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2].removeprefix("data: "))["error"]["code"] == "runner_crashed"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[1]["choices"][0]["delta"]["content"] == "Hel"
    assert fake.closed == 1


async def test_a_full_instance_answers_429_with_retry_after_and_serves_again_after(
    fake: FakeService,
) -> None:
    admission = Admission(max_in_flight=1)
    body = {"model": MODEL, "messages": USER}
    async with app_for(fake, admission).test_app() as test_app:
        client = test_app.test_client()
        with admission.admit("i1"):  # another request holds the only place
            for stream in (False, True):
                response = await call(client, "POST", "/v1/chat/completions",
                                      {**body, "stream": stream})  # fmt: skip
                err = await error(response, 429)
                assert err["code"] == "over_capacity"
                assert response.headers["Retry-After"] == "1"
        assert fake.started == 0  # refused before it reached the runner
        response = await call(client, "POST", "/v1/chat/completions", body)
        assert response.status_code == 200
        assert response.headers["x-skulk-instance"] == "i1"
        assert response.headers["x-skulk-node"] == "n1"
    assert admission.statistics().in_flight == {}  # every place given back


async def test_stream_starts_with_the_first_token(fake: FakeService) -> None:
    body = {"model": MODEL, "messages": USER, "stream": True}
    async with app_for(fake).test_app() as test_app:
        response = await call(test_app.test_client(), "POST", "/v1/chat/completions", body)
    events = [e for e in (await response.get_data()).decode().split("\n\n") if e]
    texts = [json.loads(e[6:])["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert texts == ["", "Hel", "lo", None] and events[-1] == "data: [DONE]"


async def test_a_stream_whose_body_is_never_sent_still_closes_its_generation(
    fake: FakeService,
) -> None:
    """The client goes away as the response starts: Quart never iterates the body, yet the
    generation (a runner request) is closed when the request ends."""
    fake.script = ["Hel", WAIT]
    await leave_as_the_response_starts(app_for(fake), {"model": MODEL, "messages": USER})
    assert fake.started == 1 and fake.closed == 1


async def leave_as_the_response_starts(app: Any, body: dict[str, object]) -> None:
    """Stream ``body`` from ``/v1/chat/completions`` in a plain ASGI call whose client goes
    away as the response starts (so Quart never iterates the body); returns when the request
    has ended."""
    raw = json.dumps({**body, "stream": True}).encode()
    scope = {
        "type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
        "query_string": b"", "root_path": "", "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2), "headers": [(b"content-type", b"application/json")],
        "extensions": {},
    }  # fmt: skip
    messages = [{"type": "http.request", "body": raw, "more_body": False}]
    gone = trio.Event()

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            gone.set()  # the client left: Quart's receiver cancels the sender
            await trio.sleep_forever()

    with trio.fail_after(10):
        await app(scope, receive, send)


# ---- models ----------------------------------------------------------------------------------


async def test_models_retrieve_with_a_slash_in_the_id(client: Any) -> None:
    response = await call(client, "GET", f"/v1/models/{MODEL}")
    assert response.status_code == 200
    card = json.loads(await response.get_data())
    assert card["id"] == MODEL and card["object"] == "model"
    for missing in ("nope", "org/nope", "org/fake-model/more"):
        err = await error(await call(client, "GET", f"/v1/models/{missing}"), 404)
        assert (err["code"], err["param"], err["type"]) == (
            "model_not_found", "model", "not_found_error"
        )  # fmt: skip


# ---- every error is the envelope -------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/v1//chat/completions", 404),
        ("GET", "//health", 404),
        ("GET", "/health/", 404),
        ("GET", "/v1/chat/completions", 405),
        ("DELETE", "/v1/models", 405),
        ("POST", "/nowhere", 404),
    ],
)
async def test_routing_errors_are_json_naming_the_path(
    client: Any, method: str, path: str, status: int
) -> None:
    err = await error(await call(client, method, path, {}), status)
    assert path in err["message"]


async def test_405_says_what_is_allowed(client: Any) -> None:
    response = await call(client, "GET", "/v1/chat/completions")
    await error(response, 405)
    assert "POST" in response.headers["allow"]


async def test_unexpected_errors_are_500_envelopes(fake: FakeService) -> None:
    fake.script = [ValueError("a bug")]
    async with app_for(fake).test_app() as test_app:
        response = await call(
            test_app.test_client(),
            "POST",
            "/v1/chat/completions",
            {"model": MODEL, "messages": USER},
        )
    assert (await error(response, 500))["code"] == "internal"


async def test_huge_names_are_not_echoed(client: Any) -> None:
    huge = "x" * 100_000
    for body in ({"model": huge, "messages": USER}, {"model": MODEL, "messages": USER, huge: 1}):
        response = await call(client, "POST", "/v1/chat/completions", body)
        assert response.status_code in (400, 404)
        assert len(await response.get_data()) < 1000


# ---- the WebSocket ---------------------------------------------------------------------------


async def test_websocket_requests_fail_only_themselves(fake: FakeService) -> None:
    fake.by_text = {
        "long": [RequestFailure("prompt_too_long", "too long")],
        "bug": ["a", ValueError("a bug")],
    }

    def ask(rid: str, content: str) -> str:
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}]}
        return json.dumps({"id": rid, "type": "chat.completions", "body": body})

    async with (
        app_for(fake).test_app() as test_app,
        test_app.test_client().websocket("/v1/ws") as ws,
    ):
        with trio.fail_after(10):
            for rid, content in [("long", "long"), ("bug", "bug"), ("bad", "\udc00"), ("ok", "hi")]:
                await ws.send(ask(rid, content))
            await ws.send(json.dumps({"id": "\ud800", "type": "cancel"}))
            seen: dict[str | None, list[dict[str, Any]]] = {}
            while sum(m["type"] != "chunk" for ms in seen.values() for m in ms) < 5:
                message = json.loads(await ws.receive())
                seen.setdefault(message["id"], []).append(message)
    # Failing before the first token: the error is the request's only message.
    [long] = seen["long"]
    assert long["type"] == "error" and long["error"]["code"] == "prompt_too_long"
    assert [m["type"] for m in seen["bug"]][-1] == "error"
    assert seen["bug"][-1]["error"]["code"] == "internal"
    [bad] = seen["bad"]
    assert bad["error"]["param"] == "messages[0].content"
    assert bad["error"]["code"] == "invalid_unicode"
    [anonymous] = seen[None]
    assert anonymous["error"]["param"] == "id"
    assert seen["ok"][-1] == {"id": "ok", "type": "done"}
    assert fake.started == fake.closed == 3  # long, bug, ok; bad never reached the service


@pytest.mark.parametrize(
    ("path", "status"), [("/nowhere", 404), ("/health", 400), ("/v1//ws", 404)]
)
async def test_websocket_to_a_wrong_route_is_refused_with_the_envelope(
    client: Any, path: str, status: int
) -> None:
    with pytest.RaisesGroup(Exception, allow_unwrapped=True, flatten_subgroups=True) as info:
        async with client.websocket(path) as ws:
            await ws.send("{}")
            await ws.receive()
    refusal = info.value.exceptions[0] if isinstance(info.value, BaseExceptionGroup) else info.value
    assert refusal.response.status_code == status
    assert json.loads(await refusal.response.get_data())["error"]["message"]
