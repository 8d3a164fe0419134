"""The API edge's pieces on their own: RequestGuard (ASGI, with fake receive/send) and the JSON
body checks (sans-IO, with properties: whatever a client sends is a 400 or fit for a frame)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

import cbor2
import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from skulk.api._guard import RequestGuard, close_with_request
from skulk.api._json_body import check_json_value, parse_json_body
from skulk.api._openai import ApiError, parse_chat_completions
from skulk.engine.protocol import TO_RUNNER
from skulk.wire.runner import Generate

MAX = 100


def scope(headers: Sequence[tuple[bytes, bytes]] = ()) -> dict[str, Any]:
    return {
        "type": "http", "http_version": "1.1", "method": "POST", "scheme": "http",
        "path": "/p", "raw_path": b"/p", "query_string": b"q=1", "root_path": "",
        "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 6), "extensions": {},
        "headers": [(b"user-agent", b"ua/1"), *headers],
    }  # fmt: skip


class Peer:
    """Hypercorn's side of one request: body chunks to hand out, messages sent back."""

    def __init__(self, *chunks: bytes, then_wait: bool = False) -> None:
        self.chunks = list(chunks)
        self.then_wait = then_wait
        self.sent: list[dict[str, Any]] = []
        self.gone = trio.Event()

    async def receive(self) -> dict[str, Any]:
        if self.chunks:
            chunk = self.chunks.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}
        if self.then_wait:
            await trio.sleep_forever()
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict[str, Any]) -> None:
        await trio.lowlevel.checkpoint()  # a real send blocks: a cancelled caller stops here
        self.sent.append(message)

    @property
    def status(self) -> int:
        return int(next(m["status"] for m in self.sent if m["type"] == "http.response.start"))

    @property
    def headers(self) -> dict[bytes, bytes]:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return dict(start["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


class App:
    """A tiny ASGI app that records what it received and answers 200 ``ok``."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        message = await receive()
        self.bodies.append(message["body"])
        assert message["more_body"] is False
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok", "more_body": False})


def guard(app: Any, **kw: Any) -> RequestGuard:
    kw.setdefault("max_body", MAX)
    kw.setdefault("body_timeout", 5.0)
    return RequestGuard(app, access_log=logging.getLogger("test.access"), **kw)


def access_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "test.access"]


# ---- the body first --------------------------------------------------------------------------


async def test_the_app_gets_the_whole_body_at_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    app, peer = App(), Peer(b"ab", b"", b"cd")
    await guard(app)(scope(), peer.receive, peer.send)  # type: ignore[arg-type]
    assert app.bodies == [b"abcd"]
    assert peer.status == 200 and peer.body == b"ok"
    [line] = access_lines(caplog)
    assert line.startswith('127.0.0.1:5 "POST /p?q=1 HTTP/1.1" 200 - ')
    assert line.endswith('"ua/1"')


async def test_a_declared_oversized_body_is_refused_unread_and_closes() -> None:
    app, peer = App(), Peer(then_wait=True)
    big = [(b"content-length", b"%d" % (10 * MAX))]
    await guard(app, drain_limit=2 * MAX)(scope(big), peer.receive, peer.send)  # type: ignore[arg-type]
    assert app.bodies == []
    assert peer.status == 413 and peer.headers[b"connection"] == b"close"
    assert json.loads(peer.body)["error"]["code"] == "request_entity_too_large"


async def test_a_body_over_the_limit_is_drained_and_refused_keeping_the_connection() -> None:
    app, peer = App(), Peer(b"x" * 60, b"x" * 60)
    await guard(app)(scope(), peer.receive, peer.send)  # type: ignore[arg-type]
    assert app.bodies == []
    assert peer.status == 413 and b"connection" not in peer.headers


async def test_a_body_over_the_drain_limit_is_refused_at_once_and_closes() -> None:
    app, peer = App(), Peer(b"x" * 150, b"x" * 150, then_wait=True)
    await guard(app, drain_limit=2 * MAX)(scope(), peer.receive, peer.send)  # type: ignore[arg-type]
    assert peer.status == 413 and peer.headers[b"connection"] == b"close"
    assert app.bodies == []


async def test_a_body_that_never_arrives_is_408(autojump_clock: trio.testing.MockClock) -> None:
    app, peer = App(), Peer()
    first = [{"type": "http.request", "body": b"x", "more_body": True}]

    async def receive() -> dict[str, Any]:  # one chunk, then silence
        if first:
            return first.pop()
        await trio.sleep_forever()
        raise AssertionError

    start = trio.current_time()
    await guard(app, body_timeout=30.0)(scope(), receive, peer.send)  # type: ignore[arg-type]
    assert trio.current_time() - start == pytest.approx(30.0)
    assert peer.status == 408 and peer.headers[b"connection"] == b"close"
    assert json.loads(peer.body)["error"]["code"] == "request_timeout"
    assert app.bodies == []


async def test_a_client_gone_before_its_body_is_logged_once_without_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    app, peer = App(), Peer()
    peer.gone.set()
    await guard(app)(scope(), peer.receive, peer.send)  # type: ignore[arg-type]
    assert app.bodies == [] and peer.sent == []
    [line] = access_lines(caplog)
    assert '"POST /p?q=1 HTTP/1.1" - - ' in line


# ---- the end of a response -------------------------------------------------------------------


async def test_the_last_send_is_shielded_from_the_apps_cancellation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """quart-trio cancels the task that sends the last message once Hypercorn reports the
    stream closed, in the middle of Hypercorn's own end-of-response work."""
    caplog.set_level(logging.INFO)
    peer = Peer(b"")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 201, "headers": []})
        with trio.CancelScope() as cancelled:
            cancelled.cancel()
            await send({"type": "http.response.body", "body": b"done", "more_body": False})

    await guard(app)(scope(), peer.receive, peer.send)  # type: ignore[arg-type]
    assert peer.body == b"done"
    [line] = access_lines(caplog)
    assert " 201 " in line and "incomplete" not in line


async def test_a_cut_response_is_logged_once_as_incomplete(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO)
    peer = Peer(b"")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"part", "more_body": True})

    await guard(app)(scope(), peer.receive, peer.send)  # type: ignore[arg-type]
    [line] = access_lines(caplog)
    assert " 200 " in line and line.endswith(" incomplete")


# ---- what a request owns ---------------------------------------------------------------------


class Resource:
    def __init__(self) -> None:
        self.closes = 0

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()  # runs even in a cancelled request (shielded)
        self.closes += 1


@pytest.mark.parametrize("ending", ["returns", "raises", "cancelled"])
async def test_what_a_request_owns_is_closed_however_it_ends(ending: str) -> None:
    resource, peer = Resource(), Peer(b"")

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()

        async def handler() -> None:  # Quart runs handlers in a child task
            close_with_request(resource.aclose)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(handler)
        if ending == "raises":
            raise ValueError("a bug")
        if ending == "cancelled":
            await trio.sleep_forever()

    with trio.move_on_after(1 if ending == "cancelled" else 10):
        if ending == "raises":
            with pytest.raises(ValueError, match="a bug"):
                await guard(app)(scope(), peer.receive, peer.send)  # type: ignore[arg-type]
        else:
            await guard(app)(scope(), peer.receive, peer.send)  # type: ignore[arg-type]
    assert resource.closes == 1


async def test_close_with_request_outside_a_request_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="RequestGuard"):
        close_with_request(Resource().aclose)


# ---- JSON bodies (sans-IO) -------------------------------------------------------------------


def refused(raw: bytes | str) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_json_body(raw)
    assert info.value.status == 400
    return info.value


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"a": "\\udc00"}', "a"),
        (b'{"a": "\xed\xa0\x80"}', "a"),  # decoded with surrogatepass by json.loads
        (b'{"a": "\\ud83d\\ude00", "b": ["ok", "\\ud83d"]}', "b[1]"),  # a pair is fine
        (b'{"a": {"b": [{"c": "\\udfff"}]}}', "a.b[0].c"),
        (b'[1, "\\udc00"]', "[1]"),
        (b'"\\udc00"', None),
        (b'{"a": {"k\\udc00": 1}}', "a"),
        (b'{"k\\udc00": 1}', None),
    ],
)
def test_lone_surrogates_are_named(raw: bytes, param: str | None) -> None:
    err = refused(raw)
    assert (err.param, err.code, err.type) == (param, "invalid_unicode", "invalid_request_error")


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b'{"t": NaN}', "t"),
        (b'{"t": Infinity}', "t"),
        (b'{"t": [-Infinity]}', "t[0]"),
        (b'{"t": 1e400}', "t"),
        (b'{"t": -1e400}', "t"),
    ],
)
def test_non_finite_numbers_are_named(raw: bytes, param: str) -> None:
    err = refused(raw)
    assert (err.param, err.code) == (param, "invalid_value")


def test_the_first_bad_field_in_document_order_is_named() -> None:
    assert refused(b'{"a": ["ok", NaN], "b": "\\udc00"}').param == "a[1]"
    assert refused(b'{"b": "\\udc00", "a": NaN}').param == "b"


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"\xff", b"[" * 100_000, b"9" * 5000, b'{"a": 1} x', b"\x00\x00\x00["],
)
def test_not_json_is_invalid_json(raw: bytes) -> None:
    err = refused(raw)
    assert err.code == "invalid_json" and len(err.message) < 300


def test_the_deepest_parsable_value_is_checked_without_recursion() -> None:
    depth = 900  # about what json.loads allows under the default recursion limit
    raw = "[" * depth + '"\\udc00"' + "]" * depth
    assert refused(raw).param == "[0]" * depth
    value = json.loads("[" * depth + "1.5" + "]" * depth)
    check_json_value(value)  # fine values pass


def test_valid_bodies_come_back_as_parsed() -> None:
    raw = '{"m": "é😀", "n": [1, 2.5, null, true], "o": {}}'
    assert parse_json_body(raw.encode()) == json.loads(raw)
    check_json_value({"x": "ok"}, "body")
    with pytest.raises(ApiError) as info:
        check_json_value({"x": float("nan")}, "body")
    assert info.value.param == "body.x"


# Any text, lone surrogates included (hypothesis leaves out category Cs unless asked).
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=8)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(ANY_TEXT, inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(JSON_VALUES)
def test_any_json_value_is_a_400_or_fit_for_a_frame(value: object) -> None:
    """Never a 500: whatever parses is encodable as CBOR (what a runner frame needs)."""
    try:
        parsed = parse_json_body(json.dumps(value))
    except ApiError as exc:
        assert exc.status == 400
        return
    cbor2.dumps(parsed)


@settings(max_examples=300, deadline=None)
@given(content=ANY_TEXT, name=ANY_TEXT, stop=st.lists(ANY_TEXT, max_size=4), model=ANY_TEXT)
def test_any_chat_body_is_a_400_or_a_frame_the_runner_can_take(
    content: str, name: str, stop: list[str], model: str
) -> None:
    body = {
        "model": model or "m",
        "stop": stop,
        "messages": [{"role": "user", "name": name, "content": content}],
    }
    try:
        request = parse_chat_completions(parse_json_body(json.dumps(body)))
    except ApiError as exc:
        assert exc.status == 400
        return
    TO_RUNNER.encode(Generate(request_id="r", prompt=request.prompt, params=request.params))
