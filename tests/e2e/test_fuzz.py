"""Seeded fuzzing of a real ``python -m skulk serve``: hundreds of malformed and hostile requests
on every route and on the WebSocket, each of which may fail only itself.

``SKULK_FUZZ_SEED=N`` reproduces a run (the seed is printed and in every failure message); the
cases come from ``_fuzz_cases.py``. Held for every answer (docs/api.md): no 5xx and no redirect;
an answer within ``HANG`` seconds (every read has a deadline: this is a hang detector, not a
timing test); errors in the JSON envelope with a JSON content type, never HTML; a stream that
fails before its first token is a plain JSON error, and a stream that starts ends with
``data: [DONE]``; the next request on the same keep-alive connection is answered. Legitimate
streams run alongside and must complete. At the end the node is healthy and still generates,
with the same runner process and no model restart. A test reports every broken rule at once,
grouped by class.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest
import trio
from trio_websocket import ConnectionClosed, HandshakeError, open_websocket_url

from skulk.harness import NodeProcess
from tests.e2e._fuzz_cases import (
    CHAT,
    COMPLETIONS,
    JSON_CT,
    MODEL,
    PROBE,
    WS_HANDSHAKE,
    HttpCase,
    WsCase,
    framing_cases,
    http_cases,
    wire,
    ws_cases,
    ws_frame_cases,
)
from tests.e2e._fuzz_client import (
    HANG,
    STREAM_TOTAL,
    BadResponse,
    Conn,
    FrameReader,
    Hang,
    NoAnswer,
    Reply,
    WsSession,
    exchange,
    finished,
    problems,
    ws_problems,
)

pytestmark = pytest.mark.e2e

SEED = int(os.environ.get("SKULK_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
REPRO = f"reproduce with SKULK_FUZZ_SEED={SEED}"
#: Each test stops starting cases after this long: a broken server must not make it run forever.
BUDGET = 150.0
HTTP_CASES, WS_CASES = 360, 110
HTTP_ERRORS = (NoAnswer, Hang, BadResponse)


@dataclass
class Findings:
    """Every rule broken, by class; :meth:`check` fails the test with all of them."""

    items: list[tuple[str, str, str]] = field(default_factory=list)

    def add(self, klass: str, where: HttpCase | WsCase | str, detail: str) -> None:
        if isinstance(where, HttpCase | WsCase):
            where = f"case #{where.n} {where.kind}: {where.label[:100]} -- {where.repro()}"
        self.items.append((klass, where, detail[:600]))

    def check(self, server: NodeProcess) -> None:
        if not self.items:
            return
        groups: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for klass, where, detail in self.items:
            groups[klass].append((where, detail))
        lines = [f"{len(self.items)} fuzz findings ({REPRO}):"]
        for klass, found in groups.items():
            lines.append(f"== {klass}: {len(found)}")
            lines += [f"  - {where}\n      => {detail}" for where, detail in found[:8]]
        log = [line for line in server.log().splitlines() if "skulk.access" not in line]
        lines += ["-- node output (last lines but the access log):", *log[-30:], f"({REPRO})"]
        pytest.fail("\n".join(lines), pytrace=False)


@dataclass(frozen=True)
class Baseline:
    port: int
    pid: int
    restarts: int


@pytest.fixture(scope="module")
def baseline(server: NodeProcess) -> Baseline:
    """The model is ready (waited for, with a deadline) before fuzzing; the runner's pid and
    the model's restart count then."""
    print(f"fuzz seed: SKULK_FUZZ_SEED={SEED}")
    server.wait_ready(120)
    diagnostics = server.diagnostics()
    pid = diagnostics["runners"][-1]["pid"]
    assert isinstance(pid, int), diagnostics
    port = urlsplit(server.url).port
    assert port is not None
    return Baseline(port, pid, diagnostics["model"]["restarts"])


async def get_json(port: int, method: str, path: str, body: object = None) -> tuple[int, object]:
    data = b"" if body is None else json.dumps(body).encode()
    case = HttpCase(-1, "check", path, method, path.encode(), data, JSON_CT if data else ())
    reply = await exchange(port, case)
    if not isinstance(reply, Reply):
        return 0, str(reply)
    try:
        return reply.status, json.loads(reply.body)
    except ValueError:
        return reply.status, reply.body[:300]


async def check_intact(server: NodeProcess, base: Baseline, findings: Findings) -> None:
    """Healthy, still generating, the same runner process, no model restart."""
    if server.proc is not None and server.proc.poll() is not None:
        findings.add("node-died", "end", f"the node exited with {server.proc.returncode}")
        return
    status, health = await get_json(base.port, "GET", "/health")
    if status != 200:
        findings.add("not-intact", "GET /health after fuzzing", f"{status} {health}")
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4}
    status, reply = await get_json(base.port, "POST", CHAT, chat)
    if status != 200 or not isinstance(reply, dict) or not reply.get("choices"):
        findings.add("not-intact", "a normal chat completion after fuzzing", f"{status} {reply}")
    status, listed = await get_json(base.port, "GET", "/v1/instances")
    if status != 200 or not isinstance(listed, dict) or len(listed["instances"]) != 1:
        findings.add("not-intact", "one instance, none placed by fuzzing", f"{status} {listed}")
    status, diag = await get_json(base.port, "GET", "/v1/diagnostics/node")
    if status != 200 or not isinstance(diag, dict):
        findings.add("not-intact", "GET /v1/diagnostics/node after fuzzing", f"{status} {diag}")
        return
    runner, restarts = diag["runners"][-1], diag["model"]["restarts"]
    if runner["pid"] != base.pid or restarts != base.restarts:
        findings.add(
            "runner-restarted",
            "GET /v1/diagnostics/node after fuzzing",
            f"runner pid {base.pid} -> {runner['pid']}, restarts {base.restarts} -> {restarts};"
            f" failure: {runner.get('failure')}, model: {diag['model']}",
        )


# ---- HTTP ------------------------------------------------------------------------------------


async def run_http(port: int, cases: list[HttpCase], findings: Findings) -> list[Conn]:
    """Run ``cases`` in order, each on the connection the previous one left open; returns the
    connections left holding a request whose body never came."""
    conn: Conn | None = None
    prev: HttpCase | None = None  # the case whose answer left ``conn`` open
    left: list[Conn] = []
    stop_at = time.monotonic() + BUDGET
    for case in cases:
        if time.monotonic() > stop_at:
            findings.add("budget", case, f"stopped after {BUDGET:g} s: {len(cases)} cases in all")
            break
        if conn is None:
            try:
                conn, prev = await Conn.open(port), None
            except OSError as exc:  # the node is gone (check_intact says more)
                findings.add("no-connection", case, f"stopped: cannot connect: {exc}")
                break
        sent = await conn.send(wire(case))
        if not case.replies:  # the body never comes: nothing to answer yet
            if case.send == "short_leave":
                left.append(conn)
            else:
                await conn.aclose()
            conn = None
            continue
        try:
            reply = await conn.reply(case.method, cut_stream=case.abort_stream)
        except HTTP_ERRORS as exc:
            await conn.aclose()
            conn = None
            if prev is not None and not isinstance(exc, BadResponse):
                alone = await exchange(port, case)  # the connection's fault, or this request's?
                if isinstance(alone, Reply):
                    findings.add(
                        "keep-alive",
                        prev,
                        f"the next request on its connection "
                        f"(#{case.n} {case.label[:60]}): {exc}; alone: {alone.status}",
                    )
                    for klass, detail in problems(case, alone):
                        findings.add(klass, case, detail)
                    continue
            klass = {NoAnswer: "no-answer", Hang: "hang", BadResponse: "bad-http"}[type(exc)]
            findings.add(klass, case, f"{exc}{'' if sent else ' (the server stopped reading)'}")
            continue
        for klass, detail in problems(case, reply):
            findings.add(klass, case, detail)
        if case.send == "pipelined" and not reply.close:
            try:
                if (probe := await conn.reply("GET")).status != 200:
                    findings.add("keep-alive", case, f"the pipelined GET /v1/models got {probe}")
            except HTTP_ERRORS as exc:
                findings.add("keep-alive", case, f"the pipelined GET /v1/models: {exc}")
                reply.close = True
        if reply.close or reply.cut:
            await conn.aclose()
            conn = None
        else:
            prev = case
    if conn is not None:
        await conn.send([PROBE])
        try:
            await conn.reply("GET")
        except HTTP_ERRORS as exc:
            if prev is not None:
                findings.add("keep-alive", prev, f"the next request on its connection: {exc}")
        await conn.aclose()
    return left


async def legit_streams(
    port: int, route: str, findings: Findings, done: trio.Event, count: list[int]
) -> None:
    """Normal streamed requests, one after another on one keep-alive connection, until
    ``done``; each must be a whole, successful stream."""
    conn: Conn | None = None
    for i in range(200):
        if done.is_set():
            break
        body: dict[str, object] = {"model": MODEL, "max_tokens": 16, "temperature": 0.8,
                                   "seed": i, "stream": True,
                                   "stream_options": {"include_usage": True}}  # fmt: skip
        if route == CHAT:
            body["messages"] = [{"role": "user", "content": "Tell me"}]
        else:
            body["prompt"] = "The"
        data = json.dumps(body).encode()
        case = HttpCase(i, "legit", f"legit stream on {route}", "POST", route.encode(), data,
                        JSON_CT)  # fmt: skip
        try:
            conn = conn or await Conn.open(port)
        except OSError as exc:
            findings.add("legit-failed", case, f"cannot connect: {exc}")
            break
        await conn.send(wire(case))
        try:
            reply = await conn.reply("POST")
        except HTTP_ERRORS as exc:
            findings.add("legit-failed", case, str(exc))
            await conn.aclose()
            conn = None
            continue
        found = problems(case, reply)
        if reply.status != 200 or not finished(reply):
            found.append(("incomplete", f"not a whole stream: {reply}"))
        for klass, detail in found:
            findings.add("legit-failed", case, f"{klass}: {detail}")
        count[0] += not found
        if reply.close:
            await conn.aclose()
            conn = None
    if conn is not None:
        await conn.aclose()


async def test_fuzz_http(server: NodeProcess, baseline: Baseline) -> None:
    """Hostile requests on every route, each on the keep-alive connection the previous one
    left, while legitimate streams run alongside."""
    cases = http_cases(random.Random(f"{SEED}:http"), HTTP_CASES)
    findings = Findings()
    fuzz_done = trio.Event()
    counts = [[0], [0]]
    left: list[Conn] = []
    async with trio.open_nursery() as nursery:
        for route, count in zip((CHAT, COMPLETIONS), counts, strict=True):
            nursery.start_soon(legit_streams, baseline.port, route, findings, fuzz_done, count)
        try:
            left = await run_http(baseline.port, cases, findings)
        finally:
            fuzz_done.set()
    if min(c[0] for c in counts) == 0:
        findings.add("legit-failed", "legit streams", f"whole streams per route: {counts}")
    for conn in left:  # their bodies never came: nothing may be answered yet (but a 408)
        with trio.move_on_after(0.2):
            data = await conn.stream.receive_some(65536)
            if data and not data.startswith(b"HTTP/1.1 408"):
                findings.add("early-answer", "a request whose body never came", f"{data[:300]!r}")
        await conn.aclose()
    await check_intact(server, baseline, findings)
    findings.check(server)


# ---- WebSocket ---------------------------------------------------------------------------------


def _lost(s: WsSession) -> str:
    return "hang" if s.closed is None else "ws-closed"


async def ws_case(s: WsSession, case: WsCase, nulls: list[int]) -> None:
    """Send one case and wait for what it must get; ``nulls[0]`` counts id-null errors due."""
    s.last = f"case #{case.n} {case.kind}: {case.label[:80]} -- {case.repro()}"
    await s.ws.send_message(case.payload)
    if case.reply == "none":  # no answer is due: the socket must still answer a probe
        probe = f"probe{case.n}"
        await s.ws.send_message(json.dumps({"id": probe, "type": "probe"}))
        if not await s.wait(lambda: s.end(probe) is not None):
            s.report(_lost(s), s.last, f"no answer to a probe sent after it ({s.closed})")
        return
    if case.rid is None:
        if not await s.wait(lambda: len(s.by_id[None]) > nulls[0]):
            s.report(_lost(s), s.last, f"no error with id null ({s.closed})")
            return
        nulls[0] += 1
        for klass, detail in ws_problems(case, s.by_id[None][-1], 0):
            s.report(klass, s.last, detail)
        return
    rid = case.rid
    if case.cancel_after_first:
        if await s.wait(lambda: s.chunks(rid) > 0 or s.end(rid) is not None):
            if s.end(rid) is None:
                await s.ws.send_message(json.dumps({"id": rid, "type": "cancel"}))
    any_id = case.reply == "error?"
    got = await s.wait(
        lambda: s.end(rid) is not None or (any_id and len(s.by_id[None]) > nulls[0]),
        STREAM_TOTAL if case.reply in ("done", "any") else HANG,
    )
    if not got:
        s.report(_lost(s), s.last, f"no end for {rid} ({s.closed}; {s.chunks(rid)} chunks)")
    elif (end := s.end(rid)) is None:
        nulls[0] += 1
    else:
        for klass, detail in ws_problems(case, end, s.chunks(rid)):
            s.report(klass, s.last, detail)


async def ws_duplicate(s: WsSession, n: int) -> None:
    """A second request with an in-flight id is refused; the first one goes on."""
    rid = f"dup{n}"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "go on"}], "max_tokens": 2000}
    msg = json.dumps({"id": rid, "type": "chat.completions", "body": body})
    s.last = f"a request with the id {rid} of one in flight"
    await s.ws.send_message(msg)
    if not await s.wait(lambda: s.chunks(rid) > 0 or s.end(rid) is not None):
        s.report(_lost(s), s.last, f"the first request did not stream ({s.closed})")
        return
    await s.ws.send_message(msg)
    await s.wait(lambda: s.end(rid) is not None)
    await s.ws.send_message(json.dumps({"id": rid, "type": "cancel"}))
    if not await s.wait(lambda: len(s.ends(rid)) >= 2, STREAM_TOTAL):
        s.report(_lost(s), s.last, f"expected two ends, got {s.ends(rid)} ({s.closed})")
        return
    first, then = s.ends(rid)[:2]
    refused = _error_field(first, "param") == "id"
    finished_first = first["type"] == "done"  # it ended before the duplicate came
    ended = then["type"] == "done" or _error_field(then, "code") == "cancelled"
    if not (refused or finished_first) or not ended:
        s.report("wrong-answer", s.last, f"ends: {s.ends(rid)}")


def _error_field(message: dict[str, object], name: str) -> object:
    err = message.get("error")
    return err.get(name) if isinstance(err, dict) else None


async def run_ws(url: str, cases: list[WsCase], findings: Findings) -> None:
    """Run ``cases`` on one socket (a new one if the server closes it), with legitimate
    requests streaming on the same socket meanwhile."""
    todo = list(cases)
    stop_at = time.monotonic() + BUDGET
    while todo and time.monotonic() < stop_at:
        try:
            await ws_session(url, todo, stop_at, findings)
        except (OSError, HandshakeError) as exc:  # the node is gone (check_intact says more)
            findings.add("no-connection", "WebSocket", f"stopped: cannot connect: {exc!r}")
            break
    if todo:
        findings.add("budget", "WebSocket", f"{len(todo)} cases not run within {BUDGET:g} s")


async def ws_session(url: str, todo: list[WsCase], stop_at: float, findings: Findings) -> None:
    """Run cases off ``todo`` on one socket until they are done or the server closes it."""
    async with (
        open_websocket_url(url, max_message_size=64 * 2**20) as ws,
        trio.open_nursery() as nursery,
    ):
        s = WsSession(ws, findings.add)
        nursery.start_soon(s.read_all)
        nulls, legit = [0], []
        try:
            while todo and s.closed is None and time.monotonic() < stop_at:
                case = todo.pop(0)
                if case.n % 15 == 7:  # a legitimate request streams meanwhile
                    legit.append(rid := f"legit{case.n}")
                    await ws.send_message(json.dumps(_legit_ws(rid)))
                if case.n % 50 == 25:
                    await ws_duplicate(s, case.n)
                await ws_case(s, case, nulls)
        except ConnectionClosed as exc:  # the reader files why, too
            s.closed = s.closed or f"{exc.reason.code} {exc.reason.reason}"
        if s.closed is not None:
            findings.add("ws-closed", s.last, f"the server closed the socket: {s.closed}")
        await check_ws_legit(s, legit, findings)
        if (extra := len(s.by_id[None]) - nulls[0]) > 0:
            found = s.by_id[None][-extra:]
            findings.add("ws-extra", "socket", f"errors with id null nobody caused: {found}")
        nursery.cancel_scope.cancel()


def _legit_ws(rid: str) -> dict[str, object]:
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 24}
    return {"id": rid, "type": "chat.completions", "body": chat}


async def check_ws_legit(s: WsSession, legit: list[str], findings: Findings) -> None:
    for rid in legit:
        if not await s.wait(lambda rid=rid: s.end(rid) is not None, STREAM_TOTAL):
            findings.add("legit-failed", f"WebSocket request {rid}", f"no end ({s.closed})")
        elif (end := s.end(rid)) != {"id": rid, "type": "done"} or not s.chunks(rid):
            findings.add("legit-failed", f"WebSocket request {rid}", f"ended {end}")


async def test_fuzz_websocket(server: NodeProcess, baseline: Baseline) -> None:
    """Hostile messages on ``/v1/ws``: each fails only its own request, never the socket."""
    cases = ws_cases(random.Random(f"{SEED}:ws"), WS_CASES)
    findings = Findings()
    await run_ws(f"ws://127.0.0.1:{baseline.port}/v1/ws", cases, findings)
    await check_intact(server, baseline, findings)
    findings.check(server)


# ---- below HTTP and WebSocket semantics ------------------------------------------------------


async def test_fuzz_http_framing(server: NodeProcess, baseline: Baseline) -> None:
    """Requests that break HTTP/1.1 framing itself, each on a new connection: an answer (4xx,
    in the envelope) within the deadline, never a 5xx or a hang; the node serves on."""
    findings = Findings()
    for label, data in framing_cases(random.Random(f"{SEED}:framing")):
        where = f"{label}: {data[:120]!r}"
        try:
            conn = await Conn.open(baseline.port)
        except OSError as exc:  # the node is gone (check_intact says more)
            findings.add("no-connection", where, f"stopped: cannot connect: {exc}")
            break
        await conn.send([data])
        try:
            reply = await conn.reply("GET")
        except HTTP_ERRORS as exc:
            klass = {NoAnswer: "no-answer", Hang: "hang", BadResponse: "bad-http"}[type(exc)]
            findings.add(klass, where, str(exc))
            continue
        finally:
            await conn.aclose()
        for klass, detail in problems(HttpCase(0, "framing", label, "GET", b"-", data), reply):
            findings.add(klass, where, detail)
    await check_intact(server, baseline, findings)
    findings.check(server)


async def ws_raw(port: int, frames: bytes, expect: str) -> str | None:
    """Send ``frames`` after a handshake; what went wrong, or ``None`` (see ws_frame_cases)."""
    try:
        conn = await Conn.open(port)
    except OSError as exc:
        return f"cannot connect: {exc}"
    try:
        await conn.send([WS_HANDSHAKE])
        buf = b""
        with trio.move_on_after(HANG):
            while b"\r\n\r\n" not in buf and (data := await conn.stream.receive_some(65536)):
                buf += data
        head, _, rest = buf.partition(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 101"):
            return f"the handshake was answered {buf[:200]!r}"
        await conn.send([frames])
        reader = FrameReader(conn.stream, rest)
        with trio.move_on_after(1 if expect == "any" else HANG):
            while (got := await reader.frame()) is not None:
                opcode, payload = got
                if opcode == 8:
                    code = int.from_bytes(payload[:2], "big") if len(payload) >= 2 else None
                    if code == 1011:
                        return f"closed with 1011 (internal error): {payload!r}"
                    return f"closed ({code}) where a reply was due" if expect == "reply" else None
                if opcode in (1, 2):
                    msg = json.loads(payload)
                    if msg.get("type") != "error" or not isinstance(msg.get("error"), dict):
                        return f"replied {payload[:300]!r}"
                    must_close = expect == "close"
                    return f"replied {payload[:200]!r} but must close" if must_close else None
            return "closed the connection without a reply" if expect == "reply" else None
        return None if expect == "any" else f"neither a reply nor a close within {HANG:g} s"
    finally:
        await conn.aclose()


async def test_fuzz_websocket_frames(server: NodeProcess, baseline: Baseline) -> None:
    """Frames that break the WebSocket protocol close the socket (never with 1011); frames
    that are fine on the wire get their message's error; the node serves on."""
    findings = Findings()
    for label, frames, expect in ws_frame_cases():
        if (why := await ws_raw(baseline.port, frames, expect)) is not None:
            findings.add("ws-frame", f"{label}: {frames[:80]!r}", why)
    await check_intact(server, baseline, findings)
    findings.check(server)
