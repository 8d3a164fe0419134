"""API keys: the check (constant-time, every key, both headers), the app in process (every
route but /health, 401 in each format's envelope, the WebSocket handshake), the configuration
(flag, variable, file), the start-up warning and the CLI passing the key."""

from __future__ import annotations

import argparse
import hmac
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from quart_trio import QuartTrio

from skulk.api._auth import ApiKeys, exposure_warning, is_loopback, presented_keys
from skulk.api._errors import ApiError
from skulk.config import add_serve_arguments, serve_config
from tests.unit.test_api_edge import MODEL, USER, FakeService, app_for, call
from tests.unit.test_cli_client import FakeApi, envelope

KEYS = ("key-one-0123456789", "key-two-abcdefghij")
CHAT = {"model": MODEL, "messages": USER}


# ---- the check -------------------------------------------------------------------------------


def test_any_configured_key_matches_and_nothing_else() -> None:
    keys = ApiKeys(KEYS)
    assert keys.matches(KEYS[0]) and keys.matches(KEYS[1])
    for wrong in ("", "key-one", KEYS[0] + "x", KEYS[0].upper(), "é"):
        assert not keys.matches(wrong)
    with pytest.raises(ValueError):
        ApiKeys([])


def test_every_key_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def compare(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr("skulk.api._auth.hmac.compare_digest", compare)
    keys = ApiKeys(KEYS)
    assert keys.matches(KEYS[0])  # the first key matches: the second is compared all the same
    assert [b for _, b in calls] == [k.encode() for k in KEYS]
    calls.clear()
    assert not keys.matches("wrong")
    assert len(calls) == len(KEYS)


def test_the_presented_keys_are_the_bearer_token_and_x_api_key() -> None:
    assert presented_keys("Bearer abc", None) == ["abc"]
    assert presented_keys("bearer  abc ", "def") == ["abc", "def"]
    assert presented_keys("Basic dXNlcjpwdw==", None) == []
    assert presented_keys("Bearer", "") == []
    assert presented_keys(None, None) == []


@pytest.mark.parametrize(
    ("authorization", "x_api_key", "ok"),
    [
        (f"Bearer {KEYS[1]}", None, True),
        (None, KEYS[0], True),
        ("Bearer wrong", KEYS[0], True),  # either header alone would be let in
        ("Bearer wrong", None, False),
        (None, "wrong", False),
        (KEYS[0], None, False),  # not a bearer token
        (None, None, False),
    ],
)
def test_check_raises_401_with_the_challenge(
    authorization: str | None, x_api_key: str | None, ok: bool
) -> None:
    keys = ApiKeys(KEYS)
    if ok:
        keys.check(authorization, x_api_key)
        return
    with pytest.raises(ApiError) as info:
        keys.check(authorization, x_api_key)
    assert info.value.status == 401 and info.value.code == "invalid_api_key"
    assert info.value.headers == {"WWW-Authenticate": 'Bearer realm="skulk"'}


# ---- the app ---------------------------------------------------------------------------------


def keyed_app(service: FakeService, keys: tuple[str, ...] = KEYS) -> QuartTrio:
    return app_for(service, api_keys=keys)


@pytest.fixture
async def fake() -> FakeService:
    return FakeService()


@pytest.fixture
async def client(fake: FakeService) -> AsyncIterator[Any]:
    async with keyed_app(fake).test_app() as test_app:
        yield test_app.test_client()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", "content-type": "application/json"}


async def test_the_right_key_in_either_header_is_served(client: Any, fake: FakeService) -> None:
    for headers in (bearer(KEYS[0]), bearer(KEYS[1]), {"x-api-key": KEYS[0]}):
        response = await call(client, "POST", "/v1/chat/completions", CHAT, headers=headers)
        assert response.status_code == 200, await response.get_data()
    assert fake.started == 3


@pytest.mark.parametrize(
    "headers", [{}, bearer("wrong"), {"x-api-key": "wrong"}, {"authorization": KEYS[0]}]
)
async def test_a_missing_or_wrong_key_is_401_in_openais_envelope(
    client: Any, fake: FakeService, headers: dict[str, str]
) -> None:
    response = await call(client, "POST", "/v1/chat/completions", CHAT, headers=headers)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Bearer realm="skulk"'
    error = json.loads(await response.get_data())["error"]
    assert (error["type"], error["code"]) == ("authentication_error", "invalid_api_key")
    assert fake.started == 0


async def test_401_speaks_the_format_of_its_path(client: Any) -> None:
    anthropic = await call(client, "POST", "/v1/messages", {"x": 1}, headers={"x-api-key": "no"})
    assert anthropic.status_code == 401
    body = json.loads(await anthropic.get_data())
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    ollama = await call(client, "POST", "/api/chat", CHAT, headers=bearer("no"))
    assert ollama.status_code == 401
    assert list(json.loads(await ollama.get_data())) == ["error", "request_id"]


async def test_health_stays_open_and_everything_else_is_closed(client: Any) -> None:
    assert (await call(client, "GET", "/health")).status_code == 200
    closed = [
        ("GET", "/v1/models"),
        ("GET", "/api/tags"),
        ("GET", "/api/version"),
        ("GET", "/v1/diagnostics/node"),
        ("POST", "/v1/diagnostics/node/retry"),
        ("GET", "/v1/cluster/nodes"),
        ("GET", "/v1/cluster/raft"),
        ("GET", "/nowhere"),  # unknown routes too: no key, no map of the API
        ("GET", "/health/"),
    ]
    for method, path in closed:
        response = await call(client, method, path)
        assert response.status_code == 401, (method, path)
    ok = await call(client, "GET", "/v1/models", headers={"authorization": f"Bearer {KEYS[1]}"})
    assert ok.status_code == 200


async def test_the_websocket_handshake_needs_the_key(client: Any, fake: FakeService) -> None:
    with pytest.RaisesGroup(Exception, allow_unwrapped=True, flatten_subgroups=True) as info:
        async with client.websocket("/v1/ws") as ws:
            await ws.send("{}")
            await ws.receive()
    refusal: Any = info.value
    if isinstance(refusal, BaseExceptionGroup):
        refusal = refusal.exceptions[0]
    assert refusal.response.status_code == 401
    ask = {"id": "a", "type": "chat.completions", "body": CHAT}
    async with client.websocket("/v1/ws", headers={"authorization": f"Bearer {KEYS[0]}"}) as ws:
        await ws.send(json.dumps(ask))
        messages = [json.loads(await ws.receive())]
        while messages[-1]["type"] == "chunk":
            messages.append(json.loads(await ws.receive()))
    assert messages[-1] == {"id": "a", "type": "done"}


async def test_without_keys_nothing_asks_for_one(fake: FakeService) -> None:
    async with keyed_app(fake, ()).test_app() as test_app:
        response = await call(test_app.test_client(), "POST", "/v1/chat/completions", CHAT)
    assert response.status_code == 200


# ---- the start-up warning --------------------------------------------------------------------


def test_a_reachable_api_without_a_key_is_warned_about() -> None:
    for host in ("0.0.0.0", "::", "", "192.168.1.5", "node-3.lan"):
        warning = exposure_warning(host, has_keys=False)
        assert warning is not None and "--api-key" in warning
        assert exposure_warning(host, has_keys=True) is None
    for host in ("127.0.0.1", "127.3.2.1", "::1", "[::1]", "localhost"):
        assert is_loopback(host)
        assert exposure_warning(host, has_keys=False) is None


# ---- configuration ---------------------------------------------------------------------------


def parse(argv: list[str], env: dict[str, str] | None = None) -> Any:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return serve_config(parser.parse_args(argv), env or {})


def test_keys_come_from_flags_the_variable_and_a_file(tmp_path: Path) -> None:
    assert parse([]).api_keys() == ()
    assert parse(["--api-key", "a1", "--api-key", "b2"]).api_keys() == ("a1", "b2")
    assert parse([], {"SKULK_API_KEY": "a1,b2, c3"}).api_keys() == ("a1", "b2", "c3")
    file = tmp_path / "keys"
    file.write_text("# team keys\nf1\n\n  f2  \na1\n")
    config = parse(["--api-key", "a1", "--api-key-file", str(file)])
    assert config.api_keys() == ("a1", "f1", "f2")
    assert "a1" not in repr(config)  # keys never reach a log line through the config


@pytest.mark.parametrize("content", ["", "# nothing\n\n", "has space\n", "ünïcode\n"])
def test_a_key_file_without_good_keys_is_refused(tmp_path: Path, content: str) -> None:
    file = tmp_path / "keys"
    file.write_text(content)
    with pytest.raises(ValueError, match="--api-key-file"):
        parse(["--api-key-file", str(file)])


def test_a_bad_key_or_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--api-key"):
        parse(["--api-key", "two words"])
    with pytest.raises(ValueError, match="--api-key-file"):
        parse(["--api-key-file", str(tmp_path / "absent")])


# ---- the CLI ---------------------------------------------------------------------------------


def nodes_api() -> FakeApi:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.headers.get("authorization") != f"Bearer {KEYS[0]}":
            return envelope(401, "invalid_api_key", "Incorrect API key provided.")
        return httpx.Response(200, json={"nodes": []})

    return FakeApi({("GET", "/v1/cluster/nodes"): answer})


def test_the_cli_sends_the_key_from_its_flag_or_the_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = nodes_api()
    assert api.run("nodes", "--api-key", KEYS[0]) == 0
    assert api.run("nodes", env={"SKULK_API_KEY": f"{KEYS[0]},{KEYS[1]}"}) == 0
    assert api.run("nodes", "--api-key", KEYS[0], env={"SKULK_API_KEY": "wrong"}) == 0
    assert api.run("nodes") == 1
    assert api.requests[-1].headers.get("authorization") is None
    err = capsys.readouterr().err
    assert "invalid_api_key" in err and "--api-key" in err
