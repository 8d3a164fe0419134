"""Following one request (skulk.tracing and where it is wired): request ids, the context the
running code works for, the log formats, the guard's header, the runner's flight recorder
naming the API request, and one request's timeline across nodes."""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.lowlevel
from hypothesis import given
from hypothesis import strategies as st

from skulk.api._errors import ApiError
from skulk.api._guard import RequestGuard
from skulk.diagnostics import ClusterTimeline, journal_events
from skulk.diagnostics._timeline import CODEC
from skulk.federation import RpcFailed
from skulk.runner._produced import ProducedFile
from skulk.runner._recorder import FlightRecorder
from skulk.runner._request_table import RequestTable
from skulk.tracing import (
    MAX_REQUEST_ID,
    JsonFormatter,
    RequestJournal,
    check_request_id,
    current_request_id,
    log_handler,
    new_request_id,
    node_scope,
    note,
    request_scope,
    serving,
)
from skulk.wire.diagnostics import TimelineAsk, TimelineEvent
from skulk.wire.runner import Finished, GenerationEnd, PrefillProgress, TokenChunk, Usage
from tests.unit.test_api_guard import App, Peer, guard, scope

# ---- ids -------------------------------------------------------------------------------------


def test_valid_ids_are_kept_as_sent() -> None:
    for rid in ("a", "req-0123", "trace:1/2@x+y=z_w.v", "x" * MAX_REQUEST_ID):
        assert check_request_id(rid) == rid


@pytest.mark.parametrize(
    "bad",
    ["", "x" * (MAX_REQUEST_ID + 1), "two words", "tab\there", "nl\n", "nul\x00", "caf\u00e9",
     "quote\"", "semi;colon", "back\\slash", "\x7f"],
)  # fmt: skip
def test_invalid_ids_are_refused_saying_why(bad: str) -> None:
    with pytest.raises(ValueError, match="request id"):
        check_request_id(bad)


@given(st.text(max_size=200))
def test_an_id_is_either_refused_or_safe_in_a_header_and_a_log_line(raw: str) -> None:
    try:
        rid = check_request_id(raw)
    except ValueError:
        return
    assert 1 <= len(rid) <= MAX_REQUEST_ID and rid.isascii() and rid.isprintable()
    assert not any(c in rid for c in " \t\r\n\"';,\\")


def test_generated_ids_are_valid_and_fresh() -> None:
    ids = {new_request_id() for _ in range(100)}
    assert len(ids) == 100 and all(check_request_id(i).startswith("req-") for i in ids)


# ---- context and journal -----------------------------------------------------------------------


async def test_the_request_is_seen_by_the_tasks_it_starts_and_only_them() -> None:
    journal = RequestJournal()
    seen: dict[str, str | None] = {}

    async def child(name: str) -> None:
        await trio.lowlevel.checkpoint()
        seen[name] = current_request_id()
        note("child", name)

    with node_scope("n1", journal):
        async with trio.open_nursery() as nursery:
            with request_scope("r-1"):
                serving("inst-1", "model-1")
                nursery.start_soon(child, "inside")
            nursery.start_soon(child, "outside")
    assert seen == {"inside": "r-1", "outside": None}
    assert current_request_id() is None
    [event] = journal.events()
    assert (event.request_id, event.kind, event.detail) == ("r-1", "child", "inside")
    assert (event.instance, event.model) == ("inst-1", "model-1")
    note("nowhere")  # outside a node and a request: nothing, no error
    assert len(journal.events()) == 1


def test_the_journal_is_bounded_and_answers_by_request() -> None:
    journal = RequestJournal(capacity=3)
    with node_scope("n1", journal):
        for i in range(5):
            with request_scope(f"r{i % 2}"):
                note("k", str(i))
    assert [e.detail for e in journal.events()] == ["2", "3", "4"]
    assert [e.detail for e in journal.events("r0")] == ["2", "4"]
    [first, _] = journal_events("n1", journal, "r0")
    assert (first.node, first.rank, first.incarnation, first.request_id) == ("n1", 0, 0, "r0")


def test_a_request_is_journaled_as_received_only_once_something_is_noted() -> None:
    journal = RequestJournal()
    with node_scope("n1", journal):
        with request_scope("poll", received="GET /health"):
            pass  # a health check: nothing about it is kept
        with request_scope("r1", received="POST /v1/chat/completions"):
            note("request.routed", "instance i1")
            note("request.done", "stop")
    assert [(e.request_id, e.kind, e.detail) for e in journal.events()] == [
        ("r1", "request.received", "POST /v1/chat/completions"),
        ("r1", "request.routed", "instance i1"),
        ("r1", "request.done", "stop"),
    ]
    received, routed, _ = journal.events()
    assert received.at <= routed.at


# ---- log lines ---------------------------------------------------------------------------------


def logged(fmt: str, emit: Any) -> str:
    out = io.StringIO()
    handler = log_handler("json" if fmt == "json" else "text", out)
    logger = logging.getLogger(f"test.tracing.{fmt}")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        emit(logger)
    finally:
        logger.removeHandler(handler)
    return out.getvalue()


def test_json_lines_name_node_request_and_instance() -> None:
    def emit(logger: logging.Logger) -> None:
        with node_scope("node-a", RequestJournal()), request_scope("r-9", instance="i-3"):
            logger.info("hello %s", "world")
        logger.warning('outside "quoted"\nline')

    first, second = (json.loads(line) for line in logged("json", emit).splitlines())
    assert first["message"] == "hello world" and first["level"] == "INFO"
    assert (first["node"], first["request_id"], first["instance"]) == ("node-a", "r-9", "i-3")
    assert first["logger"] == "test.tracing.json" and first["timestamp"].endswith("Z")
    assert second["message"] == 'outside "quoted"\nline'  # one line: the newline is escaped
    assert (second["node"], second["request_id"], second["instance"]) == (None, None, None)


def test_a_json_line_carries_the_traceback() -> None:
    def emit(logger: logging.Logger) -> None:
        try:
            raise KeyError("boom")
        except KeyError:
            logger.exception("failed")

    [line] = logged("json", emit).splitlines()
    parsed = json.loads(line)
    assert parsed["message"] == "failed" and "KeyError: 'boom'" in parsed["exception"]


def test_a_text_line_shows_the_request_id_when_there_is_one() -> None:
    def emit(logger: logging.Logger) -> None:
        with request_scope("r-7"):
            logger.info("inside")
        logger.info("outside")

    inside, outside = logged("text", emit).splitlines()
    assert inside.endswith("INFO test.tracing.text [r-7]: inside")
    assert outside.endswith("INFO test.tracing.text: outside")


def test_the_json_formatter_alone_copes_with_a_plain_record() -> None:
    record = logging.LogRecord("x", logging.ERROR, "f.py", 1, "m %d", (1,), None)
    assert json.loads(JsonFormatter().format(record))["message"] == "m 1"


# ---- the API edge ------------------------------------------------------------------------------


class Recording(App):
    """Answers 400 from inside the request, in the envelope: it carries the request's id."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await receive()
        body = json.dumps(ApiError.invalid("x", "bad x").envelope()).encode()
        await send({"type": "http.response.start", "status": 400, "headers": []})
        await send({"type": "http.response.body", "body": body, "more_body": False})


async def test_the_clients_id_is_used_and_returned() -> None:
    peer = Peer(b"{}")
    await guard(Recording())(scope([(b"x-request-id", b"abc-1")]), peer.receive, peer.send)  # type: ignore[arg-type]
    assert peer.headers[b"x-request-id"] == b"abc-1"
    assert json.loads(peer.body)["error"]["request_id"] == "abc-1"


async def test_without_an_id_the_node_makes_one() -> None:
    peer = Peer(b"{}")
    await guard(App())(scope(), peer.receive, peer.send)  # type: ignore[arg-type]
    assert peer.status == 200 and check_request_id(peer.headers[b"x-request-id"].decode())


@pytest.mark.parametrize(
    "headers",
    [[(b"x-request-id", b"x" * 129)], [(b"x-request-id", b"a\x01b")], [(b"x-request-id", b"")],
     [(b"x-request-id", b"caf\xe9")], [(b"x-request-id", b"a"), (b"X-Request-Id", b"b")]],
)  # fmt: skip
async def test_an_invalid_id_is_a_400_naming_the_header(headers: list[tuple[bytes, bytes]]) -> None:
    app, peer = App(), Peer(b"{}")
    await guard(app)(scope(headers), peer.receive, peer.send)  # type: ignore[arg-type]
    assert app.bodies == [] and peer.status == 400
    error = json.loads(peer.body)["error"]
    assert error["param"] == "x-request-id"
    assert error["request_id"] == peer.headers[b"x-request-id"].decode()
    assert error["request_id"].startswith("req-")


async def test_a_websocket_gets_its_id_in_the_accept() -> None:
    sent: list[dict[str, Any]] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "websocket.accept", "headers": [(b"x-other", b"1")]})
        await send({"type": "websocket.close", "code": 1000})

    async def receive() -> dict[str, Any]:
        return {"type": "websocket.connect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    ws = {**scope([(b"x-request-id", b"ws-1")]), "type": "websocket"}
    await RequestGuard(app, max_body=10, body_timeout=1.0)(ws, receive, send)  # type: ignore[arg-type]
    assert dict(sent[0]["headers"]) == {b"x-other": b"1", b"x-request-id": b"ws-1"}
    refused: list[dict[str, Any]] = []

    async def send_refused(message: dict[str, Any]) -> None:
        refused.append(message)

    bad = {**ws, "headers": [(b"x-request-id", b"no way")],
           "extensions": {"websocket.http.response": {}}}  # fmt: skip
    await RequestGuard(app, max_body=10, body_timeout=1.0)(bad, receive, send_refused)  # type: ignore[arg-type]
    assert refused[0]["type"] == "websocket.http.response.start" and refused[0]["status"] == 400
    assert json.loads(refused[1]["body"])["error"]["param"] == "x-request-id"


# ---- the runner's flight recorder ----------------------------------------------------------------


def test_the_flight_recorder_names_the_api_request() -> None:
    trio.run(_names_the_api_request)  # the table reads Trio's clock (first-token times)


async def _names_the_api_request() -> None:
    recorder = FlightRecorder()
    table = RequestTable(recorder)
    table.open("internal-1")
    with request_scope("client-7"):
        table.start("internal-1")
    table.open("internal-2")
    table.start("internal-2")  # outside an API request: its own id, as before
    table.prefilled(PrefillProgress("internal-1", 2, 3))  # admitted, 2 tokens from the cache
    table.prefilled(PrefillProgress("internal-1", 3, 3))  # its one chunk
    table.prefilled(PrefillProgress("stranger", 0, 3))  # not in flight: ignored
    table.deliver(TokenChunk("internal-1", (1,), "a"))
    table.deliver(Finished("internal-1", GenerationEnd("stop", Usage(3, 1, 2))))
    table.deliver(Finished("internal-2", GenerationEnd("length", Usage(3, 1))))
    table.prefilled(PrefillProgress("internal-2", 0, 3))  # after its end: ignored
    named = [(e.kind, e.request_id) for e in recorder.events()]
    assert named == [
        ("request.start", "client-7"), ("request.start", "internal-2"),
        ("request.admitted_kv", "client-7"), ("request.prefill", "client-7"),
        ("request.first_token", "client-7"), ("request.finish", "client-7"),
        ("request.finish", "internal-2"),
    ]  # fmt: skip
    events = recorder.events()
    assert events[0].detail == "runner request internal-1"
    assert events[2].detail.endswith("2 of 3 prompt tokens from the prefix cache")
    assert events[3].detail == "3 of 3 prompt tokens"
    assert "prompt 3, 2 cached" in events[5].detail
    assert table._names == {} and table._admitted == set()  # nothing kept


def test_what_a_runner_produced_is_written_down_under_the_api_requests_id() -> None:
    trio.run(_produced_under_the_api_requests_id)


async def _produced_under_the_api_requests_id() -> None:
    seen: list[tuple[str, str]] = []
    table = RequestTable(FlightRecorder(), lambda rid, text: seen.append((rid, text)))
    table.open("internal-1")
    with request_scope("client-7"):
        table.start("internal-1")
    table.deliver(TokenChunk("internal-1", (1,), "Hel"))
    table.close("internal-1")  # the consumer left: what the runner still sends was produced
    table.deliver(TokenChunk("internal-1", (2,), "lo"))
    table.deliver(TokenChunk("stranger", (3,), "x"))  # not in flight: not this runner's text
    table.deliver(Finished("internal-1", GenerationEnd("cancelled", Usage(3, 2))))
    table.deliver(TokenChunk("internal-1", (4,), "late"))  # after its end: ignored
    assert seen == [("client-7", "Hel"), ("client-7", "lo")]


def test_the_produced_file_appends_json_lines_and_a_failed_write_stops_it(tmp_path: Path) -> None:
    path = tmp_path / "produced.jsonl"
    sink = ProducedFile(str(path))
    sink("client-7", 42, "Hel")
    sink("client-7", 42, 'lo "x"\n')
    lines = [json.loads(ln) for ln in path.read_text().splitlines()]
    assert lines == [{"id": "client-7", "runner": 42, "text": "Hel"},
                     {"id": "client-7", "runner": 42, "text": 'lo "x"\n'}]  # fmt: skip
    broken = ProducedFile(str(tmp_path / "no" / "such" / "dir.jsonl"))
    broken("client-7", 42, "a")  # logs once, never raises: the record never fails a request
    broken("client-7", 42, "b")
    assert not (tmp_path / "no").exists()


# ---- one request's timeline ---------------------------------------------------------------------


class Link:
    def __init__(self, timeline: ClusterTimeline) -> None:
        self.timeline = timeline

    async def call(self, method: str, body: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        return await self.timeline.handle_rpc(method, body)


def runner_event(node: str, at: float, kind: str, rid: str | None) -> TimelineEvent:
    return TimelineEvent(at, node, "m", "i1", 0, 1, kind, "", rid)


async def test_one_requests_events_come_from_every_node_and_only_its_own() -> None:
    ja, jb = RequestJournal(), RequestJournal()
    with node_scope("a", ja), request_scope("r1", instance="i1", model="m"):
        note("route.hop", "to node b")
    with node_scope("b", jb), request_scope("r1", instance="i1"):
        note("route.arrived", "from node a")
    with node_scope("b", jb), request_scope("r2"):
        note("route.arrived", "from node a")
    b = ClusterTimeline(
        "b",
        lambda: [runner_event("b", 1e12, "request.first_token", "r1"),
                 runner_event("b", 1e12, "request.first_token", "r2"),
                 runner_event("b", 1e12, "phase", None)],
        list, lambda n: None, requests=lambda rid: journal_events("b", jb, rid),
    )  # fmt: skip
    a = ClusterTimeline(
        "a", list, lambda: ["a", "b"], {"b": Link(b)}.get,
        requests=lambda rid: journal_events("a", ja, rid),
    )  # fmt: skip
    result = await a.gather(0.0, 100, "r1")
    assert [(e.node, e.kind) for e in result.events] == [
        ("a", "route.hop"), ("b", "route.arrived"), ("b", "request.first_token")
    ]  # fmt: skip
    assert all(e.request_id == "r1" for e in result.events)
    everything = await a.gather(0.0, 100)  # the cluster timeline: runner events only, as before
    assert {e.kind for e in everything.events} == {"request.first_token", "phase"}


async def test_the_rpc_refuses_a_malformed_request_id() -> None:
    timeline = ClusterTimeline("a", list, list, lambda n: None)
    for bad in ("x" * 129, "two words", ""):
        with pytest.raises(RpcFailed) as info:
            await timeline.handle_rpc("diagnostics.timeline", CODEC.encode(TimelineAsk(0, 5, bad)))
        assert info.value.reason == "bad_request"
