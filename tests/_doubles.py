"""Scaffolding the tests share: the test cluster secret, link settings and a redial policy fast
enough for loopback, deterministic handshake randomness, and stand-ins for a federation link and
a data stream's receiver. Import what you need: ``from tests._doubles import SECRET, FakeLink``."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable

import trio

from skulk.actors import RestartPolicy
from skulk.federation import ClusterSecret, LinkClosed, LinkCloseReason, LinkConfig
from skulk.routing import ROUTE_METHOD
from skulk.wire import Codec
from skulk.wire.routing import RouteRequest

#: The cluster secret every test cluster shares, and another that is not it.
SECRET = ClusterSecret(bytes(range(32)))
OTHER_SECRET = ClusterSecret(bytes(range(1, 33)))

#: Link timings short enough that a lost peer is noticed within a test, and long enough for a
#: loaded 2-core machine on loopback.
LINK_CONFIG = LinkConfig(
    max_frame_size=64 * 1024,
    handshake_timeout=1.0,
    heartbeat_interval=0.1,
    liveness_timeout=1.0,
    close_timeout=0.5,
)

#: How a test's mesh redials a lost peer: soon, and soon again.
LINK_BACKOFF = RestartPolicy(initial_backoff=0.05, max_backoff=0.3, jitter=0.5, reset_after=1.0)

#: How :class:`FakeLink` closes.
BYE = LinkClosed(LinkCloseReason.CLOSED, 1000, "bye", True)


def counter_rng(seed: str) -> Callable[[int], bytes]:
    """A handshake's randomness, deterministic: distinct bytes per call, the same per seed."""
    counter = itertools.count()
    return lambda n: hashlib.sha256(f"{seed}/{next(counter)}".encode()).digest()[:n]


class FakeLink:
    """A :class:`~skulk.federation.Link` stand-in (a peer's end, say node-b): ``call`` records
    the route request it carries and answers ``answer`` (or raises it); ``close`` closes it with
    :data:`BYE`, and ``wait_closed`` waits for that."""

    def __init__(self, answer: bytes | BaseException = b"admitted") -> None:
        self.answer = answer
        self.requests: list[RouteRequest] = []
        self.closed: LinkClosed | None = None
        self.called = trio.Event()
        self._done = trio.Event()

    async def call(self, method: str, body: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        assert method == ROUTE_METHOD
        await trio.lowlevel.checkpoint()
        self.requests.append(Codec(RouteRequest).decode(body))
        self.called.set()
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    def close(self) -> None:
        self.closed = BYE
        self._done.set()

    async def wait_closed(self) -> LinkClosed:
        await self._done.wait()
        return BYE


class FakeReceiver:
    """A :class:`~skulk.federation.DataReceiver` stand-in: delivers ``chunks``, then waits
    forever, or ends (``ends``), or raises ``fails`` (a lost link: ``PeerUnreachable``)."""

    def __init__(
        self, *chunks: bytes, ends: bool = False, fails: BaseException | None = None
    ) -> None:
        self.chunks = list(chunks)
        self.ends = ends
        self.fails = fails
        self.closed = False

    async def receive(self) -> bytes:
        await trio.lowlevel.checkpoint()
        if self.chunks:
            return self.chunks.pop(0)
        if self.fails is not None:
            raise self.fails
        if self.ends:
            raise trio.EndOfChannel
        await trio.sleep_forever()
        raise AssertionError

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
        self.closed = True
