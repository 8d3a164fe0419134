"""Requests waiting for one inbound data stream each (:class:`skulk.federation.StreamClaims`),
without a network: fake receivers and a fake link, on Trio's autojump clock (every deadline is
exact and costs no real time)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import cast

import attrs
import pytest
import trio
import trio.testing

from skulk.federation import (
    DataReceiver,
    Link,
    PeerUnreachable,
    StreamClaims,
)
from skulk.wire import Codec
from tests._doubles import BYE, FakeLink, FakeReceiver

HEADER_TIMEOUT = 5.0


@attrs.frozen
class Head:
    request_id: str


@attrs.frozen
class Body:
    data: bytes


CODEC: Codec[Head | Body] = Codec(Head | Body)


@pytest.fixture
def claims() -> StreamClaims[Head]:
    return StreamClaims(CODEC.decode, Head, header_timeout=HEADER_TIMEOUT)


@pytest.fixture
def link() -> Link:
    return cast(Link, FakeLink())


@asynccontextmanager
async def bounded_nursery() -> AsyncIterator[trio.Nursery]:
    """A nursery whose tasks must end within a minute of the autojump clock: a handler left
    waiting for a request fails the test rather than hanging it."""
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            yield nursery


def stream(request_id: str, *chunks: bytes) -> FakeReceiver:
    """A stream whose header names ``request_id``, then ``chunks``, then silence."""
    return FakeReceiver(CODEC.encode(Head(request_id)), *chunks)


def handle(
    nursery: trio.Nursery, claims: StreamClaims[Head], peer: str, receiver: FakeReceiver
) -> trio.Event:
    """Start ``claims.handle_stream`` for ``receiver`` from ``peer`` in ``nursery``; the event
    is set once the handler returns."""
    returned = trio.Event()

    async def run() -> None:
        await claims.handle_stream(peer, cast(DataReceiver, receiver))
        returned.set()

    nursery.start_soon(run)
    return returned


async def refused(claims: StreamClaims[Head], peer: str, receiver: FakeReceiver) -> None:
    """``receiver`` from ``peer`` is refused: the handler returns, having closed and counted it
    (bounded: the handler of a claimed stream would wait for its request)."""
    before = claims.streams_refused
    with trio.fail_after(HEADER_TIMEOUT + 1):
        await claims.handle_stream(peer, cast(DataReceiver, receiver))
    assert receiver.closed
    assert claims.streams_refused == before + 1


async def test_the_peer_asked_claims_its_request(
    autojump_clock: trio.testing.MockClock, claims: StreamClaims[Head], link: Link
) -> None:
    answer = stream("r1", CODEC.encode(Body(b"x")))
    async with bounded_nursery() as nursery:
        async with claims.expect("r1", "node-b") as claim:
            assert claims.waiting == 1
            returned = handle(nursery, claims, "node-b", answer)
            got = await claim.wait(link, 5.0)
            assert got is not None and got is cast(object, answer)
            assert CODEC.decode(await got.receive()) == Body(b"x")  # the header was read
            await trio.testing.wait_all_tasks_blocked()
            assert not returned.is_set()  # the stream is the request's until it is done
            assert not answer.closed
        assert answer.closed  # leaving the block closes it, and lets the handler return
        await returned.wait()
    assert claims.statistics().waiting == 0
    assert claims.statistics().streams_refused == 0


async def test_a_stream_from_another_peer_is_refused(
    autojump_clock: trio.testing.MockClock, claims: StreamClaims[Head], link: Link
) -> None:
    answer = stream("r1")
    async with bounded_nursery() as nursery, claims.expect("r1", "node-b") as claim:
        await refused(claims, "node-c", stream("r1"))  # at once
        handle(nursery, claims, "node-b", answer)
        assert await claim.wait(link, 5.0) is cast(object, answer)  # the request still waited


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: stream("nobody"), id="unknown-id"),
        pytest.param(lambda: FakeReceiver(CODEC.encode(Body(b"r1"))), id="not-a-header"),
        pytest.param(lambda: FakeReceiver(b"\x00"), id="malformed"),
        pytest.param(lambda: FakeReceiver(ends=True), id="ended"),
        pytest.param(lambda: FakeReceiver(fails=PeerUnreachable(BYE)), id="link-lost"),
    ],
)
async def test_a_stream_naming_no_waiting_request_is_refused_at_once(
    autojump_clock: trio.testing.MockClock,
    claims: StreamClaims[Head],
    make: Callable[[], FakeReceiver],
) -> None:
    async with claims.expect("r1", "node-b"):
        start = trio.current_time()
        await refused(claims, "node-b", make())
        assert trio.current_time() == start  # not at the header deadline


async def test_a_second_stream_for_one_request_is_refused(
    autojump_clock: trio.testing.MockClock, claims: StreamClaims[Head], link: Link
) -> None:
    first = stream("r1")
    async with bounded_nursery() as nursery:
        async with claims.expect("r1", "node-b") as claim:
            handle(nursery, claims, "node-b", first)
            await trio.testing.wait_all_tasks_blocked()
            await refused(claims, "node-b", stream("r1"))  # before the request took the first
            assert await claim.wait(link, 5.0) is cast(object, first)
            await refused(claims, "node-b", stream("r1"))  # and after
            assert not first.closed
        assert first.closed


async def test_a_stream_without_a_header_is_closed_at_the_header_deadline(
    autojump_clock: trio.testing.MockClock, claims: StreamClaims[Head]
) -> None:
    async with claims.expect("r1", "node-b"):
        start = trio.current_time()
        await refused(claims, "node-b", FakeReceiver())  # never sends a chunk
        assert trio.current_time() - start == pytest.approx(HEADER_TIMEOUT)


async def test_a_stream_for_a_request_gone_is_refused(
    autojump_clock: trio.testing.MockClock, claims: StreamClaims[Head]
) -> None:
    async with claims.expect("r1", "node-b"):
        pass
    assert claims.waiting == 0
    await refused(claims, "node-b", stream("r1"))


async def test_a_stream_after_the_wait_timed_out_is_closed_by_leaving(
    autojump_clock: trio.testing.MockClock, claims: StreamClaims[Head], link: Link
) -> None:
    async with bounded_nursery() as nursery:
        async with claims.expect("r1", "node-b") as claim:
            start = trio.current_time()
            assert await claim.wait(link, 3.0) is None
            assert trio.current_time() - start == pytest.approx(3.0)
            assert link.closed is None  # so: the deadline
            late = stream("r1")
            returned = handle(nursery, claims, "node-b", late)  # claims the request
            await trio.testing.wait_all_tasks_blocked()
            assert not late.closed and not returned.is_set()
        assert late.closed  # nobody reads it: leaving the block closed it
    assert claims.streams_refused == 0


async def test_the_wait_ends_when_the_link_closes(
    autojump_clock: trio.testing.MockClock, claims: StreamClaims[Head]
) -> None:
    fake = FakeLink()

    async def close_soon() -> None:
        await trio.sleep(1.0)
        fake.close()

    async with bounded_nursery() as nursery, claims.expect("r1", "node-b") as claim:
        start = trio.current_time()
        nursery.start_soon(close_soon)
        assert await claim.wait(cast(Link, fake), 5.0) is None
        assert trio.current_time() - start == pytest.approx(1.0)


async def test_a_cancelled_request_closes_its_stream_and_lets_the_handler_return(
    autojump_clock: trio.testing.MockClock, claims: StreamClaims[Head], link: Link
) -> None:
    answer = stream("r1")  # then silence
    async with bounded_nursery() as nursery:
        with trio.move_on_after(2.0) as reading:
            async with claims.expect("r1", "node-b") as claim:
                returned = handle(nursery, claims, "node-b", answer)
                receiver = await claim.wait(link, 5.0)
                assert receiver is not None
                await receiver.receive()  # waits forever: cancelled at 2 s
        assert reading.cancelled_caught
        assert answer.closed  # closed on the way out, though cancelled (shielded)
        await returned.wait()
    assert claims.waiting == 0


async def test_one_request_id_waits_once(
    autojump_clock: trio.testing.MockClock, claims: StreamClaims[Head]
) -> None:
    async with claims.expect("r1", "node-b"):
        with pytest.raises(ValueError, match="already waits"):
            async with claims.expect("r1", "node-c"):
                pass  # pragma: no cover
        assert claims.waiting == 1  # the first one still waits
    assert claims.waiting == 0
