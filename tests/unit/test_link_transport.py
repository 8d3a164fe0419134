"""Message transports: length-prefixed messages over a Trio stream, and trio-websocket (run
in-process over memory streams), with typed closes and limits; and a whole link over a
WebSocket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
import trio_websocket

from skulk.federation import (
    LinkCloseReason,
    StreamTransport,
    TransportClosed,
    WebSocketTransport,
    memory_transport_pair,
)
from skulk.federation._transport import MessageTooLarge, TransportViolation

from .test_link import client_handshake, echo, server_handshake, start_link


async def test_the_in_memory_streams_are_proper_trio_streams() -> None:
    """What :func:`memory_transport_pair` runs over passes trio's own conformance check."""

    async def lockstep() -> tuple[trio.abc.Stream, trio.abc.Stream]:
        return trio.testing.lockstep_stream_pair()

    async def buffered() -> tuple[trio.abc.Stream, trio.abc.Stream]:
        return trio.testing.memory_stream_pair()

    await trio.testing.check_two_way_stream(lockstep, lockstep)
    await trio.testing.check_two_way_stream(buffered, None)


@pytest.mark.parametrize("lockstep", [True, False])
async def test_stream_transport_carries_whole_messages(lockstep: bool) -> None:
    a, b = memory_transport_pair(max_message_size=100_000, lockstep=lockstep)
    messages = [b"", b"x", bytes(range(256)) * 300, b"last"]
    async with trio.open_nursery() as nursery:

        async def send_all() -> None:
            for m in messages:
                await a.send_message(m)

        nursery.start_soon(send_all)
        assert [await b.get_message() for _ in messages] == messages


async def test_stream_transport_close_carries_code_and_reason() -> None:
    a, b = memory_transport_pair(max_message_size=1000, lockstep=False)
    await a.send_message(b"before")
    await a.aclose(4103, "data_gap: stream 3")
    assert await b.get_message() == b"before"
    with pytest.raises(TransportClosed) as info:
        await b.get_message()
    assert (info.value.code, info.value.reason, info.value.by_peer) == (
        4103,
        "data_gap: stream 3",
        True,
    )
    with pytest.raises(TransportClosed) as info:
        await a.send_message(b"after")
    assert not info.value.by_peer
    await a.aclose()  # again: nothing happens
    await b.aclose()


async def test_stream_ending_without_a_close_is_abnormal() -> None:
    a_stream, b_stream = trio.testing.memory_stream_pair()
    b = StreamTransport(b_stream, max_message_size=1000)
    await a_stream.send_all(b"\x00\x00\x00\x05ab")  # a partial message, then the end
    await a_stream.aclose()
    with pytest.raises(TransportClosed) as info:
        await b.get_message()
    assert (info.value.code, info.value.by_peer) == (1006, True)


async def test_stream_transport_limit_is_checked_before_the_body() -> None:
    a_stream, b_stream = trio.testing.memory_stream_pair()
    b = StreamTransport(b_stream, max_message_size=1000)
    await a_stream.send_all((1001).to_bytes(4, "big"))  # no body at all: no need to wait for it
    with trio.fail_after(1), pytest.raises(MessageTooLarge) as info:
        await b.get_message()
    assert (info.value.size, info.value.limit) == (1001, 1000)
    with pytest.raises(MessageTooLarge):
        await b.send_message(bytes(1001))
    with pytest.raises(ValueError):
        StreamTransport(b_stream, max_message_size=2**32 - 1)


@asynccontextmanager
async def websocket_pair(
    max_message_size: int = 65536,
) -> AsyncIterator[tuple[WebSocketTransport, WebSocketTransport]]:
    """A trio-websocket client and server connected over an in-memory stream pair."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        connections: dict[str, trio_websocket.WebSocketConnection] = {}

        async def server() -> None:
            request = await trio_websocket.wrap_server_stream(
                nursery, server_stream, max_message_size=max_message_size
            )
            connections["server"] = await request.accept()

        async def client() -> None:
            connections["client"] = await trio_websocket.wrap_client_stream(
                nursery,
                client_stream,  # type: ignore[arg-type]  # any Stream works
                "localhost",
                "/federation",
                max_message_size=max_message_size,
            )

        async with trio.open_nursery() as opening:
            opening.start_soon(server)
            opening.start_soon(client)
        yield (
            WebSocketTransport(connections["client"], remote="ws-server"),
            WebSocketTransport(connections["server"], remote="ws-client"),
        )
        nursery.cancel_scope.cancel()


async def test_websocket_transport_messages_and_close() -> None:
    async with websocket_pair() as (client, server):
        await client.send_message(b"\x00binary")
        assert await server.get_message() == b"\x00binary"
        await server.aclose(4104, "liveness_timeout: nothing received")
        with pytest.raises(TransportClosed) as info:
            await client.get_message()
        assert (info.value.code, info.value.reason, info.value.by_peer) == (
            4104,
            "liveness_timeout: nothing received",
            True,
        )
        with pytest.raises(TransportClosed) as info:
            await server.send_message(b"late")
        assert not info.value.by_peer


async def test_websocket_text_message_is_a_violation() -> None:
    async with websocket_pair() as (client, server):
        await client._ws.send_message("text")
        with pytest.raises(TransportViolation):
            await server.get_message()


async def test_websocket_oversized_message_closes_with_1009() -> None:
    async with websocket_pair(max_message_size=1000) as (client, server):
        await client._ws.send_message(bytes(2000))
        with pytest.raises(TransportClosed) as info:
            await server.get_message()
        assert info.value.code == 1009
        assert LinkCloseReason.from_close_code(1009) is LinkCloseReason.FRAME_TOO_LARGE


async def test_a_link_over_websocket(autojump_clock: trio.testing.MockClock) -> None:
    async with websocket_pair() as (ws_client, ws_server), trio.open_nursery() as nursery:
        links = {}

        async def side(name: str) -> None:
            if name == "a":
                links[name] = await start_link(nursery, ws_client, client_handshake())
            else:
                links[name] = await start_link(nursery, ws_server, server_handshake(), handler=echo)

        async with trio.open_nursery() as starting:
            starting.start_soon(side, "a")
            starting.start_soon(side, "b")
        a, b = links["a"], links["b"]
        assert (a.peer_id, b.peer_id) == ("node-b", "node-a")
        assert await a.call("over", b"ws", timeout=5) == b"over:ws"
        a.close()
        closed = await b.wait_closed()
        assert (closed.reason, closed.code, closed.by_peer) == (LinkCloseReason.CLOSED, 1000, True)
