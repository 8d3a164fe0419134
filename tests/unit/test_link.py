"""The federation link over in-memory transports: handshake driving and its deadline, rpc,
raft and telemetry topics, heartbeats and liveness, typed closes, statistics.

Time is trio's autojump mock clock (memory streams do no real I/O), so deadlines of seconds
cost nothing. Helpers here are shared with ``test_link_data.py``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import cbor2
import pytest
import trio
import trio.testing

from skulk.federation import (
    ClientHandshake,
    ClusterSecret,
    Established,
    HandshakeFailed,
    Link,
    LinkBusy,
    LinkCloseReason,
    LinkConfig,
    PeerUnreachable,
    RefusalReason,
    ReplayCache,
    RpcFailed,
    RpcTimeout,
    ServerHandshake,
    StreamTransport,
    TransportClosed,
    Waiting,
    memory_transport_pair,
    run_link,
)
from skulk.federation._linkbase import LinkState
from skulk.federation._linkopen import open_link
from skulk.federation._linkrpc import RpcHandler
from skulk.federation._machine import FROM_SERVER
from skulk.federation._transport import MessageTransport
from skulk.wire import Codec
from skulk.wire.federation import PROTOCOL_VERSION, ServerChallenge
from skulk.wire.link import (
    DataChunk,
    LinkFrame,
    Ping,
    Pong,
    RaftMessage,
    RpcRequest,
    decode_data_chunk,
    encode_data_chunk,
    is_data_frame,
)
from skulk.wire.telemetry import TelemetryDigest
from tests._doubles import OTHER_SECRET, SECRET, counter_rng

CONFIG = LinkConfig(
    max_frame_size=64 * 1024,
    handshake_timeout=2.0,
    heartbeat_interval=0.5,
    liveness_timeout=3.0,
    close_timeout=0.5,
)
CODEC: Codec[LinkFrame] = Codec(LinkFrame, max_frame_size=CONFIG.max_frame_size)


def client_handshake(secret: ClusterSecret = SECRET, node_id: str = "node-a") -> ClientHandshake:
    return ClientHandshake(secret, node_id, rng=counter_rng(f"c/{node_id}"))


def server_handshake(secret: ClusterSecret = SECRET, node_id: str = "node-b") -> ServerHandshake:
    return ServerHandshake(
        secret,
        node_id,
        replay_cache=ReplayCache(),
        now=trio.current_time(),
        rng=counter_rng(f"s/{node_id}"),
    )


async def start_link(
    nursery: trio.Nursery,
    transport: MessageTransport,
    handshake: ClientHandshake | ServerHandshake,
    config: LinkConfig = CONFIG,
    handler: RpcHandler | None = None,
) -> Link:
    link: Link = await nursery.start(
        functools.partial(run_link, config=config, rpc_handler=handler), transport, handshake
    )
    return link


@asynccontextmanager
async def link_pair(
    *,
    config: LinkConfig = CONFIG,
    handler_a: RpcHandler | None = None,
    handler_b: RpcHandler | None = None,
    lockstep: bool = True,
    wrap: Callable[[StreamTransport], MessageTransport] = lambda t: t,
) -> AsyncIterator[tuple[Link, Link]]:
    """Two established links: ``a`` dialed (node-a), ``b`` accepted (node-b)."""
    ta, tb = memory_transport_pair(max_message_size=config.max_frame_size, lockstep=lockstep)
    links: dict[str, Link] = {}
    async with trio.open_nursery() as nursery:

        async def side(
            name: str,
            t: MessageTransport,
            hs: ClientHandshake | ServerHandshake,
            handler: RpcHandler | None,
        ) -> None:
            links[name] = await start_link(nursery, t, hs, config, handler)

        async with trio.open_nursery() as starting:
            starting.start_soon(side, "a", wrap(ta), client_handshake(), handler_a)
            starting.start_soon(side, "b", wrap(tb), server_handshake(), handler_b)
        yield links["a"], links["b"]
        links["a"].close()
        links["b"].close()


@attrs.define
class RawPeer:
    """The far end of a link under test, speaking raw bytes after a real handshake; a
    background task reads everything the link sends."""

    transport: StreamTransport
    received: list[bytes] = attrs.Factory(list)
    closed: TransportClosed | None = None
    done: trio.Event = attrs.Factory(trio.Event)

    async def drain(self) -> None:
        try:
            while True:
                self.received.append(await self.transport.get_message())
        except TransportClosed as exc:
            self.closed = exc
        finally:
            self.done.set()

    def frames(self) -> list[LinkFrame | DataChunk]:
        return [
            decode_data_chunk(m) if is_data_frame(m) else CODEC.decode(m) for m in self.received
        ]

    async def send(self, frame: LinkFrame | DataChunk) -> None:
        if isinstance(frame, DataChunk):  # a binary data frame, not CBOR
            message = encode_data_chunk(frame.stream_id, frame.seq, frame.body, frame.end)
        else:
            message = CODEC.encode(frame)
        await self.transport.send_message(message)

    async def wait_closed(self) -> TransportClosed:
        await self.done.wait()
        assert self.closed is not None
        return self.closed


async def handshake_by_hand(transport: MessageTransport, secret: ClusterSecret = SECRET) -> None:
    hs = client_handshake(secret, "raw-peer")
    await transport.send_message(hs.initial_bytes())
    while isinstance(hs.state, Waiting):
        for out in hs.receive_bytes(await transport.get_message()):
            await transport.send_message(out)
    assert isinstance(hs.state, Established)


@asynccontextmanager
async def raw_peer_and_link(
    config: LinkConfig = CONFIG, handler: RpcHandler | None = None
) -> AsyncIterator[tuple[RawPeer, Link]]:
    """A link (server side, node-b) whose peer is a :class:`RawPeer` (already authenticated)."""
    raw_t, link_t = memory_transport_pair(max_message_size=config.max_frame_size, lockstep=False)
    links: list[Link] = []
    async with trio.open_nursery() as nursery:

        async def server() -> None:
            links.append(await start_link(nursery, link_t, server_handshake(), config, handler))

        async with trio.open_nursery() as both:
            both.start_soon(handshake_by_hand, raw_t)
            both.start_soon(server)
        link = links[0]
        peer = RawPeer(raw_t)
        nursery.start_soon(peer.drain)
        yield peer, link
        link.close()


async def wait_for(predicate: Callable[[], bool], limit: float = 30.0) -> None:
    """Poll (in mock time) until ``predicate()`` holds, failing after ``limit`` seconds."""
    with trio.fail_after(limit):
        while not predicate():  # noqa: ASYNC110 - polling with a deadline, on purpose
            await trio.sleep(0.01)


# ---- handshake --------------------------------------------------------------------------------


async def test_handshake_establishes_both_sides(autojump_clock: trio.testing.MockClock) -> None:
    async with link_pair() as (a, b):
        assert a.peer_id == "node-b"
        assert b.peer_id == "node-a"
        assert a.state is LinkState.OPEN and b.state is LinkState.OPEN


async def test_wrong_secret_refuses_both_sides_with_the_close_code(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    ta, tb = memory_transport_pair(max_message_size=CONFIG.max_frame_size)
    failures: dict[str, HandshakeFailed] = {}

    async def side(name: str, t: MessageTransport, hs: ClientHandshake | ServerHandshake) -> None:
        async with trio.open_nursery() as nursery:
            with pytest.raises(HandshakeFailed) as info:
                await start_link(nursery, t, hs)
            failures[name] = info.value

    caplog.set_level(logging.WARNING, logger="skulk.federation.link")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(side, "client", ta, client_handshake(OTHER_SECRET))
        nursery.start_soon(side, "server", tb, server_handshake(SECRET))
    client, server = failures["client"].refusal, failures["server"].refusal
    # The two secrets give different cluster ids: the server refuses first, the client learns
    # it from the close code.
    assert client is not None and server is not None
    assert server.reason is RefusalReason.WRONG_CLUSTER and not server.by_peer
    assert client.reason is RefusalReason.WRONG_CLUSTER and client.by_peer
    assert client.close_code == server.close_code == 4006
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert sum("refused by the peer" in line for line in lines) == 1


async def test_wrong_proof_is_refused_as_wrong_secret(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A server that names our cluster but cannot prove the secret: the client closes 4001."""
    ta, tb = memory_transport_pair(max_message_size=CONFIG.max_frame_size, lockstep=False)
    peer = RawPeer(tb)

    async def impostor() -> None:
        await tb.get_message()  # the hello
        challenge = ServerChallenge(
            PROTOCOL_VERSION, SECRET.cluster_id, "node-b", bytes(32), proof=bytes(32)
        )
        await tb.send_message(FROM_SERVER.encode(challenge))
        await peer.drain()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(impostor)
        with pytest.raises(HandshakeFailed) as info:
            await start_link(nursery, ta, client_handshake())
        assert info.value.refusal is not None
        assert info.value.refusal.reason is RefusalReason.WRONG_SECRET
        closed = await peer.wait_closed()
    assert (closed.code, closed.by_peer) == (4001, True)
    assert closed.reason.startswith("wrong_secret")


async def test_silent_unauthenticated_peer_is_closed_at_the_handshake_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    silent, link_t = memory_transport_pair(max_message_size=CONFIG.max_frame_size, lockstep=False)
    peer = RawPeer(silent)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.drain)
        start = trio.current_time()
        with pytest.raises(HandshakeFailed) as info:
            await start_link(nursery, link_t, server_handshake())
        assert trio.current_time() - start == pytest.approx(CONFIG.handshake_timeout)
        assert info.value.refusal is not None
        assert info.value.refusal.reason is RefusalReason.HANDSHAKE_TIMEOUT
        closed = await peer.wait_closed()
    assert closed.code == 4007 and closed.by_peer
    assert peer.received == []


async def test_link_frames_before_the_handshake_ends_are_never_processed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A client that sends an rpc request instead of its proof: refused as malformed (4005),
    and the handler never runs."""
    called: list[str] = []

    async def handler(method: str, body: bytes) -> bytes:
        called.append(method)
        return b""

    raw_t, link_t = memory_transport_pair(max_message_size=CONFIG.max_frame_size, lockstep=False)
    peer = RawPeer(raw_t)
    async with trio.open_nursery() as nursery:

        async def early_frames() -> None:
            await raw_t.send_message(client_handshake().initial_bytes())
            await raw_t.send_message(CODEC.encode(RpcRequest(0, "sneaky", b"", 1000)))
            await peer.drain()

        nursery.start_soon(early_frames)
        with pytest.raises(HandshakeFailed) as info:
            await start_link(nursery, link_t, server_handshake(), handler=handler)
        assert info.value.refusal is not None
        assert info.value.refusal.reason is RefusalReason.MALFORMED
        assert (await peer.wait_closed()).code == 4005
    assert called == []


# ---- rpc --------------------------------------------------------------------------------------


async def echo(method: str, body: bytes) -> bytes:
    if method == "fail":
        raise RpcFailed("model_not_found", "no such model")
    if method == "crash":
        raise ValueError("boom")
    if method == "hang":
        await trio.sleep_forever()
    return method.encode() + b":" + body


async def test_rpc_round_trip_both_ways(autojump_clock: trio.testing.MockClock) -> None:
    async with link_pair(handler_a=echo, handler_b=echo) as (a, b):
        assert await a.call("hello", b"x", timeout=5) == b"hello:x"
        assert await b.call("back", b"y", timeout=5) == b"back:y"
        async with trio.open_nursery() as nursery:
            for i in range(20):
                nursery.start_soon(a.call, "many", str(i).encode(), 5)


async def test_rpc_errors_are_typed(autojump_clock: trio.testing.MockClock) -> None:
    async with link_pair(handler_b=echo) as (a, b):
        with pytest.raises(RpcFailed) as info:
            await a.call("fail", b"", timeout=5)
        assert (info.value.reason, info.value.message) == ("model_not_found", "no such model")
        with pytest.raises(RpcFailed) as info:
            await a.call("crash", b"", timeout=5)
        assert info.value.reason == "handler_failed"
        with pytest.raises(RpcFailed) as info:
            await b.call("anything", b"", timeout=5)  # node-a has no handler
        assert info.value.reason == "no_handler"
        assert a.state is LinkState.OPEN


async def test_rpc_timeout_and_the_handler_gets_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cancelled = trio.Event()

    async def handler(method: str, body: bytes) -> bytes:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()
        raise AssertionError("unreachable")

    async with link_pair(handler_b=handler) as (a, _):
        start = trio.current_time()
        with pytest.raises(RpcTimeout):
            await a.call("slow", b"", timeout=1.5)
        assert trio.current_time() - start == pytest.approx(1.5)
        with trio.fail_after(1):
            await cancelled.wait()  # the peer applied the caller's deadline to its handler
        assert a.statistics().pending_calls == 0
        assert a.state is LinkState.OPEN


async def test_pending_calls_fail_at_once_when_the_transport_dies(
    autojump_clock: trio.testing.MockClock,
) -> None:
    raw_t, link_t = memory_transport_pair(max_message_size=CONFIG.max_frame_size, lockstep=False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(handshake_by_hand, raw_t)
        link = await start_link(nursery, link_t, server_handshake())
        errors: list[BaseException] = []

        async def caller() -> None:
            try:
                await link.call("never-answered", b"", timeout=100)
            except PeerUnreachable as exc:
                errors.append(exc)

        async with trio.open_nursery() as callers:
            for _ in range(3):
                callers.start_soon(caller)
            await wait_for(lambda: link.statistics().pending_calls == 3)
            start = trio.current_time()
            await raw_t._stream.aclose()  # the connection drops, no close frame
        assert trio.current_time() - start < 0.1
        assert len(errors) == 3
        closed = await link.wait_closed()
        assert closed.reason is LinkCloseReason.CONNECTION_LOST and closed.by_peer
        with pytest.raises(PeerUnreachable):
            await link.call("after", b"", timeout=1)
        with pytest.raises(PeerUnreachable):
            link.send_raft_nowait(b"")


async def test_busy_when_too_many_calls_are_handled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = attrs.evolve(CONFIG, max_concurrent_rpcs=1)
    async with link_pair(config=config, handler_b=echo) as (a, b):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(a.call, "hang", b"", timeout=10.0))
            await wait_for(lambda: b.statistics().rpcs_in_flight == 1)
            with pytest.raises(RpcFailed) as info:
                await a.call("x", b"", timeout=5)
            assert info.value.reason == "busy"
            nursery.cancel_scope.cancel()


async def test_rpc_call_id_reused_in_flight_closes_the_link(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with raw_peer_and_link(handler=echo) as (peer, link):
        await peer.send(RpcRequest(7, "hang", b"", 10_000))
        await peer.send(RpcRequest(7, "hang", b"", 10_000))
        closed = await link.wait_closed()
        assert closed.reason is LinkCloseReason.PROTOCOL_VIOLATION
        assert (await peer.wait_closed()).code == 4102


# ---- raft, telemetry, control queue -------------------------------------------------------------


async def test_raft_and_telemetry_are_delivered(autojump_clock: trio.testing.MockClock) -> None:
    async with link_pair() as (a, b):
        a.send_raft_nowait(b"append-entries")
        digest = TelemetryDigest(versions=(), forgotten=())
        a.send_telemetry_nowait(digest)
        with trio.fail_after(5):
            assert await b.raft_inbox.receive() == b"append-entries"
            assert await b.telemetry_inbox.receive() == digest


async def test_full_inbox_drops_and_full_control_queue_is_busy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    config = attrs.evolve(CONFIG, raft_inbox=2, control_queue=4)
    async with link_pair(config=config) as (a, b):
        for i in range(4):
            a.send_raft_nowait(bytes([i]))  # no checkpoint between: the queue fills up
        with pytest.raises(LinkBusy):
            a.send_raft_nowait(b"one too many")
        await wait_for(lambda: b.statistics().dropped_in == 2)
        assert b.statistics().raft_queued == 2
        assert [await b.raft_inbox.receive() for _ in range(2)] == [b"\x00", b"\x01"]


async def test_a_raft_handler_takes_queued_bodies_first_then_each_new_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with link_pair() as (a, b):
        a.send_raft_nowait(b"\x00")
        a.send_raft_nowait(b"\x01")
        await wait_for(lambda: b.statistics().raft_queued == 2)
        got: list[bytes] = []
        b.receive_raft_with(got.append)
        assert got == [b"\x00", b"\x01"]  # the queued ones, at once and in order
        a.send_raft_nowait(b"\x02")
        await wait_for(lambda: len(got) == 3)
        assert got[2] == b"\x02" and b.statistics().raft_queued == 0


async def test_wait_sent_waits_for_the_frames_queued_before_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with link_pair(wrap=lambda t: SlowTransport(t, 0.2)) as (a, _b):
        sent = a.statistics().frames_out
        a.send_raft_nowait(b"one")
        a.send_raft_nowait(b"two")
        await a.wait_sent()
        stats = a.statistics()
        assert stats.frames_out >= sent + 2 and stats.control_queued == 0
        started = trio.current_time()
        await a.wait_sent()  # nothing queued since: no wait (a pending ping is not waited for)
        assert trio.current_time() == started


async def test_wait_sent_returns_when_the_link_closes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    wires: list[SlowTransport] = []

    def wire(t: StreamTransport) -> SlowTransport:
        wires.append(SlowTransport(t, 0.0))
        return wires[-1]

    async with link_pair(wrap=wire) as (a, _b):
        for w in wires:
            w.delay = 5.0  # established: from now on the wire is very slow
        a.send_raft_nowait(b"slow")
        a.send_raft_nowait(b"never sent")

        async def close_soon() -> None:
            await trio.sleep(1.0)
            a.close()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(close_soon)
            with trio.fail_after(2.0):
                await a.wait_sent()
        assert a.closed is not None


# ---- heartbeats, liveness, closing ------------------------------------------------------------


@attrs.define
class SlowTransport:
    """Delays every outgoing message by ``delay`` seconds (a long wire)."""

    inner: StreamTransport
    delay: float

    @property
    def remote(self) -> str:
        return self.inner.remote

    async def send_message(self, data: bytes) -> None:
        await trio.sleep(self.delay)
        await self.inner.send_message(data)

    async def get_message(self) -> bytes:
        return await self.inner.get_message()

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        await self.inner.aclose(code, reason)


async def test_ping_measures_rtt(autojump_clock: trio.testing.MockClock) -> None:
    async with link_pair(wrap=lambda t: SlowTransport(t, 0.05)) as (a, b):
        assert a.rtt is None or a.rtt >= 0.1
        await wait_for(lambda: a.rtt is not None and b.rtt is not None)
        assert a.rtt == pytest.approx(0.1, abs=1e-6)
        assert b.statistics().rtt_ms == pytest.approx(100.0, abs=1e-3)


async def test_liveness_timeout_closes_a_silent_link(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The peer authenticated, then never sends anything again (it still reads)."""
    async with raw_peer_and_link() as (peer, link):
        start = trio.current_time()
        closed = await link.wait_closed()
        assert closed.reason is LinkCloseReason.LIVENESS_TIMEOUT
        assert trio.current_time() - start == pytest.approx(CONFIG.liveness_timeout, abs=0.01)
        assert (await peer.wait_closed()).code == 4104
        assert any(isinstance(f, Ping) for f in peer.frames())  # it was pinged meanwhile
        assert link.statistics().last_error is not None


async def test_a_live_peer_keeps_the_link_open(autojump_clock: trio.testing.MockClock) -> None:
    async with link_pair() as (a, b):
        await trio.sleep(10 * CONFIG.liveness_timeout)
        assert a.state is LinkState.OPEN and b.state is LinkState.OPEN


async def test_clean_close_is_seen_by_the_peer(autojump_clock: trio.testing.MockClock) -> None:
    async with link_pair() as (a, b):
        a.close()
        mine, theirs = await a.wait_closed(), await b.wait_closed()
    assert (mine.reason, mine.code, mine.by_peer) == (LinkCloseReason.CLOSED, 1000, False)
    assert (theirs.reason, theirs.code, theirs.by_peer) == (LinkCloseReason.CLOSED, 1000, True)
    with pytest.raises(trio.EndOfChannel):
        await b.raft_inbox.receive()
    assert a.statistics().last_error is None


async def test_garbage_after_the_handshake_closes_with_malformed_frame(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with raw_peer_and_link() as (peer, link):
        await peer.transport.send_message(b"\xa1\x61t\x64Nope")  # {"t": "Nope"}
        closed = await link.wait_closed()
        assert closed.reason is LinkCloseReason.MALFORMED_FRAME
        got = await peer.wait_closed()
        assert got.code == 4100 and got.reason.startswith("malformed_frame")


async def test_oversized_frame_closes_with_frame_too_large(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with raw_peer_and_link() as (peer, link):
        await peer.transport._stream.send_all((2**31).to_bytes(4, "big"))  # no body follows
        closed = await link.wait_closed()
        assert closed.reason is LinkCloseReason.FRAME_TOO_LARGE
        assert (await peer.wait_closed()).code == 4101


async def test_statistics_count_frames_and_bytes(autojump_clock: trio.testing.MockClock) -> None:
    async with link_pair(handler_b=echo) as (a, b):
        await a.call("m", b"12345", timeout=5)
        sa, sb = a.statistics(), b.statistics()
        assert (sa.peer_id, sb.peer_id) == ("node-b", "node-a")
        assert sa.frames_out >= 1 and sb.frames_in >= 1 and sb.frames_out >= 1
        assert sa.bytes_out > 0 and sb.bytes_in > 0
        assert sa.pending_calls == 0 and sb.rpcs_in_flight == 0
        assert sa.state is LinkState.OPEN and sa.closed is None
    assert a.statistics().state is LinkState.CLOSED


async def test_pong_for_a_ping_never_sent_is_ignored(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with raw_peer_and_link() as (peer, link):
        await peer.send(Pong(seq=999, sent_ns=1))
        await peer.send(RaftMessage(b"still fine"))
        with trio.fail_after(1):
            assert await link.raft_inbox.receive() == b"still fine"
        assert link.rtt is None


async def test_close_details_quote_peer_text_printably(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with raw_peer_and_link() as (peer, link):
        await peer.transport.send_message(
            cbor2.dumps({"t": "Ping", "seq": 1, "sent_ns": 2, "evil\n\x07key": 0})
        )
        closed = await link.wait_closed()
        assert closed.reason is LinkCloseReason.MALFORMED_FRAME
        assert closed.detail.isprintable() and "\\n" in closed.detail


async def test_open_link_runs_for_the_block_and_lets_its_errors_through(
    autojump_clock: trio.testing.MockClock,
) -> None:
    ta, tb = memory_transport_pair(max_message_size=CONFIG.max_frame_size)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            functools.partial(run_link, config=CONFIG, rpc_handler=echo), tb, server_handshake()
        )
        with pytest.raises(KeyError):
            async with open_link(ta, client_handshake(), config=CONFIG) as link:
                assert await link.call("via", b"open_link", timeout=5) == b"via:open_link"
                raise KeyError("from the block")
        assert link.state is LinkState.CLOSED
        assert (await link.wait_closed()).reason is LinkCloseReason.CLOSED


async def test_cancelling_during_the_handshake_closes_the_transport(
    autojump_clock: trio.testing.MockClock,
) -> None:
    raw_t, link_t = memory_transport_pair(max_message_size=CONFIG.max_frame_size, lockstep=False)
    peer = RawPeer(raw_t)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(peer.drain)
        with trio.move_on_after(0.5):
            await start_link(nursery, link_t, server_handshake())
        closed = await peer.wait_closed()
    assert (closed.code, closed.by_peer) == (1001, True)
