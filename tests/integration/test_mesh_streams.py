"""The mesh's data-stream hook (``Mesh(stream_handler=...)``) and :func:`rpc_peer`, over real
loopback WebSockets: two meshes in one Trio run."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
import trio

from skulk.federation import (
    DataReceiver,
    DataSender,
    Mesh,
    StreamStopped,
    rpc_peer,
)
from skulk.federation._mesh import StreamHandler
from tests._doubles import LINK_CONFIG as CONFIG
from tests._doubles import SECRET

WITHIN = 5.0  # seconds for anything that should happen promptly, on a loaded 2-core machine


async def whoami(method: str, body: bytes) -> bytes:
    await trio.lowlevel.checkpoint()
    return (rpc_peer() or "-").encode()


@asynccontextmanager
async def two_meshes(handler: StreamHandler) -> AsyncIterator[tuple[Mesh, Mesh]]:
    """``node-a`` (running ``handler`` for incoming streams) and ``node-b``, linked."""
    async with trio.open_nursery() as nursery:
        a = Mesh(
            "node-a",
            SECRET,
            listen=("127.0.0.1", 0),
            link_config=CONFIG,
            rpc_handler=whoami,
            stream_handler=handler,
            rng=random.Random(1),
        )
        host, port = await nursery.start(a.run)
        b = Mesh(
            "node-b",
            SECRET,
            listen=("127.0.0.1", 0),
            join=[f"ws://{host}:{port}"],
            link_config=CONFIG,
            rpc_handler=whoami,
            rng=random.Random(2),
        )
        await nursery.start(b.run)
        await until(lambda: a.link("node-b") is not None and b.link("node-a") is not None)
        yield a, b
        nursery.cancel_scope.cancel()


async def until(predicate: Callable[[], bool], within: float = WITHIN) -> None:
    with trio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - polling with a deadline, on purpose
            await trio.sleep(0.01)


def open_stream(mesh: Mesh, peer: str) -> DataSender:
    link = mesh.link(peer)
    assert link is not None
    return link.open_stream()


async def sends_until_stopped(sender: DataSender) -> None:
    """Send chunks until the receiver's stop arrives (``StreamStopped``), within WITHIN s."""
    with trio.fail_after(WITHIN), pytest.raises(StreamStopped):
        while True:
            await sender.send(b"more")
            await trio.sleep(0.01)


async def test_each_incoming_stream_runs_the_handler_with_its_peer() -> None:
    got: list[tuple[str, list[bytes]]] = []
    done = trio.Event()

    async def handler(peer: str, receiver: DataReceiver) -> None:
        got.append((peer, [chunk async for chunk in receiver]))
        if len(got) == 2:
            done.set()

    async with two_meshes(handler) as (_, b):
        for n in (1, 2):
            sender = open_stream(b, "node-a")
            for i in range(n):
                await sender.send(f"{n}.{i}".encode())
            await sender.end()
        with trio.fail_after(WITHIN):
            await done.wait()
    assert sorted(got) == [("node-b", [b"1.0"]), ("node-b", [b"2.0", b"2.1"])]


async def test_a_failing_handler_is_logged_and_stops_only_its_stream(
    caplog: pytest.LogCaptureFixture,
) -> None:
    served: list[bytes] = []

    async def handler(peer: str, receiver: DataReceiver) -> None:
        chunk = await receiver.receive()
        if chunk == b"boom":
            raise ValueError("a handler bug")
        served.append(chunk)

    async with two_meshes(handler) as (a, b):
        bad = open_stream(b, "node-a")
        await bad.send(b"boom")
        await sends_until_stopped(bad)  # its receiver was closed for it
        assert "stream handler failed on a stream from node-b" in caplog.text
        good = open_stream(b, "node-a")
        await good.send(b"fine")
        await until(lambda: served == [b"fine"])
        link = b.link("node-a")
        assert link is not None and link.closed is None  # the link is still up
        assert await link.call("any", b"", timeout=WITHIN) == b"node-b"
        assert a.statistics().peers_up == 1


async def test_a_handler_that_returns_without_reading_has_its_stream_stopped() -> None:
    async def handler(peer: str, receiver: DataReceiver) -> None:
        await trio.lowlevel.checkpoint()

    async with two_meshes(handler) as (a, b):
        sender = open_stream(b, "node-a")
        await sender.send(b"ignored")
        await sends_until_stopped(sender)
        link = a.link("node-b")
        assert link is not None
        await until(lambda: link.statistics().streams_in == 0)  # nothing kept for it


async def test_handlers_are_cancelled_when_their_link_closes() -> None:
    started = trio.Event()
    cancelled = trio.Event()

    async def handler(peer: str, receiver: DataReceiver) -> None:
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.set()
            raise

    async with two_meshes(handler) as (a, b):
        await open_stream(b, "node-a").send(b"hold")
        with trio.fail_after(WITHIN):
            await started.wait()
        link = a.link("node-b")
        assert link is not None
        link.close()
        with trio.fail_after(WITHIN):
            await cancelled.wait()


async def test_rpc_peer_names_the_calling_node_inside_the_rpc_handler_only() -> None:
    async def handler(peer: str, receiver: DataReceiver) -> None:
        await receiver.aclose()

    async with two_meshes(handler) as (a, b):
        to_a, to_b = b.link("node-a"), a.link("node-b")
        assert to_a is not None and to_b is not None
        assert await to_a.call("m", b"", timeout=WITHIN) == b"node-b"
        assert await to_b.call("m", b"", timeout=WITHIN) == b"node-a"
    assert rpc_peer() is None
