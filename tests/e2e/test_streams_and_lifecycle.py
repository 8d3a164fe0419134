"""WebSocket streaming, disconnect cancellation, runner failure and shutdown of real servers."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import httpx
import pytest
import trio
from trio_websocket import open_websocket_url

from skulk.harness import NodeProcess, pid_alive

MODEL = "skulk-demo"
LONG = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "go on"}],
    "max_tokens": 1500,
    "temperature": 1.0,
    "seed": 11,
    "stream": True,
}


async def test_websocket_two_requests_one_cancelled(server: NodeProcess) -> None:
    ws_url = server.url.replace("http://", "ws://") + "/v1/ws"
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8,
        "temperature": 0,
    }
    long_body = {**LONG, "max_tokens": 1500}
    del long_body["stream"]
    with trio.fail_after(60):
        async with open_websocket_url(ws_url) as ws:
            await ws.send_message(
                json.dumps({"id": "a", "type": "chat.completions", "body": long_body})
            )
            await ws.send_message(json.dumps({"id": "b", "type": "chat.completions", "body": body}))
            seen: dict[str, list[dict[str, object]]] = {"a": [], "b": []}
            cancelled = False
            while True:
                msg = json.loads(await ws.get_message())
                seen[msg["id"]].append(msg)
                if msg["id"] == "a" and msg["type"] == "chunk" and not cancelled:
                    cancelled = True
                    await ws.send_message(json.dumps({"id": "a", "type": "cancel"}))
                ends = {i: [m for m in ms if m["type"] != "chunk"] for i, ms in seen.items()}
                if ends["a"] and ends["b"]:
                    break
    a_end, b_end = seen["a"][-1], seen["b"][-1]
    assert b_end == {"id": "b", "type": "done"}
    b_chunks = [m["data"] for m in seen["b"] if m["type"] == "chunk"]
    assert b_chunks[0]["object"] == "chat.completion.chunk"  # type: ignore[index]
    assert b_chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")  # type: ignore[index]
    # "a" either was cancelled or (if the model emitted EOS first) finished normally.
    if a_end["type"] == "error":
        assert a_end["error"]["code"] == "cancelled"  # type: ignore[index]
    else:
        assert a_end["type"] == "done"


async def test_websocket_bad_messages(server: NodeProcess) -> None:
    ws_url = server.url.replace("http://", "ws://") + "/v1/ws"
    with trio.fail_after(30):
        async with open_websocket_url(ws_url) as ws:
            await ws.send_message("not json")
            msg = json.loads(await ws.get_message())
            assert msg["id"] is None and msg["type"] == "error"
            await ws.send_message("[" * 100_000)  # too deep for the JSON parser
            msg = json.loads(await ws.get_message())
            assert msg["id"] is None and msg["type"] == "error"
            await ws.send_message(
                json.dumps({"id": "x", "type": "chat.completions", "body": {"model": MODEL}})
            )
            msg = json.loads(await ws.get_message())
            assert msg["id"] == "x" and msg["error"]["param"] == "messages"


def test_client_disconnect_cancels_generation(server: NodeProcess) -> None:
    before = server.runner()["cancelled"]
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=LONG, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
    # The runner acknowledges the Cancel the node sends when the client goes away.
    server.wait_for(lambda: server.runner()["cancelled"] > before, 30, "cancelled in runner")
    server.wait_for(lambda: server.runner()["active_requests"] == 0, 30, "idle")


def test_runner_killed_mid_stream_ends_stream_with_error_and_recovers(skulk_home: Path) -> None:
    with NodeProcess(skulk_home) as srv:
        pid = srv.runner()["pid"]
        events: list[str] = []
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=LONG, timeout=60) as r:
            for line in r.iter_lines():
                if not line:
                    continue
                events.append(line)
                if len(events) == 3:
                    os.kill(pid, signal.SIGKILL)
        # The stream ends with the error event (then [DONE]), never with a hang.
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2].removeprefix("data: "))
        assert error["error"]["code"] == "runner_crashed", events[-3:]
        assert error["error"]["type"] == "server_error"
        # The node relaunches the runner and serves again.
        srv.wait_ready(60)
        assert srv.runner()["pid"] != pid
        r2 = srv.post("/v1/chat/completions", json={**LONG, "stream": False, "max_tokens": 3})
        assert r2.status_code == 200


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_shuts_down_and_leaves_no_runner(skulk_home: Path, sig: signal.Signals) -> None:
    srv = NodeProcess(skulk_home).start()
    try:
        pid = srv.runner()["pid"]
        assert pid_alive(pid)
        srv.signal(sig)
        assert srv.wait_exit(30) == 0
        assert not pid_alive(pid)
        log = srv.log()
        assert "stopped" in log
        # A one-node cluster has nobody to hand leadership to, and says nothing about it.
        assert "leadership" not in log
    finally:
        srv.stop()


def test_health_is_503_with_the_reason_while_not_ready(skulk_home: Path) -> None:
    # A tiny load deadline keeps the runner from ever loading: /health must say why, with 503.
    srv = NodeProcess(skulk_home, "--load-timeout", "0.001").start(wait_ready=False)
    try:
        srv.wait_for(lambda: srv.get("/health").json().get("failure") is not None, 60, "failing")
        r = srv.get("/health")
        assert r.status_code == 503
        assert r.json()["failure"]["reason"] == "load_timeout"
        chat = srv.post("/v1/chat/completions", json={**LONG, "stream": False})
        assert chat.status_code == 503
        assert chat.json()["error"]["code"] == "model_not_ready"
    finally:
        srv.stop()


def test_wedged_runner_gives_non_streamed_request_a_504_then_recovers(skulk_home: Path) -> None:
    node = NodeProcess(
        skulk_home,
        "--runner-faults", "hang@decode:3#1",
        "--progress-timeout", "1", "--shutdown-grace", "0.5", "--restart-backoff", "0.1",
    )  # fmt: skip
    with node:
        body = {**LONG, "stream": False, "temperature": 0}
        r = node.post("/v1/chat/completions", json=body)
        assert r.status_code == 504, r.text
        assert r.json()["error"]["code"] == "runner_wedged"
        node.wait_ready(60)  # the second incarnation has no fault
        assert node.runner()["incarnation"] == 2
        ok = node.post("/v1/chat/completions", json={**body, "max_tokens": 3})
        assert ok.status_code == 200
        first = node.diagnostics()["runners"][0]
        assert first["failure"]["reason"] == "runner_wedged"
        assert any(e["kind"] == "deadline" for e in first["events"])


def test_crash_loop_is_visible_and_an_operator_can_retry_at_once(skulk_home: Path) -> None:
    node = NodeProcess(
        skulk_home,
        "--runner-faults", "crash@hello#1;crash@hello#2",
        "--restart-limit", "1", "--restart-backoff", "0.05", "--crash-loop-cooldown", "3600",
    )  # fmt: skip
    node.start(wait_ready=False)
    try:
        node.wait_for(lambda: node.get("/health").json()["state"] == "failed", 60, "failed")
        health = node.get("/health")
        assert health.status_code == 503
        body = health.json()
        assert body["failure"]["reason"] == "crash_loop"
        assert body["breaker"]["state"] == "open" and body["breaker"]["crash_loops"] == 1
        assert 3000 < body["breaker"]["retry_in"] <= 3600  # it would try again by itself
        assert node.diagnostics()["model"]["breaker"] == "open"
        r = node.post("/v1/diagnostics/node/retry")
        assert r.status_code == 202 and r.json()["retrying"] is True
        node.wait_ready(60)
        assert node.get("/health").json()["breaker"] == {
            "state": "closed", "crash_loops": 1, "retry_in": None
        }  # fmt: skip
        assert node.runner()["incarnation"] == 3
        # The retry acts only on a failed model: it never restarts a working runner.
        again = node.post("/v1/diagnostics/node/retry")
        assert again.status_code == 409 and again.json()["error"]["code"] == "not_failed"
        assert node.runner()["incarnation"] == 3
    finally:
        node.stop()
