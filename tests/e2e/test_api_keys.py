"""A real server started with API keys, driven by the official clients: a wrong or missing key
is each client's authentication error (401 in its format's envelope), a right one works, and
``/health`` stays open."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families
from trio_websocket import ConnectionRejected, open_websocket_url

from skulk.harness import NodeProcess

MODEL = "skulk-demo"
KEY = "sk-skulk-test-4f1d2c3b5a69788796a5b4c3"
OTHER = "sk-skulk-test-second-key-0000000000000"
CHAT: Any = [{"role": "user", "content": "Hi"}]  # each client types its messages its way


@pytest.fixture(scope="module")
def keyed(skulk_home: Path) -> Iterator[NodeProcess]:
    """A node whose API needs the key given with --api-key."""
    with NodeProcess(skulk_home, "--api-key", KEY, env={"SKULK_API_KEY": ""}) as srv:
        yield srv


@pytest.fixture(scope="module")
def two_keys(skulk_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    keys = tmp_path_factory.mktemp("keys") / "api-keys"
    keys.write_text(f"# the team's keys\n{KEY}\n{OTHER}\n")
    with NodeProcess(skulk_home, "--api-key-file", str(keys)) as srv:
        yield srv


def openai_client(server: NodeProcess, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)


def test_openai_wrong_key_is_authentication_error(keyed: NodeProcess) -> None:
    with pytest.raises(openai.AuthenticationError) as info:
        openai_client(keyed, "wrong").chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2
        )
    assert info.value.status_code == 401
    assert info.value.code == "invalid_api_key"
    reply = openai_client(keyed, KEY).chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=2
    )
    assert reply.choices[0].message.role == "assistant"


def test_anthropic_wrong_key_is_authentication_error(keyed: NodeProcess) -> None:
    def messages(key: str) -> anthropic.types.Message:
        client = anthropic.Anthropic(base_url=keyed.url, api_key=key, max_retries=0)
        return client.messages.create(model=MODEL, max_tokens=2, messages=CHAT)

    with pytest.raises(anthropic.AuthenticationError) as info:
        messages("wrong")
    assert info.value.status_code == 401
    body = info.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "authentication_error"
    assert messages(KEY).role == "assistant"  # the key as x-api-key


def test_ollama_wrong_bearer_is_response_error_401(keyed: NodeProcess) -> None:
    def chat(key: str) -> ollama.ChatResponse:
        headers = {"Authorization": f"Bearer {key}"}
        client = ollama.Client(host=keyed.url, headers=headers, timeout=60)
        return client.chat(model=MODEL, messages=CHAT, options={"num_predict": 2})

    with pytest.raises(ollama.ResponseError) as info:
        chat("wrong")
    assert info.value.status_code == 401
    assert chat(KEY).done is True


def test_health_is_open_and_control_routes_are_closed(keyed: NodeProcess) -> None:
    # One keep-alive connection throughout: a 401 leaves it usable (the body was read first).
    with httpx.Client(base_url=keyed.url, timeout=30) as http:
        assert http.get("/health").status_code == 200
        closed = [("GET", "/v1/instances"), ("POST", "/v1/placements"),
                  ("GET", "/v1/cluster/state"), ("DELETE", "/v1/instances/x")]  # fmt: skip
        for method, path in closed:
            response = http.request(method, path, json={"model": MODEL})
            assert response.status_code == 401, (method, path)
            assert response.headers["www-authenticate"].startswith("Bearer")
            assert response.json()["error"]["code"] == "invalid_api_key"
        allowed = http.get("/v1/instances", headers={"Authorization": f"Bearer {KEY}"})
        assert allowed.status_code == 200 and len(allowed.json()["instances"]) == 1


def test_the_cli_passes_the_key(
    keyed: NodeProcess, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from skulk.__main__ import main

    monkeypatch.delenv("SKULK_API_KEY", raising=False)
    assert main(["ps", "--api", keyed.url, "-q"]) == 1
    assert "invalid_api_key" in capsys.readouterr().err
    assert main(["ps", "--api", keyed.url, "-q", "--api-key", KEY]) == 0
    assert capsys.readouterr().out.strip()  # the instance id


def test_every_key_of_a_key_file_works(two_keys: NodeProcess) -> None:
    for key in (KEY, OTHER):
        models = openai_client(two_keys, key).models.list()
        assert [m.id for m in models.data] == [MODEL]
    with pytest.raises(openai.AuthenticationError):
        openai_client(two_keys, KEY + "x").models.list()


async def test_the_websocket_handshake_needs_the_key(keyed: NodeProcess) -> None:
    ws_url = keyed.url.replace("http://", "ws://") + "/v1/ws"
    with trio.fail_after(30):
        with pytest.raises(ConnectionRejected) as info:
            async with open_websocket_url(ws_url):
                pass
        assert info.value.status_code == 401
        headers = [(b"authorization", f"Bearer {KEY}".encode())]
        async with open_websocket_url(ws_url, extra_headers=headers) as ws:
            ask = {"id": "a", "type": "chat.completions", "body": {"model": MODEL, "messages": CHAT,
                                                                    "max_tokens": 2}}  # fmt: skip
            await ws.send_message(json.dumps(ask))
            while (message := json.loads(await ws.get_message()))["type"] == "chunk":
                pass
            assert message == {"id": "a", "type": "done"}


def test_metrics_needs_the_key_as_prometheus_sends_it(keyed: NodeProcess) -> None:
    """Prometheus' ``authorization: {credentials: KEY}`` sends ``Authorization: Bearer KEY``."""
    assert httpx.get(keyed.url + "/metrics", timeout=30).status_code == 401
    wrong = {"Authorization": "Bearer wrong"}
    assert httpx.get(keyed.url + "/metrics", headers=wrong, timeout=30).status_code == 401
    right = {"Authorization": f"Bearer {KEY}"}
    response = httpx.get(keyed.url + "/metrics", headers=right, timeout=30)
    assert response.status_code == 200
    names = {f.name for f in text_string_to_metric_families(response.text)}
    assert {"skulk:raft_term", "process_cpu_seconds"} <= names
