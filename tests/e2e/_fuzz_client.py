"""Clients for ``test_fuzz.py`` that never wait without a deadline, and the rules every answer
is held to (docs/api.md).

:class:`Conn` drives one HTTP/1.1 connection byte by byte (so a body can come late, or never)
and parses answers with h11; :class:`WsSession` files every WebSocket message by request id;
:class:`FrameReader` reads server frames off a raw socket. :func:`problems` and
:func:`ws_problems` say which rules an answer breaks.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

import h11
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from tests.e2e._fuzz_cases import HttpCase, WsCase, wire

#: The longest any answer (or any single read of a stream) may take.
HANG = 10.0
#: The longest a whole stream may take.
STREAM_TOTAL = 60.0
#: An error answer longer than this echoes a client's input unclipped.
MAX_ERROR_BYTES = 4096
ENVELOPE_KEYS = {"message", "type", "param", "code"}


class NoAnswer(Exception):
    """The server closed the connection without answering."""


class Hang(Exception):
    """No whole answer within the deadline."""


class BadResponse(Exception):
    """Bytes that are not an HTTP response, or one cut short."""


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes
    close: bool  # the server will close the connection (Connection: close)
    cut: bool = False  # we hung up after the first event of a stream

    def header(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k == name), None)

    def __str__(self) -> str:
        return f"{self.status} {self.header('content-type')!r} {self.body[:300]!r}"


class Conn:
    """A keep-alive connection driven byte by byte; h11 only parses the answers."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.rest = b""  # bytes of the next answer that came with the previous one

    @classmethod
    async def open(cls, port: int) -> Conn:
        with trio.fail_after(HANG):
            return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def aclose(self) -> None:
        with trio.move_on_after(1, shield=True):
            await self.stream.aclose()

    async def send(self, pieces: list[bytes | float]) -> bool:
        """Send ``pieces`` (floats are pauses); ``False`` if the server stopped reading."""
        try:
            for piece in pieces:
                if isinstance(piece, float):
                    await trio.sleep(piece)  # the case is "the body comes late", not a sync
                else:
                    with trio.fail_after(HANG):
                        await self.stream.send_all(piece)
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
            return False
        return True

    async def reply(self, method: str, *, cut_stream: bool = False) -> Reply:
        """The next whole answer (``cut_stream``: only up to a 200 stream's first event).
        Raises :class:`NoAnswer`, :class:`Hang` or :class:`BadResponse`."""
        conn = h11.Connection(h11.CLIENT)  # primed with a stand-in request: framing only
        stand_in = "HEAD" if method == "HEAD" else "GET"
        conn.send(h11.Request(method=stand_in, target="/", headers=[("Host", "x")]))
        conn.send(h11.EndOfMessage())
        if self.rest:  # receive_data(b"") would mean EOF
            conn.receive_data(self.rest)
        self.rest = b""
        status, headers, body, seen, limit = 0, [], bytearray(), False, HANG
        try:
            with trio.CancelScope(deadline=trio.current_time() + limit) as scope:
                while True:
                    event = conn.next_event()
                    if event is h11.NEED_DATA:
                        with trio.fail_after(HANG):
                            data = await self.stream.receive_some(65536)
                        seen = seen or bool(data)
                        conn.receive_data(data)
                    elif isinstance(event, h11.Response):
                        status = event.status_code
                        headers = [(k.decode(), v.decode("latin-1")) for k, v in event.headers]
                        if any(k == "content-type" and "event-stream" in v for k, v in headers):
                            limit = STREAM_TOTAL
                            scope.deadline = trio.current_time() + limit
                    elif isinstance(event, h11.Data):
                        body += event.data
                        if cut_stream and status == 200 and b"\n\n" in body:
                            return Reply(status, headers, bytes(body), True, cut=True)
                    elif isinstance(event, h11.EndOfMessage):
                        self.rest = conn.trailing_data[0]
                        close = conn.their_state is not h11.DONE
                        return Reply(status, headers, bytes(body), close)
                    elif isinstance(event, h11.ConnectionClosed):
                        raise NoAnswer("the server closed the connection without answering")
        except h11.RemoteProtocolError as exc:
            if not seen:
                raise NoAnswer("the server closed the connection without answering") from None
            raise BadResponse(f"{exc} (status {status}, {bytes(body[:200])!r})") from None
        except (trio.TooSlowError, trio.BrokenResourceError) as exc:
            if isinstance(exc, trio.BrokenResourceError) and not seen:
                raise NoAnswer("the connection was reset without an answer") from None
            what = f"only {status} and {len(body)} body bytes" if status else "nothing"
            raise Hang(f"no whole answer within {HANG:g} s ({what})") from None
        what = f"only {status} and {len(body)} body bytes" if status else "nothing"
        raise Hang(f"no whole answer within {limit:g} s ({what})")


async def exchange(port: int, case: HttpCase) -> Reply | Exception:
    """``case`` alone on a new connection: its answer, or what went wrong."""
    try:
        conn = await Conn.open(port)
    except OSError as exc:
        return exc
    try:
        await conn.send(wire(case))
        return await conn.reply(case.method, cut_stream=case.abort_stream)
    except (NoAnswer, Hang, BadResponse) as exc:
        return exc
    finally:
        await conn.aclose()


# ---- what every HTTP answer must be ---------------------------------------------------------


def envelope(reply: Reply) -> tuple[dict[str, object] | None, str | None]:
    """The ``error`` object of an error answer, or why it is not the JSON envelope."""
    ctype = (reply.header("content-type") or "").split(";")[0].strip().lower()
    if ctype != "application/json":
        return None, f"error answer with Content-Type {reply.header('content-type')!r}: {reply}"
    try:
        body = json.loads(reply.body)
    except ValueError:
        return None, f"error answer is not JSON: {reply}"
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or set(err) < ENVELOPE_KEYS:
        return None, f"not the envelope {{error: {{message, type, param, code}}}}: {reply}"
    if not (isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)):
        return None, f"envelope without a message or type: {reply}"
    if not all(err[k] is None or isinstance(err[k], str) for k in ("param", "code")):
        return None, f"envelope param/code not string-or-null: {reply}"
    if len(reply.body) > MAX_ERROR_BYTES:
        return None, f"error answer of {len(reply.body)} bytes: input echoed unclipped: {reply}"
    return err, None


def sse_datas(reply: Reply) -> list[bytes]:
    """The ``data:`` payloads of a stream's complete events."""
    pieces = reply.body.replace(b"\r\n", b"\n").split(b"\n\n")
    events = pieces[:-1] if reply.cut else pieces
    return [line[5:].strip() for ev in events for line in ev.split(b"\n") if line[:5] == b"data:"]


def sse_problems(reply: Reply) -> list[tuple[str, str]]:
    datas = sse_datas(reply)
    if not datas:
        return [("stream", f"a 200 stream without events: {reply}")]
    out: list[tuple[str, str]] = []
    for i, data in enumerate(datas):
        if data == b"[DONE]":
            if i != len(datas) - 1:
                out.append(("stream", f"events after data: [DONE]: {reply}"))
            continue
        try:
            obj = json.loads(data)
        except ValueError:
            out.append(("stream", f"event {i} is not JSON: {data[:200]!r}"))
            continue
        if isinstance(obj, dict) and "error" in obj:
            when = "as its first event (committed before the first token)" if i == 0 else "later"
            out.append(("stream", f"a 200 stream failed {when}: {data[:300]!r}"))
    if not reply.cut and datas[-1] != b"[DONE]":
        out.append(("stream", f"the stream does not end with data: [DONE]: {reply.body[-200:]!r}"))
    return out


def finished(reply: Reply) -> bool:
    """Did a stream carry a ``finish_reason``?"""
    for data in sse_datas(reply):
        if data != b"[DONE]":
            chunk = json.loads(data)
            if any(c.get("finish_reason") for c in chunk.get("choices") or []):
                return True
    return False


def problems(case: HttpCase, reply: Reply) -> list[tuple[str, str]]:
    """Every rule ``reply`` breaks, as (class, detail)."""
    s, head = reply.status, case.method == "HEAD"
    if s >= 500:
        return [("5xx", str(reply))]
    out: list[tuple[str, str]] = []
    if 300 <= s < 400:
        out.append(("redirect", f"{reply} Location: {reply.header('location')}"))
    err = None
    if s >= 300 and not head:
        err, why = envelope(reply)
        if why:
            out.append(("not-envelope", why))
    e = case.expect
    if e is not None:
        if e.status is not None and s != e.status:
            out.append(("wrong-answer", f"expected {e.status} {e.code or ''}, got {reply}"))
        elif err is not None and e.code is not None and err["code"] != e.code:
            out.append(("wrong-answer", f"expected code {e.code}, got {reply}"))
        elif err is not None and e.check_param and err["param"] != e.param:
            out.append(("wrong-answer", f"expected param {e.param!r}, got {reply}"))
        if e.allow and s == 405 and not reply.header("allow"):
            out.append(("wrong-answer", f"405 without an Allow header: {reply}"))
        if e.close and not reply.close:
            out.append(("wrong-answer", f"expected Connection: close with {reply}"))
    if 200 <= s < 300 and not head:
        if "event-stream" in (reply.header("content-type") or ""):
            out += sse_problems(reply)
        elif reply.body and case.method != "OPTIONS":
            try:
                json.loads(reply.body)
            except ValueError:
                out.append(("not-json", f"a 2xx answer that is not JSON: {reply}"))
    return out


# ---- WebSocket ------------------------------------------------------------------------------

Report = Callable[[str, str, str], None]  # (class, where, detail)


class WsSession:
    """One socket: :meth:`read_all` files every message by id (and checks its shape); the
    driver waits on predicates with :meth:`wait`."""

    def __init__(self, ws: WebSocketConnection, report: Report) -> None:
        self.ws = ws
        self.report = report
        self.by_id: dict[str | None, list[dict[str, object]]] = defaultdict(list)
        self.closed: str | None = None
        self.last = "(nothing sent yet)"  # what the last message sent was, for reports
        self._changed = trio.Event()

    async def read_all(self) -> None:
        try:
            while True:
                self._file(await self.ws.get_message())
                self._changed.set()
                self._changed = trio.Event()
        except ConnectionClosed as exc:
            self.closed = f"{exc.reason.code} {exc.reason.reason}"
            self._changed.set()

    def _file(self, raw: str | bytes) -> None:
        try:
            msg = json.loads(raw)
        except ValueError:
            msg = None
        kinds = ("chunk", "done", "error")
        if not isinstance(msg, dict) or "id" not in msg or msg.get("type") not in kinds:
            self.report("ws-bad-message", self.last, f"the server sent {str(raw)[:300]!r}")
            return
        if msg["type"] == "error":
            err = msg.get("error")
            if not isinstance(err, dict) or set(err) < ENVELOPE_KEYS:
                self.report("not-envelope", self.last, f"WebSocket error {msg}")
            elif err["type"] in ("server_error", "timeout_error"):
                self.report("5xx", self.last, f"WebSocket error {msg}")
        self.by_id[msg["id"] if isinstance(msg["id"], str) else None].append(msg)

    async def wait(self, predicate: Callable[[], bool], within: float = HANG) -> bool:
        with trio.move_on_after(within):
            while not predicate() and self.closed is None:
                await self._changed.wait()
        return predicate()

    def ends(self, rid: str | None) -> list[dict[str, object]]:
        return [m for m in self.by_id[rid] if m["type"] != "chunk"]

    def end(self, rid: str | None) -> dict[str, object] | None:
        return next(iter(self.ends(rid)), None)

    def chunks(self, rid: str) -> int:
        return sum(m["type"] == "chunk" for m in self.by_id[rid])


def ws_problems(case: WsCase, end: dict[str, object], chunks: int) -> list[tuple[str, str]]:
    """Every rule the end of ``case``'s request breaks (after ``chunks`` chunks)."""
    out: list[tuple[str, str]] = []
    err = end.get("error") if end["type"] == "error" else None
    code = err.get("code") if isinstance(err, dict) else None
    if case.reply == "done" and end["type"] != "done":
        out.append(("wrong-answer", f"expected chunks then done, got {end}"))
    if case.reply == "error" and end["type"] != "error":
        out.append(("wrong-answer", f"expected an error, got {end}"))
    if end["type"] == "done" and not chunks:
        out.append(("stream", "done without any chunk"))
    if err is not None and chunks and code != "cancelled":
        out.append(("stream", f"an error after {chunks} chunks (failed mid-stream): {end}"))
    if isinstance(err, dict) and case.expect is not None:
        if case.expect.code is not None and code != case.expect.code:
            out.append(("wrong-answer", f"expected code {case.expect.code}, got {end}"))
        elif case.expect.check_param and err.get("param") != case.expect.param:
            out.append(("wrong-answer", f"expected param {case.expect.param!r}, got {end}"))
    return out


class FrameReader:
    """Server frames (unmasked) off a raw socket; the caller bounds the time."""

    def __init__(self, stream: trio.SocketStream, buf: bytes) -> None:
        self.stream = stream
        self.buf = buf

    async def _need(self, n: int) -> bool:
        while len(self.buf) < n:
            data = await self.stream.receive_some(65536)
            if not data:
                return False
            self.buf += data
        return True

    async def frame(self) -> tuple[int, bytes] | None:
        """``(opcode, payload)``, or ``None`` at EOF."""
        if not await self._need(2):
            return None
        n, at = self.buf[1] & 0x7F, 2
        if n >= 126:
            width = 2 if n == 126 else 8
            if not await self._need(2 + width):
                return None
            n, at = int.from_bytes(self.buf[2 : 2 + width], "big"), 2 + width
        if not await self._need(at + n):
            return None
        opcode, payload = self.buf[0] & 0x0F, self.buf[at : at + n]
        self.buf = self.buf[at + n :]
        return opcode, payload
