"""The data topic of a federation link: per-stream order, duplicates, gaps, credit flow control
and backpressure, stopping, and control traffic never starved by saturated data."""

from __future__ import annotations

import time

import attrs
import pytest
import trio
import trio.lowlevel
import trio.testing

from skulk.federation import (
    DataReceiver,
    LinkBusy,
    LinkCloseReason,
    PeerUnreachable,
    StreamStopped,
)
from skulk.wire.link import DATA_INITIAL_CREDIT, DataChunk, DataCredit, DataStop

from .test_link import CONFIG, link_pair, raw_peer_and_link, wait_for


async def collect(receiver: DataReceiver) -> list[bytes]:
    return [chunk async for chunk in receiver]


async def test_chunks_arrive_in_order_and_the_stream_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with link_pair() as (a, b):
        sent = [i.to_bytes(2, "big") for i in range(100)]

        async def produce() -> None:
            stream = a.open_stream()
            for chunk in sent:
                await stream.send(chunk)
            await stream.end()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            receiver = await b.incoming_streams.receive()
            assert await collect(receiver) == sent
        assert a.statistics().streams_out == 0
        assert b.statistics().streams_in == 0


async def test_several_streams_interleave_each_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with link_pair() as (a, b):
        results: dict[str, list[bytes]] = {}  # by producer (stream ids follow open order)

        async def produce(n: int) -> None:
            stream = a.open_stream()
            for i in range(40):
                await stream.send(f"{n}/{i}".encode())
            await stream.end(f"{n}/end".encode())

        async def consume(receiver: DataReceiver) -> None:
            chunks = await collect(receiver)
            results[chunks[0].decode().split("/")[0]] = chunks

        async with trio.open_nursery() as nursery:
            for n in range(5):
                nursery.start_soon(produce, n)
            for _ in range(5):
                nursery.start_soon(consume, await b.incoming_streams.receive())
        for n in range(5):
            assert results[str(n)] == [f"{n}/{i}".encode() for i in range(40)] + [
                f"{n}/end".encode()
            ]


async def test_a_slow_consumer_holds_its_sender_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with link_pair() as (a, b):
        sent = 0

        async def produce() -> None:
            nonlocal sent
            stream = a.open_stream()
            for i in range(100):
                await stream.send(bytes([i]))
                sent += 1

        async with trio.open_nursery() as nursery:
            nursery.start_soon(produce)
            receiver = await b.incoming_streams.receive()
            await trio.sleep(5)  # mock time: everything that can move has moved
            assert sent == DATA_INITIAL_CREDIT  # blocked on credit, not buffered without bound
            assert b.statistics().duplicates_dropped == 0
            got = [await receiver.receive() for _ in range(100)]
        assert got == [bytes([i]) for i in range(100)]
        assert sent == 100


async def test_duplicates_are_dropped(autojump_clock: trio.testing.MockClock) -> None:
    async with raw_peer_and_link() as (peer, link):
        chunks = [
            (0, b"a", False),
            (1, b"b", False),
            (1, b"dup", False),
            (0, b"dup", False),
            (2, b"c", True),
            (3, b"late", False),
        ]
        for seq, body, end in chunks:
            await peer.send(DataChunk(stream_id=0, seq=seq, body=body, end=end))
        receiver = await link.incoming_streams.receive()
        assert await collect(receiver) == [b"a", b"b", b"c"]
        await peer.send(DataChunk(stream_id=0, seq=0, body=b"replayed stream", end=True))
        await wait_for(lambda: link.statistics().duplicates_dropped == 4)
        assert link.statistics().streams_in == 0


@pytest.mark.parametrize(
    ("chunks", "detail"),
    [
        ([(0, 0), (0, 2)], "expected 1"),
        ([(0, 1)], "started at seq 1"),
    ],
)
async def test_a_gap_closes_the_link(
    autojump_clock: trio.testing.MockClock, chunks: list[tuple[int, int]], detail: str
) -> None:
    async with raw_peer_and_link() as (peer, link):
        for stream_id, seq in chunks:
            await peer.send(DataChunk(stream_id=stream_id, seq=seq, body=b"x", end=False))
        closed = await link.wait_closed()
        assert closed.reason is LinkCloseReason.DATA_GAP and detail in closed.detail
        assert (await peer.wait_closed()).code == 4103


async def test_chunks_beyond_the_credit_close_the_link(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with raw_peer_and_link() as (peer, link):
        for seq in range(DATA_INITIAL_CREDIT + 1):
            await peer.send(DataChunk(stream_id=0, seq=seq, body=b"x", end=False))
        closed = await link.wait_closed()
        assert closed.reason is LinkCloseReason.FLOW_CONTROL
        assert (await peer.wait_closed()).code == 4105


async def test_consuming_grants_credit(autojump_clock: trio.testing.MockClock) -> None:
    async with raw_peer_and_link() as (peer, link):
        for seq in range(DATA_INITIAL_CREDIT):
            await peer.send(DataChunk(stream_id=0, seq=seq, body=b"x", end=False))
        receiver = await link.incoming_streams.receive()
        for _ in range(DATA_INITIAL_CREDIT // 2):
            await receiver.receive()
        await wait_for(lambda: any(isinstance(f, DataCredit) for f in peer.frames()))
        credit = next(f for f in peer.frames() if isinstance(f, DataCredit))
        assert credit == DataCredit(
            stream_id=0, limit=DATA_INITIAL_CREDIT // 2 + DATA_INITIAL_CREDIT
        )


async def test_the_receiver_can_stop_a_stream(autojump_clock: trio.testing.MockClock) -> None:
    async with link_pair() as (a, b):
        stream = a.open_stream()
        await stream.send(b"first")
        receiver = await b.incoming_streams.receive()
        assert await receiver.receive() == b"first"
        await receiver.aclose()
        with pytest.raises(StreamStopped), trio.fail_after(5):
            while True:
                await stream.send(b"more")
        assert a.statistics().streams_out == 0 and b.statistics().streams_in == 0


async def test_streams_beyond_the_limit_are_stopped(autojump_clock: trio.testing.MockClock) -> None:
    config = attrs.evolve(CONFIG, max_streams=2)
    async with raw_peer_and_link(config=config) as (peer, link):
        for stream_id in range(3):
            await peer.send(DataChunk(stream_id=stream_id, seq=0, body=b"x", end=False))
        await wait_for(lambda: DataStop(stream_id=2) in peer.frames())
        assert link.statistics().streams_in == 2 and link.statistics().dropped_in == 1
        with pytest.raises(LinkBusy):
            for _ in range(3):
                link.open_stream()


async def test_a_closing_link_ends_streams_after_what_arrived(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with raw_peer_and_link() as (peer, link):
        await peer.send(DataChunk(stream_id=0, seq=0, body=b"kept", end=False))
        receiver = await link.incoming_streams.receive()
        await peer.transport.aclose()
        await link.wait_closed()
        assert await receiver.receive() == b"kept"
        with pytest.raises(PeerUnreachable):
            await receiver.receive()
        with pytest.raises(trio.EndOfChannel):
            await link.incoming_streams.receive()


async def test_control_is_not_starved_by_saturated_data() -> None:
    """Real time, no mock clock: 16 producers keep the data queue full while rpc calls go
    through. Control frames jump the data queue, so between a call and its arrival the peer sees
    at most a few data chunks (not the dozens queued), and each call completes well within the
    bound."""
    config = attrs.evolve(CONFIG, data_queue=64, heartbeat_interval=5.0, liveness_timeout=30.0)
    arrivals: list[int] = []
    chunk = bytes(4096)

    async def handler(method: str, body: bytes) -> bytes:
        arrivals.append(b.statistics().frames_in)
        return b"pong"

    async with link_pair(config=config, handler_b=handler) as (a, b):
        async with trio.open_nursery() as nursery:

            async def produce() -> None:
                stream = a.open_stream()
                while True:
                    await stream.send(chunk)

            async def consume(receiver: DataReceiver) -> None:
                async for _ in receiver:
                    pass

            async def accept() -> None:
                async for receiver in b.incoming_streams:
                    nursery.start_soon(consume, receiver)

            nursery.start_soon(accept)
            for _ in range(16):
                nursery.start_soon(produce)
            await wait_for(lambda: b.statistics().frames_in >= 500, limit=10)
            worst = 0.0
            for _ in range(20):
                while a.statistics().data_queued < config.data_queue // 2:
                    await trio.lowlevel.checkpoint()
                before = b.statistics().frames_in
                start = time.perf_counter()
                with trio.fail_after(5):
                    assert await a.call("ping", b"", timeout=5) == b"pong"
                worst = max(worst, time.perf_counter() - start)
                # frames the peer took in between: at most the chunk in flight, a pong or two,
                # and what its receiver read before the handler task got to run
                assert arrivals[-1] - before <= 6, (before, arrivals[-1])
            nursery.cancel_scope.cancel()
    assert worst < 0.5, f"slowest rpc round trip under data saturation: {worst:.3f} s"


async def test_closing_a_receiver_ends_a_receive_waiting_in_another_task(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with link_pair() as (a, b):
        stream = a.open_stream()
        await stream.send(b"first")
        receiver = await b.incoming_streams.receive()
        assert await receiver.receive() == b"first"
        ended = trio.Event()

        async def wait_for_more() -> None:
            with pytest.raises(trio.EndOfChannel):
                await receiver.receive()  # nothing more is sent: it waits
            ended.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(wait_for_more)
            await trio.testing.wait_all_tasks_blocked()
            await receiver.aclose()
            with trio.fail_after(1):
                await ended.wait()
        await wait_for(lambda: stream._state.stopped)  # the sender was told


async def test_peek_shows_the_next_chunk_without_taking_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with link_pair() as (a, b):
        stream = a.open_stream()
        receiver_task: list[DataReceiver] = []

        async def accept() -> None:
            receiver_task.append(await b.incoming_streams.receive())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(accept)
            await stream.send(b"first")
        receiver = receiver_task[0]
        assert await receiver.peek() == b"first"
        assert await receiver.peek() == b"first"  # still there
        assert await receiver.receive() == b"first"
        peeked: list[bytes] = []

        async def peek_later() -> None:
            peeked.append(await receiver.peek())  # waits for the next chunk

        async with trio.open_nursery() as nursery:
            nursery.start_soon(peek_later)
            await trio.testing.wait_all_tasks_blocked()
            assert peeked == []
            await stream.end(b"last")
        assert peeked == [b"last"]
        assert await collect(receiver) == [b"last"]
        with pytest.raises(trio.EndOfChannel):
            await receiver.peek()


async def test_peek_at_an_empty_end_ends_and_a_closed_link_is_unreachable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with link_pair() as (a, b):
        stream = a.open_stream()
        await stream.end()
        receiver = await b.incoming_streams.receive()
        with pytest.raises(trio.EndOfChannel):
            await receiver.peek()
        with pytest.raises(trio.EndOfChannel):
            await receiver.receive()
        other = a.open_stream()
        await other.send(b"x")
        receiver = await b.incoming_streams.receive()
        assert await receiver.receive() == b"x"
        a.close()
        await b.wait_closed()
        with pytest.raises(PeerUnreachable):
            await receiver.peek()
