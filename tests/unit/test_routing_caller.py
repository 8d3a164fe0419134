"""The calling end of the remote hop without a network: a fake link and fake receivers, on
Trio's autojump clock (so every deadline is exact and costs no real time)."""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

import pytest
import trio
import trio.testing

from skulk.federation import (
    LinkBusy,
    LinkClosed,
    LinkCloseReason,
    Mesh,
    PeerUnreachable,
    RpcFailed,
    RpcTimeout,
)
from skulk.routing import (
    ROUTE_METHOD,
    Admission,
    NodeUnreachable,
    Overloaded,
    RemoteRouting,
    RemoteUnavailable,
    RouteTimeouts,
)
from skulk.wire import Codec, FrameTooLarge
from skulk.wire.routing import (
    RouteDelta,
    RouteEnd,
    RouteFailed,
    RouteHeader,
    RouteItem,
    RouteKeepalive,
    RouteNotReady,
)
from skulk.wire.runner import GenerationEnd, SamplingParams, TextPrompt, Usage
from skulk.worker import RequestFailure
from tests._doubles import FakeLink, FakeReceiver

ITEMS: Codec[RouteItem] = Codec(RouteItem)
TIMEOUTS = RouteTimeouts(admit=5.0, header=5.0, send=30.0, keepalive=2.0, idle=10.0)
PARAMS = SamplingParams()


class FakeMesh:
    node_id = "node-a"

    def __init__(self, link: FakeLink | None) -> None:
        self._link = link

    def link(self, peer: str) -> FakeLink | None:
        return self._link if peer == "node-b" else None


def routing(link: FakeLink | None = None) -> RemoteRouting:
    mesh = cast(Mesh, FakeMesh(link or FakeLink()))
    return RemoteRouting(mesh, lambda instance: None, Admission(), timeouts=TIMEOUTS)


def request(r: RemoteRouting, text: str = "hi") -> AsyncGenerator[str | GenerationEnd, None]:
    return r.generate("node-b", "i1", TextPrompt(text), PARAMS)


async def answer_with(
    r: RemoteRouting, link: FakeLink, *items: RouteItem, peer: str = "node-b", ends: bool = False
) -> FakeReceiver:
    """Once the request was asked, open its answer stream from ``peer`` with ``items`` after
    the header; returns the stream's receiver."""
    await link.called.wait()
    header = ITEMS.encode(RouteHeader(link.requests[-1].request_id))
    receiver = FakeReceiver(header, *(ITEMS.encode(i) for i in items), ends=ends)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(r.handle_stream, peer, cast(Any, receiver))
        await trio.testing.wait_all_tasks_blocked()
        nursery.cancel_scope.cancel()
    return receiver


async def collect(items: AsyncGenerator[str | GenerationEnd, None]) -> list[str | GenerationEnd]:
    async with aclosing(items):
        return [item async for item in items]


async def test_an_answer_stream_is_read_to_its_end(autojump_clock: trio.testing.MockClock) -> None:
    link = FakeLink()
    r = routing(link)
    end = RouteEnd(GenerationEnd("length", Usage(2, 3)))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(
            answer_with, r, link, RouteDelta("a"), RouteKeepalive(), RouteDelta("b"), end
        )
        got = await collect(request(r))
    assert got == ["a", "b", GenerationEnd("length", Usage(2, 3))]
    assert r.statistics().waiting == 0


@pytest.mark.parametrize(
    ("item", "error", "check"),
    [
        (RouteFailed("prompt_too_long", "42 > 8"), RequestFailure, ("prompt_too_long", "42 > 8")),
        (RouteNotReady("i1 is restarting"), RemoteUnavailable, "i1 is restarting"),
        (RouteHeader("again"), NodeUnreachable, "a second header"),
    ],
)
async def test_a_failed_answer_is_typed(
    autojump_clock: trio.testing.MockClock, item: RouteItem, error: type[Exception], check: Any
) -> None:
    link = FakeLink()
    r = routing(link)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_with, r, link, RouteDelta("a"), item)
        with pytest.raises(error) as info:
            await collect(request(r))
    if isinstance(info.value, RequestFailure) and not isinstance(info.value, NodeUnreachable):
        assert (info.value.reason, info.value.message) == check
    else:
        assert check in str(info.value)


async def test_a_stream_that_ends_without_its_end_is_a_lost_node(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = FakeLink()
    r = routing(link)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(answer_with, r, link, RouteDelta("a"), ends=True))
        with pytest.raises(NodeUnreachable, match="ended without an end"):
            await collect(request(r))


async def test_a_malformed_chunk_is_a_lost_node_and_closes_the_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = FakeLink()
    r = routing(link)
    await_receiver: list[FakeReceiver] = []

    async def answer() -> None:
        await link.called.wait()
        receiver = FakeReceiver(ITEMS.encode(RouteHeader(link.requests[-1].request_id)), b"\x00")
        await_receiver.append(receiver)
        await r.handle_stream("node-b", cast(Any, receiver))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer)
        with pytest.raises(NodeUnreachable, match="malformed"):
            await collect(request(r))
    assert await_receiver[0].closed  # which stops the stream: the node cancels the generation


async def test_the_wait_for_the_next_chunk_is_bounded_by_idle(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = FakeLink()
    r = routing(link)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_with, r, link, RouteDelta("a"))  # then silence
        start = trio.current_time()
        with pytest.raises(NodeUnreachable, match="nothing on its answer stream for 10 s"):
            await collect(request(r))
    assert trio.current_time() - start == pytest.approx(TIMEOUTS.idle)


async def test_an_answer_stream_that_never_opens_is_bounded_by_admit(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = routing()
    start = trio.current_time()
    with pytest.raises(NodeUnreachable, match="did not open within 5 s"):
        await collect(request(r))
    assert trio.current_time() - start == pytest.approx(TIMEOUTS.admit)
    assert r.statistics().waiting == 0


async def test_closing_the_request_early_closes_its_stream(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = FakeLink()
    r = routing(link)
    async with trio.open_nursery() as nursery:
        receiver_box: list[FakeReceiver] = []

        async def answer() -> None:
            receiver_box.append(await answer_with(r, link, RouteDelta("a")))

        nursery.start_soon(answer)
        items = request(r)
        assert await anext(items) == "a"
        await items.aclose()
    assert receiver_box[0].closed
    assert r.statistics().waiting == 0


# ---- streams that are not answers ---------------------------------------------------------


async def test_a_stream_that_never_names_its_request_is_closed_after_the_header_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    r = routing()
    receiver = FakeReceiver()  # never delivers a chunk
    start = trio.current_time()
    await r.handle_stream("node-b", cast(Any, receiver))
    assert trio.current_time() - start == pytest.approx(TIMEOUTS.header)
    assert receiver.closed
    assert r.statistics().streams_refused == 1


async def test_only_the_node_asked_may_answer(autojump_clock: trio.testing.MockClock) -> None:
    link = FakeLink()
    r = routing(link)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(collect, request(r))
        await link.called.wait()
        header = ITEMS.encode(RouteHeader(link.requests[-1].request_id))
        impostor = FakeReceiver(header)
        await r.handle_stream("node-c", cast(Any, impostor))  # returns at once: refused
        assert impostor.closed
        assert r.statistics().streams_refused == 1
        nursery.cancel_scope.cancel()


async def test_a_late_answer_stream_is_closed(autojump_clock: trio.testing.MockClock) -> None:
    link = FakeLink()
    r = routing(link)
    with pytest.raises(NodeUnreachable):
        await collect(request(r))  # gave up waiting for its stream
    late = FakeReceiver(ITEMS.encode(RouteHeader(link.requests[-1].request_id)))
    await r.handle_stream("node-b", cast(Any, late))
    assert late.closed


# ---- refusals -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("refusal", "error", "check"),
    [
        (RpcFailed("overloaded", "2.5"), Overloaded, 2.5),
        (RpcFailed("overloaded", "nan"), Overloaded, 1.0),
        (RpcFailed("overloaded", "-3"), Overloaded, 1.0),
        (RpcFailed("overloaded", "soon"), Overloaded, 1.0),
        (RpcFailed("busy", "busy on this node"), Overloaded, 1.0),
        (LinkBusy("1024 calls pending"), Overloaded, 1.0),
        (RpcFailed("not_ready", "instance i1 is loading"), RemoteUnavailable, "loading"),
        (RpcFailed("instance_not_here", "not here"), RemoteUnavailable, "not here"),
        (RpcFailed("no_handler", ""), RemoteUnavailable, "no_handler"),
        (RpcFailed("deadline_exceeded", "no answer"), NodeUnreachable, "deadline_exceeded"),
        (RpcTimeout(ROUTE_METHOD, 5.0), NodeUnreachable, "no answer within 5.0 s"),
        (
            PeerUnreachable(LinkClosed(LinkCloseReason.CLOSED, 1000, "bye", True)),
            NodeUnreachable,
            "bye",
        ),
        (RpcFailed("handler_failed", "KeyError"), RequestFailure, "route_refused"),
        (FrameTooLarge(5_000_000, 4_194_304), RequestFailure, "prompt_too_long"),
    ],
)
async def test_a_refused_request_is_typed(
    autojump_clock: trio.testing.MockClock,
    refusal: BaseException,
    error: type[Exception],
    check: Any,
) -> None:
    with pytest.raises(error) as info:
        await collect(request(routing(FakeLink(refusal))))
    if isinstance(info.value, Overloaded):
        assert info.value.retry_after == check
    elif type(info.value) is RequestFailure:
        assert info.value.reason == check
    else:
        assert check in str(info.value)


async def test_a_request_that_cannot_be_encoded_is_invalid_before_anything_is_sent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = FakeLink()
    with pytest.raises(RequestFailure) as info:
        await collect(request(routing(link), "lone \udc00 surrogate"))
    assert info.value.reason == "invalid_request"
    assert link.requests == []


async def test_no_link_is_a_lost_node_at_once() -> None:
    r = RemoteRouting(cast(Mesh, FakeMesh(None)), lambda i: None, Admission())
    with pytest.raises(NodeUnreachable, match="no link"):
        await collect(request(r))


async def test_route_calls_are_answered_only_over_a_mesh_link() -> None:
    r = routing()
    with pytest.raises(RpcFailed) as info:
        await r.handle_rpc(ROUTE_METHOD, b"")  # no rpc_peer(): not called over a mesh
    assert info.value.reason == "bad_request"


def test_timeouts_are_checked() -> None:
    with pytest.raises(ValueError):
        RouteTimeouts(send=0)
    with pytest.raises(ValueError):
        RouteTimeouts(idle=float("inf"))
    with pytest.raises(ValueError):
        RouteTimeouts(keepalive=5.0, idle=5.0)  # the idle deadline must outlast a keepalive
