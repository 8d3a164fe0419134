"""Hostile and odd requests against a real server: each one fails only itself.

A request may get any 4xx (in the JSON error envelope), never a 500, an HTML page, a redirect or
a hang; and whatever it sends, the runner keeps its pid, the model stays ready and the next
request on the same connection is answered.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import h11
import httpx
import openai
import psutil
import pytest
import trio
from trio_websocket import open_websocket_url

from skulk.harness import NodeProcess

MODEL = "skulk-demo"
JSON = {"content-type": "application/json"}
#: Far more tokens than the demo model's 2048-token context.
LONG_PROMPT = " ".join(f"word{i}" for i in range(6000))


class RawConnection:
    """One keep-alive HTTP/1.1 connection driven byte by byte (h11 parses; every read has a
    deadline, so a server that never answers fails the test instead of hanging it)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        assert parts.hostname is not None and parts.port is not None
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
        self.h11 = h11.Connection(h11.CLIENT)

    def close(self) -> None:
        self.sock.close()

    def send(self, *events: h11.Event) -> None:
        for event in events:
            data = self.h11.send(event)
            if data:
                self.sock.sendall(data)

    def head(self, method: str, path: str, body_len: int | None = None, **headers: str) -> None:
        fields = [("Host", "skulk"), *headers.items()]
        if body_len is not None:
            fields.append(("Content-Length", str(body_len)))
        self.send(h11.Request(method=method, target=path, headers=fields))

    def request(self, method: str, path: str, body: bytes = b"", **headers: str) -> None:
        self.head(method, path, len(body) if body or method != "GET" else None, **headers)
        if body:
            self.send(h11.Data(data=body))
        self.send(h11.EndOfMessage())

    def response(self, deadline: float = 10.0) -> tuple[int, dict[str, str], bytes]:
        """The next whole response: (status, headers, body)."""
        end = time.monotonic() + deadline
        status, headers, body = 0, {}, b""
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no whole response within {deadline}s")
                self.sock.settimeout(left)
                try:
                    data = self.sock.recv(65536)
                except TimeoutError:
                    raise AssertionError(f"no whole response within {deadline}s") from None
                self.h11.receive_data(data)
            elif isinstance(event, h11.Response):
                status = event.status_code
                headers = {k.decode().lower(): v.decode() for k, v in event.headers}
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                return status, headers, body
            elif isinstance(event, h11.ConnectionClosed):
                raise AssertionError("the server closed the connection without a response")

    def next_cycle(self) -> None:
        self.h11.start_next_cycle()


@pytest.fixture
def raw(server: NodeProcess) -> Iterator[RawConnection]:
    conn = RawConnection(server.url)
    yield conn
    conn.close()


def untouched(server: NodeProcess, pid: int) -> None:
    """The runner that served before still serves, and the model is ready."""
    assert server.runner()["pid"] == pid
    assert server.get("/health").json()["status"] == "ok"
    assert server.diagnostics()["model"]["restarts"] == 0


def error_of(r: httpx.Response, status: int) -> dict[str, object]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.headers
    err: dict[str, object] = r.json()["error"]
    assert err["message"]
    return err


# ---- 1. lone surrogates ----------------------------------------------------------------------

CHAT_PREFIX = b'{"model": "skulk-demo", "max_tokens": 2, '
SURROGATE_BODIES = [
    (b'"messages": [{"role": "user", "content": "a\\udc00b"}]}', "messages[0].content"),
    (b'"messages": [{"role": "user", "content": "a\xed\xa0\x80b"}]}', "messages[0].content"),
    (b'"messages": [{"role": "user\\ud800", "content": "x"}]}', "messages[0].role"),
    (b'"messages": [{"role": "user", "name": "\\udfff", "content": "x"}]}', "messages[0].name"),
    (
        b'"messages": [{"role": "user", "content": [{"type": "text", "text": "\\ud83d"}]}]}',
        "messages[0].content[0].text",
    ),
    (b'"stop": ["ok", "\\udc00"], "messages": [{"role": "user", "content": "x"}]}', "stop[1]"),
    (b'"user": "\\udc00", "messages": [{"role": "user", "content": "x"}]}', "user"),
]


@pytest.mark.parametrize(("tail", "param"), SURROGATE_BODIES)
@pytest.mark.parametrize("stream", [False, True])
def test_lone_surrogate_is_a_400_naming_the_field(
    server: NodeProcess, tail: bytes, param: str, stream: bool
) -> None:
    pid = server.runner()["pid"]
    body = CHAT_PREFIX + (b'"stream": true, ' if stream else b"") + tail
    err = error_of(server.post("/v1/chat/completions", content=body, headers=JSON), 400)
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param
    assert err["code"] == "invalid_unicode"
    untouched(server, pid)


def test_lone_surrogate_in_model_and_prompt(server: NodeProcess) -> None:
    pid = server.runner()["pid"]
    for body, param in [
        (b'{"model": "skulk-demo\\udc00", "prompt": "x"}', "model"),
        (b'{"model": "skulk-demo", "prompt": "x\\udc00", "max_tokens": 2}', "prompt"),
        (b'{"model": "skulk-demo", "prompt": ["\xed\xa0\x80"], "max_tokens": 2}', "prompt[0]"),
    ]:
        err = error_of(server.post("/v1/completions", content=body, headers=JSON), 400)
        assert err["param"] == param, body
    untouched(server, pid)


def test_invalid_utf8_is_invalid_json(server: NodeProcess) -> None:
    body = b'{"model": "skulk-demo", "messages": [{"role": "user", "content": "\xff\xfe"}]}'
    err = error_of(server.post("/v1/chat/completions", content=body, headers=JSON), 400)
    assert err["code"] == "invalid_json"


async def test_websocket_surrogate_fails_only_that_request(server: NodeProcess) -> None:
    pid = await trio.to_thread.run_sync(lambda: server.runner()["pid"])
    ws_url = server.url.replace("http://", "ws://") + "/v1/ws"
    good = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    bad = {**good, "messages": [{"role": "user", "content": "a\udc00"}]}
    with trio.fail_after(30):
        async with open_websocket_url(ws_url) as ws:
            # json.dumps writes the surrogate as the escape "\udc00" (ASCII-only output).
            await ws.send_message(
                json.dumps({"id": "bad", "type": "chat.completions", "body": bad})
            )
            msg = json.loads(await ws.get_message())
            assert msg["id"] == "bad" and msg["type"] == "error", msg
            assert msg["error"]["param"] == "messages[0].content"
            await ws.send_message(json.dumps({"id": "x\udc00", "type": "cancel"}))
            msg = json.loads(await ws.get_message())
            assert msg["id"] is None and msg["error"]["param"] == "id", msg
            # The socket still serves.
            await ws.send_message(
                json.dumps({"id": "ok", "type": "chat.completions", "body": good})
            )
            while (msg := json.loads(await ws.get_message()))["type"] == "chunk":
                assert msg["id"] == "ok"
            assert msg == {"id": "ok", "type": "done"}
    await trio.to_thread.run_sync(untouched, server, pid)


# ---- 2. answering before the body arrived ----------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [
        ("POST", "/v1/messages", 400),  # the anthropic client's route: no messages, no max_tokens
        ("POST", "/v1/responses", 400),  # no input
        ("POST", "/api/embed", 400),  # the ollama client's embeddings route: no model, no input
        ("POST", "/api/pull", 400),  # Ollama's pull: skulk-demo is no Hub id
        ("POST", "/api/generate", 200),  # no prompt: Ollama's "load the model", answered at once
        ("POST", "/health", 405),
        ("GET", "/v1/models", 200),  # a route that never reads a body
        ("POST", "/v1/chat/completions", 400),
    ],
)
def test_answer_before_the_body_keeps_the_connection(
    raw: RawConnection, method: str, path: str, status: int
) -> None:
    body = b'{"model": "skulk-demo"}'
    raw.head(method, path, len(body), **JSON)
    time.sleep(0.05)  # the scenario itself: the body follows the headers late
    raw.send(h11.Data(data=body), h11.EndOfMessage())
    assert raw.response()[0] == status
    raw.next_cycle()
    raw.request("GET", "/health")
    assert raw.response(deadline=5)[0] == 200


def test_oversized_body_is_413_in_the_envelope(raw: RawConnection) -> None:
    # Declared far beyond what the server reads: answered at once, and the connection closes.
    raw.head("POST", "/v1/chat/completions", 1 << 40, **JSON)
    status, headers, body = raw.response()
    assert status == 413
    assert headers.get("connection") == "close"
    assert json.loads(body)["error"]["code"] == "request_entity_too_large"


def test_oversized_body_that_arrives_keeps_the_connection(server: NodeProcess) -> None:
    r = server.post("/v1/chat/completions", content=b"x" * (9 << 20), headers=JSON)
    assert error_of(r, 413)["code"] == "request_entity_too_large"
    with httpx.Client(base_url=server.url, timeout=30) as client:
        assert client.post("/v1/completions", content=b"[" * (9 << 20)).status_code == 413
        assert client.get("/health").status_code == 200


# ---- 3. errors known before the first token --------------------------------------------------


def test_stream_error_before_the_first_token_is_a_plain_error(server: NodeProcess) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": LONG_PROMPT}], "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        r.read()
    err = error_of(r, 400)
    assert err["code"] == "prompt_too_long" and err["param"] == "messages"
    with pytest.raises(openai.BadRequestError):
        client(server).completions.create(model=MODEL, prompt=LONG_PROMPT, stream=True)


async def test_websocket_error_before_the_first_token_is_only_an_error(
    server: NodeProcess,
) -> None:
    ws_url = server.url.replace("http://", "ws://") + "/v1/ws"
    body = {"model": MODEL, "messages": [{"role": "user", "content": LONG_PROMPT}]}
    with trio.fail_after(30):
        async with open_websocket_url(ws_url) as ws:
            await ws.send_message(json.dumps({"id": "l", "type": "chat.completions", "body": body}))
            msg = json.loads(await ws.get_message())
    assert msg["type"] == "error" and msg["error"]["code"] == "prompt_too_long", msg


# ---- 4. GET /v1/models/{id} ------------------------------------------------------------------


def client(server: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_models_retrieve(server: NodeProcess) -> None:
    card = client(server).models.retrieve(MODEL)
    assert card.id == MODEL and card.object == "model"
    for missing in ("nope", "org/nope", "org/deeper/nope"):
        with pytest.raises(openai.NotFoundError) as info:
            client(server).models.retrieve(missing)
        assert info.value.code == "model_not_found"


# ---- 5. no redirects, no HTML ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/v1//chat/completions"),
        ("GET", "//health"),
        ("GET", "/health/"),
        ("GET", "/v1/models/"),
        ("GET", "/v1/models//skulk-demo"),
        ("GET", "/v1/chat/completions"),
        ("PUT", "/health"),
        ("DELETE", "/v1/models"),
        ("PATCH", "/v1/completions"),
        ("POST", "/v1/models"),
        ("GET", "/v1/ws"),  # not an upgrade
        ("GET", "/%ff%fe"),
        ("GET", "/v1/models/..%2f..%2fhealth"),
        ("BREW", "/health"),
    ],
)
def test_odd_paths_and_methods_get_a_json_error(raw: RawConnection, method: str, path: str) -> None:
    raw.request(method, path, b"{}" if method in ("POST", "PUT", "PATCH") else b"", **JSON)
    status, headers, body = raw.response()
    assert 400 <= status < 500, (status, body)
    assert headers["content-type"].startswith("application/json"), (headers, body)
    assert b"<" not in body
    err = json.loads(body)["error"]
    assert err["message"] and err["type"] in ("not_found_error", "invalid_request_error")
    if status == 404 and "%" not in path:
        assert path in err["message"]


# ---- 6. the access log -----------------------------------------------------------------------


def half_closed_request(server: NodeProcess, path: str, agent: str) -> None:
    """Send a request and half-close at once (as some clients do): Hypercorn sees the end of
    the connection while the app is still answering."""
    conn = RawConnection(server.url)
    try:
        conn.request("GET", path, **{"User-Agent": agent})
        conn.sock.shutdown(socket.SHUT_WR)
        conn.sock.settimeout(10)
        while conn.sock.recv(65536):
            pass
    finally:
        conn.close()


def test_each_request_is_logged_once_with_its_status(server: NodeProcess) -> None:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    calls = {
        "health": ("200", lambda ua: server.get("/health", headers=ua)),
        "missing": ("404", lambda ua: server.get("/nothing", headers=ua)),
        "chat": ("200", lambda ua: server.post("/v1/chat/completions", json=chat, headers=ua)),
        "stream": (
            "200",
            lambda ua: server.post(
                "/v1/chat/completions", json={**chat, "stream": True}, headers=ua
            ),
        ),
        # Whether the answer went out before the close was seen varies: any one status.
        "half-closed": ("", lambda ua: half_closed_request(server, "/health", ua["user-agent"])),
    }
    # Hypercorn's second line came from a race (the client's close against the end of the
    # response): repeat the cheap requests often enough to have lost it for certain before.
    expected: dict[str, str] = {}
    for i in range(12):
        for name, (status, call) in calls.items():
            if i < 3 or name in ("health", "missing"):
                agent = f"probe-{name}-{i}"
                call({"user-agent": agent})
                expected[agent] = status

    def logged() -> dict[str, list[str]]:
        lines = [line for line in server.output if "skulk.access" in line]
        return {a: [line for line in lines if f'"{a}"' in line] for a in expected}

    server.wait_for(lambda: all(logged().values()), 10, "every request logged")
    time.sleep(0.2)  # a second line for a request would follow the first at once
    for agent, lines in logged().items():
        assert len(lines) == 1, lines
        if expected[agent]:
            assert f" {expected[agent]} " in lines[0], lines[0]


def test_a_client_that_half_closes_after_its_answer_sees_the_connection_end(
    server: NodeProcess,
) -> None:
    """Hypercorn kept such a connection for the whole keep-alive timeout (75 s): the client's
    EOF came after the response had ended, while the server waited for a next request."""
    conn = RawConnection(server.url)
    try:
        conn.request("GET", "/health", **{"User-Agent": "half-close-after"})
        status, _, _ = conn.response()
        assert status in (200, 503)
        conn.sock.shutdown(socket.SHUT_WR)
        conn.sock.settimeout(30)  # far under the keep-alive timeout, far over a close
        assert conn.sock.recv(65536) == b"", "the server answered again"
    finally:
        conn.close()


def test_one_shot_clients_leave_no_socket_behind(server: NodeProcess) -> None:
    """A client that closes its connection after one answer (curl, ``httpx.post``) must not
    leave the node holding the socket in ``CLOSE_WAIT`` for the keep-alive timeout: at a few
    hundred a second that was every file descriptor the node may open."""
    assert server.proc is not None
    node = psutil.Process(server.proc.pid)
    port = urlsplit(server.url).port

    def lingering() -> list[object]:
        return [
            c
            for c in node.net_connections(kind="tcp")
            if c.laddr and c.laddr.port == port and c.status == psutil.CONN_CLOSE_WAIT
        ]

    for _ in range(100):
        assert httpx.get(server.url + "/health", timeout=30).status_code in (200, 503)
    server.wait_for(lambda: not lingering(), 20, "no CLOSE_WAIT socket")  # keep-alive: 75 s


# ---- 7. adversarial values -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw_fields", "param"),
    [
        (b'"temperature": NaN', "temperature"),
        (b'"top_p": Infinity', "top_p"),
        (b'"temperature": -Infinity', "temperature"),
        (b'"max_tokens": 1e400', "max_tokens"),
        (b'"seed": 1e400', "seed"),
        (b'"max_tokens": 1180591620717411303424', "max_tokens"),
        (b'"seed": 1180591620717411303424', "seed"),
        (b'"top_k": -1180591620717411303424', "top_k"),
        (b'"stream": "yes"', "stream"),
        (b'"messages": {"role": "user"}', "messages"),
        (b'"metadata": {"a": NaN}', "metadata.a"),
    ],
)
def test_adversarial_values_are_400s(server: NodeProcess, raw_fields: bytes, param: str) -> None:
    pid = server.runner()["pid"]
    messages = (
        b""
        if raw_fields.startswith(b'"messages"')
        else b'"messages": [{"role": "user", "content": "x"}], '
    )
    body = b'{"model": "skulk-demo", ' + messages + raw_fields + b"}"
    assert (
        error_of(server.post("/v1/chat/completions", content=body, headers=JSON), 400)["param"]
        == param
    )
    untouched(server, pid)


@pytest.mark.parametrize(
    ("content", "headers", "status", "code"),
    [
        (b"", JSON, 400, "invalid_json"),
        (b"[" * 100_000, JSON, 400, "invalid_json"),
        (b'{"a": ' * 5000 + b"1" + b"}" * 5000, JSON, 400, "invalid_json"),
        (b"9" * 5000, JSON, 400, "invalid_json"),  # more digits than Python parses
        (b"null", JSON, 400, "invalid_body"),
        (
            b"--x\r\n",
            {"content-type": "multipart/form-data; boundary=x"},
            415,
            "unsupported_media_type",
        ),
        # What ``curl -d`` sends by default is read as JSON, and this is not JSON.
        (
            b"model=skulk-demo",
            {"content-type": "application/x-www-form-urlencoded"},
            400,
            "invalid_json",
        ),
    ],
)
def test_bad_bodies_are_4xx(
    server: NodeProcess, content: bytes, headers: dict[str, str], status: int, code: str
) -> None:
    for route in ("/v1/chat/completions", "/v1/completions"):
        assert (
            error_of(server.post(route, content=content, headers=headers), status)["code"] == code
        )


def test_huge_values_are_not_echoed(server: NodeProcess) -> None:
    huge = "m" * (1 << 20)
    r = server.post(
        "/v1/chat/completions", json={"model": huge, "messages": [{"role": "user", "content": "x"}]}
    )
    assert error_of(r, 404)["code"] == "model_not_found"
    assert len(r.content) < 4096
    r = server.post("/v1/chat/completions", json={"model": MODEL, huge: 1, "messages": []})
    assert error_of(r, 400)["code"] == "unknown_parameter"
    assert len(r.content) < 4096


def test_extreme_but_valid_sampling_values_reach_the_runner_safely(server: NodeProcess) -> None:
    pid = server.runner()["pid"]
    base = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for fields in [
        {"temperature": 5e-324},
        {"temperature": 1e-300, "top_p": 5e-324},
        {"top_k": 2**63 - 1, "seed": -(2**63)},
        {"seed": 2**63 - 1, "top_k": 1},
        {"max_tokens": 2**63 - 1, "stop": ["\x00"]},
    ]:
        body = {**base, **fields}
        if fields.get("max_tokens"):
            body["stop"] = [" ", "e", "a", "o"]  # ends soon whatever the model says
        r = server.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, (fields, r.text)
    untouched(server, pid)
