"""The data topic of a federation link: per-stream order, duplicates, gaps, credit flow control
and backpressure, stopping, aborting (credit starvation), binary data frames from a hostile
peer, and control traffic never starved by saturated data."""

from __future__ import annotations

import time

import attrs
import cbor2
import pytest
import trio
import trio.lowlevel
import trio.testing

from skulk.federation import (
    DataReceiver,
    LinkBusy,
    LinkCloseReason,
    PeerUnreachable,
    StreamAborted,
    StreamStarved,
    StreamStopped,
)
from skulk.wire.link import (
    DATA_FLAG_END,
    DATA_HEADER,
    DATA_HEADER_SIZE,
    DATA_INITIAL_CREDIT,
    DataAbort,
    DataChunk,
    DataCredit,
    DataStop,
)

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


# ---- credit starvation (issue 23) and aborted streams -------------------------------------------


async def test_a_stream_starved_of_credit_is_aborted_and_its_slot_freed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A peer that takes chunks but never grants credit: the sender's send gives up after
    ``credit_timeout`` (StreamStarved, a StreamStopped), the peer is told why (DataAbort
    ``credit_timeout``), and the stream's slot on the link is free again. Before the deadline
    existed, the send waited for ever and the slot stayed taken until the link closed."""
    config = attrs.evolve(CONFIG, credit_timeout=2.0)
    async with raw_peer_and_link(config=config) as (peer, link):
        stream = link.open_stream()
        for _ in range(DATA_INITIAL_CREDIT):
            await stream.send(b"x")
        started = trio.current_time()
        with trio.fail_after(60), pytest.raises(StreamStarved) as starved:
            await stream.send(b"one too many")
        assert isinstance(starved.value, StreamStopped)
        assert trio.current_time() - started == pytest.approx(2.0)
        assert link.statistics().streams_out == 0
        assert link.closed is None  # the link itself goes on
        await wait_for(lambda: DataAbort(stream_id=0, reason="credit_timeout") in peer.frames())
        chunks = [f for f in peer.frames() if isinstance(f, DataChunk)]
        assert [c.seq for c in chunks] == list(range(DATA_INITIAL_CREDIT))  # the abort after them
        with pytest.raises(StreamStarved):
            await stream.send(b"after the abort")


async def test_credit_in_time_keeps_the_stream(autojump_clock: trio.testing.MockClock) -> None:
    config = attrs.evolve(CONFIG, credit_timeout=2.0)
    async with raw_peer_and_link(config=config) as (peer, link):
        stream = link.open_stream()
        for _ in range(DATA_INITIAL_CREDIT):
            await stream.send(b"x")

        async def grant_late() -> None:
            await trio.sleep(1.5)
            await peer.send(DataCredit(stream_id=0, limit=DATA_INITIAL_CREDIT + 1))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(grant_late)
            await stream.send(b"in time")
        assert link.statistics().streams_out == 1
        assert not any(isinstance(f, DataAbort) for f in peer.frames())


async def test_an_aborted_stream_delivers_what_came_then_says_why(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with raw_peer_and_link() as (peer, link):
        await peer.send(DataChunk(stream_id=0, seq=0, body=b"kept", end=False))
        await peer.send(DataAbort(stream_id=0, reason="credit_timeout"))
        receiver = await link.incoming_streams.receive()
        assert await receiver.receive() == b"kept"
        with pytest.raises(StreamAborted) as aborted:
            await receiver.receive()
        assert aborted.value.reason == "credit_timeout"
        assert isinstance(aborted.value, PeerUnreachable)  # consumers of lost peers handle it
        assert link.statistics().streams_in == 0
        await peer.send(DataChunk(stream_id=0, seq=1, body=b"late", end=False))
        await peer.send(DataAbort(stream_id=9, reason="never_opened"))  # ignored
        await peer.send(DataChunk(stream_id=10, seq=0, body=b"", end=False))
        await peer.send(DataAbort(stream_id=10, reason="\x1b[2J" + "x" * 500))
        hostile = await link.incoming_streams.receive()
        assert await hostile.receive() == b""
        with pytest.raises(StreamAborted) as cleaned:
            await hostile.receive()
        assert cleaned.value.reason == "[2J" + "x" * 60  # printable, at most 64 characters
        await wait_for(lambda: link.statistics().duplicates_dropped == 1)
        assert link.closed is None
        assert not any(isinstance(f, DataStop) for f in peer.frames())  # nothing to stop


async def test_a_sender_can_abort_with_its_own_reason(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with link_pair() as (a, b):
        stream = a.open_stream()
        await stream.send(b"first")
        stream.abort("read_failed")
        assert a.statistics().streams_out == 0
        receiver = await b.incoming_streams.receive()
        assert await receiver.receive() == b"first"
        with pytest.raises(StreamAborted, match="read_failed"):
            await receiver.receive()
        stream.abort("again")  # does nothing once aborted
        with pytest.raises(StreamStopped):
            await stream.send(b"after the abort")


# ---- binary data frames from a hostile peer ----------------------------------------------------


def _data_frame(kind: int, flags: int, stream_id: int, seq: int, body: bytes = b"x") -> bytes:
    return DATA_HEADER.pack(kind, flags, stream_id, seq) + body


@pytest.mark.parametrize(
    ("message", "reason", "code"),
    [
        (b"\x00", LinkCloseReason.MALFORMED_FRAME, 4100),  # the kind byte alone
        (b"\x00" * (DATA_HEADER_SIZE - 1), LinkCloseReason.MALFORMED_FRAME, 4100),  # short
        (_data_frame(0, 0x02, 0, 0), LinkCloseReason.MALFORMED_FRAME, 4100),  # unknown flag
        (_data_frame(0, 0x81, 0, 0), LinkCloseReason.MALFORMED_FRAME, 4100),
        # the CBOR form of a chunk (protocol 3): not a link frame any more
        (
            cbor2.dumps({"t": "DataChunk", "stream_id": 0, "seq": 0, "body": b"x", "end": False}),
            LinkCloseReason.MALFORMED_FRAME,
            4100,
        ),
        (_data_frame(0, 0, 0, 1), LinkCloseReason.DATA_GAP, 4103),  # a stream not from seq 0
        (
            _data_frame(0, 0, 0, 0, b"y" * CONFIG.max_frame_size),  # over the frame limit
            LinkCloseReason.FRAME_TOO_LARGE,
            4101,
        ),
        (
            cbor2.dumps({"t": "DataAbort", "stream_id": 0}),  # no reason
            LinkCloseReason.MALFORMED_FRAME,
            4100,
        ),
    ],
)
async def test_a_bad_binary_frame_closes_the_link_with_its_reason(
    autojump_clock: trio.testing.MockClock, message: bytes, reason: LinkCloseReason, code: int
) -> None:
    async with raw_peer_and_link() as (peer, link):
        if len(message) > CONFIG.max_frame_size:  # the raw side's own limit would refuse it
            peer.transport._limit = len(message)
        await peer.transport.send_message(message)
        closed = await link.wait_closed()
        assert closed.reason is reason
        assert (await peer.wait_closed()).code == code


async def test_an_empty_body_and_the_largest_body_are_fine(
    autojump_clock: trio.testing.MockClock,
) -> None:
    biggest = b"z" * (CONFIG.max_frame_size - DATA_HEADER_SIZE)
    async with raw_peer_and_link() as (peer, link):
        await peer.transport.send_message(_data_frame(0, 0, 0, 0, b""))
        await peer.transport.send_message(_data_frame(0, DATA_FLAG_END, 0, 1, biggest))
        receiver = await link.incoming_streams.receive()
        assert await collect(receiver) == [b"", biggest]
        assert link.closed is None
