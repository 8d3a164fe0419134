"""Requests that wait for one inbound data stream each, and the streams that claim them.

A protocol that answers an rpc on a data stream back to the caller (the routing hop's
``route.generate``, the transfer's ``transfer.ranges``) needs its caller to tell that stream
from any other the peer opens. The answer stream's first chunk is a header naming the request
id; the caller registers the id, and the node's stream handler hands each stream to the request
its header names::

    claims = StreamClaims(ITEM_CODEC.decode, RouteHeader, header_timeout=5.0)

    # the mesh's stream handler (for these streams):
    await claims.handle_stream(peer, receiver)

    # the request:
    async with claims.expect(request_id, peer) as claim:
        await link.call(...)                    # asks the peer to open the stream
        receiver = await claim.wait(link, 5.0)  # None: not within 5 s, or the link closed
        ...                                     # read the items after the header

A stream is refused (counted in ``streams_refused`` and closed at once, which stops it on the
sender) when its first chunk does not come within the header deadline, does not decode, is not
a header, names no request waiting now, names one that asked another peer, or names one that
another stream claimed already. The receiver of a claimed stream belongs to the request: the
handler waits until the request is done with it and has closed it (leaving the ``async with``
closes it, shielded), so the mesh, which closes a handler's receiver when the handler returns,
never closes it under the request's feet. A stream that comes after the request stopped waiting
for it but before it left the block is closed by the leaving.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import Generic, Protocol, TypeVar

import attrs
import trio

from skulk.wire import WireError

from ._datastream import DataReceiver
from ._link import Link
from ._linkbase import PeerUnreachable


class StreamHeader(Protocol):
    """What :class:`StreamClaims` needs of a header: the id of the request it answers."""

    @property
    def request_id(self) -> str: ...


H = TypeVar("H", bound=StreamHeader)


@attrs.frozen
class StreamClaimsStatistics:
    """A snapshot of a :class:`StreamClaims`."""

    #: requests registered now (waiting for their stream, or reading it)
    waiting: int
    #: incoming streams closed for want of a header naming a request that waits for them
    streams_refused: int


class StreamClaim:
    """One request's wait for its stream (from :meth:`StreamClaims.expect`; an async context
    manager: entering registers the request, leaving forgets it and closes the stream)."""

    def __init__(self, waiting: dict[str, StreamClaim], request_id: str, peer: str) -> None:
        self._waiting = waiting  # the registry of its StreamClaims
        self.request_id = request_id
        self.peer = peer  # the peer asked: only a stream from it may claim the request
        self._receiver: DataReceiver | None = None
        self._arrived = trio.Event()
        self._done = trio.Event()  # set once the request closed the receiver

    async def wait(self, link: Link, timeout: float) -> DataReceiver | None:  # noqa: ASYNC109
        """The claimed stream's receiver (its header already read), once a stream claims the
        request; ``None`` if none did within ``timeout`` seconds, or ``link`` closed first
        (``link.closed`` tells which)."""
        arrived = False
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_cancel_when_closed, link, nursery.cancel_scope)
            with trio.move_on_after(timeout):
                await self._arrived.wait()
                arrived = True
            nursery.cancel_scope.cancel()
        # A stream claimed just after the link closed stays with the claim (leaving closes
        # it), but the request sees the close: its reads could only fail.
        return self._receiver if arrived else None

    def _take(self, receiver: DataReceiver) -> bool:
        """Claim this request with ``receiver``, unless a stream did already."""
        if self._receiver is not None:
            return False
        self._receiver = receiver
        self._arrived.set()
        return True

    async def __aenter__(self) -> StreamClaim:
        if self.request_id in self._waiting:
            raise ValueError(f"request {self.request_id!r} already waits for a stream")
        self._waiting[self.request_id] = self
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._waiting.get(self.request_id) is self:
            del self._waiting[self.request_id]  # no stream can claim the request from here on
        receiver = self._receiver
        if receiver is not None:
            try:
                with trio.CancelScope(shield=True):
                    await receiver.aclose()  # stops the stream unless it ended
            finally:
                self._done.set()


class StreamClaims(Generic[H]):
    """The requests of one protocol waiting for their answer streams (see the module doc).

    ``decode`` turns a stream's first chunk into a frame (raising ``WireError``), ``header``
    is the frame class that names a request, ``header_timeout`` bounds the wait for the first
    chunk (it comes with the stream, so in practice a peer sending garbage is refused at once).
    Single-threaded (the node's Trio loop).
    """

    def __init__(
        self, decode: Callable[[bytes], object], header: type[H], *, header_timeout: float
    ) -> None:
        self._decode = decode
        self._header = header
        self._header_timeout = header_timeout
        self._waiting: dict[str, StreamClaim] = {}
        self.streams_refused = 0

    @property
    def waiting(self) -> int:
        """Requests registered now (waiting for their stream, or reading it)."""
        return len(self._waiting)

    def statistics(self) -> StreamClaimsStatistics:
        return StreamClaimsStatistics(len(self._waiting), self.streams_refused)

    def expect(self, request_id: str, peer: str) -> StreamClaim:
        """The wait of request ``request_id``, asked of ``peer``, for its stream: use it as
        ``async with claims.expect(...) as claim`` around the rpc that asks for the stream
        and the reading of it."""
        return StreamClaim(self._waiting, request_id, peer)

    async def handle_stream(self, peer: str, receiver: DataReceiver) -> None:
        """Hand a stream from ``peer`` to the request its header names and return once that
        request is done with it; or refuse it: count it and close it at once."""
        claim: StreamClaim | None = None
        with trio.move_on_after(self._header_timeout):
            claim = await self._claim(peer, receiver)
        if claim is None:
            self.streams_refused += 1
            with trio.CancelScope(shield=True):
                await receiver.aclose()
            return
        await claim._done.wait()  # the stream is the request's now; it closes it

    async def _claim(self, peer: str, receiver: DataReceiver) -> StreamClaim | None:
        try:
            header = self._decode(await receiver.receive())
        except (WireError, trio.EndOfChannel, PeerUnreachable):
            return None
        if not isinstance(header, self._header):
            return None
        claim = self._waiting.get(header.request_id)
        if claim is None or claim.peer != peer:
            return None  # not asked of this peer, or the request gave up already
        if not claim._take(receiver):
            return None  # a second stream for one request
        return claim


async def _cancel_when_closed(link: Link, scope: trio.CancelScope) -> None:
    await link.wait_closed()
    scope.cancel()
