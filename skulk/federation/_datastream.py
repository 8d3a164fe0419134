"""The two ends of a data stream on a federation link: ordered, credit-flow-controlled chunks.

A stream is one-way. Its sender (:class:`DataSender`, from :meth:`Link.open_stream`) numbers
chunks 0, 1, 2, ...; the receiver (:class:`DataReceiver`, from :attr:`Link.incoming_streams`)
buffers at most the credit it granted (``DATA_INITIAL_CREDIT`` chunks) and grants more as its
consumer takes chunks, so a slow consumer slows its sender down (backpressure) without ever
blocking the link's receiver task, and without holding up any other stream or topic.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import trio

from skulk.wire import Codec
from skulk.wire.link import DATA_INITIAL_CREDIT, DataChunk, LinkFrame

from ._linkbase import LinkClosed, PeerUnreachable, StreamStopped
from ._outbox import Outbox, OutboxClosed

ClosedInfo = Callable[[], LinkClosed | None]
"""Returns how the link closed, or ``None`` while it is open."""


class OutStream:
    """The link's bookkeeping for one outgoing stream."""

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id
        self.next_seq = 0
        self.credit = DATA_INITIAL_CREDIT
        self.stopped = False
        self.ended = False
        self.lot = trio.lowlevel.ParkingLot()


class DataSender:
    """The sending end of a data stream. :meth:`send` chunks, then :meth:`end` it.

    ``send`` waits while the receiver has granted no credit or the link's data queue is full
    (backpressure); put a deadline around it. It raises :class:`StreamStopped` once the
    receiver stopped the stream and :class:`PeerUnreachable` once the link is closed. A
    cancelled ``send`` sent nothing, so it never leaves a gap. Concurrent sends on one stream
    are each atomic; their order is the order they get room in.
    """

    def __init__(
        self,
        state: OutStream,
        outbox: Outbox,
        codec: Codec[LinkFrame],
        closed: ClosedInfo,
        forget: Callable[[int], None],
    ) -> None:
        self._state = state
        self._outbox = outbox
        self._codec = codec
        self._closed = closed
        self._forget = forget

    @property
    def stream_id(self) -> int:
        return self._state.stream_id

    @property
    def ended(self) -> bool:
        return self._state.ended

    async def send(self, body: bytes, *, end: bool = False) -> None:
        """Send one chunk (the last one if ``end``)."""
        st = self._state
        while True:
            if st.ended:
                raise RuntimeError(f"data stream {st.stream_id} already ended")
            if st.stopped:
                raise StreamStopped(st.stream_id)
            try:
                if self._closed() is None and st.next_seq < st.credit:
                    if self._outbox.data_has_room():
                        break
                    await self._outbox.data_room.park()
                    continue
            except OutboxClosed:
                pass
            if (closed := self._closed()) is not None:
                raise PeerUnreachable(closed)
            await st.lot.park()
        # From here to the end nothing awaits: the chunk is numbered and queued atomically.
        frame = self._codec.encode(
            DataChunk(stream_id=st.stream_id, seq=st.next_seq, body=body, end=end)
        )
        self._outbox.put_data_nowait(frame)
        st.next_seq += 1
        if end:
            st.ended = True
            self._forget(st.stream_id)

    async def end(self, body: bytes = b"") -> None:
        """Send the last chunk (``body`` may be empty)."""
        await self.send(body, end=True)


class InStream:
    """The link's bookkeeping for one incoming stream."""

    def __init__(self, stream_id: int) -> None:
        self.stream_id = stream_id
        self.expected = 0  # next seq to accept
        self.granted = DATA_INITIAL_CREDIT  # the sender may send seq < granted
        self.consumed = 0
        self.buffer: deque[bytes] = deque()
        self.ended = False  # the end chunk arrived
        self.lot = trio.lowlevel.ParkingLot()


class DataReceiver:
    """The receiving end of a data stream: ``async for chunk in receiver`` until the end.

    :meth:`receive` returns the next chunk's body (the end chunk's body only if it is not
    empty), raises :class:`trio.EndOfChannel` after the last one, and
    :class:`PeerUnreachable` if the link closed before the stream ended (chunks that arrived
    before that are still delivered first). :meth:`aclose` stops the stream early: the sender
    is told (:class:`StreamStopped` there) and anything still arriving is dropped.
    """

    def __init__(
        self,
        state: InStream,
        outbox: Outbox,
        closed: ClosedInfo,
        forget: Callable[[int], None],
    ) -> None:
        self._state = state
        self._outbox = outbox
        self._closed = closed
        self._forget = forget
        self._done = False

    @property
    def stream_id(self) -> int:
        return self._state.stream_id

    def __aiter__(self) -> DataReceiver:
        return self

    async def __anext__(self) -> bytes:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    async def receive(self) -> bytes:
        st = self._state
        while True:
            if self._done:
                raise trio.EndOfChannel
            if st.buffer:
                body = st.buffer.popleft()
                self._consumed()
                if st.ended and not st.buffer and not body:
                    self._finish()
                    raise trio.EndOfChannel
                if st.ended and not st.buffer:
                    self._finish()
                await trio.lowlevel.checkpoint()
                return body
            if (closed := self._closed()) is not None:
                raise PeerUnreachable(closed)
            await st.lot.park()

    async def peek(self) -> bytes:
        """The next chunk's body without taking it: the next :meth:`receive` returns it
        (grants no credit). Raises as :meth:`receive` does. For a handler that dispatches a
        stream by its first chunk to another handler that reads that chunk itself."""
        st = self._state
        while True:
            if self._done:
                raise trio.EndOfChannel
            if st.buffer:
                body = st.buffer[0]
                if st.ended and len(st.buffer) == 1 and not body:
                    raise trio.EndOfChannel  # an empty end chunk: receive() ends the stream
                await trio.lowlevel.checkpoint()
                return body
            if (closed := self._closed()) is not None:
                raise PeerUnreachable(closed)
            await st.lot.park()

    def _consumed(self) -> None:
        st = self._state
        st.consumed += 1
        if not st.ended and st.granted - st.consumed <= DATA_INITIAL_CREDIT // 2:
            st.granted = st.consumed + DATA_INITIAL_CREDIT
            try:
                self._outbox.grant_credit(st.stream_id, st.granted)
            except OutboxClosed:
                pass

    def _finish(self) -> None:
        self._done = True
        self._forget(self._state.stream_id)

    async def aclose(self) -> None:
        """Stop receiving: tell the sender (unless the stream already ended) and drop the rest.
        A :meth:`receive` waiting meanwhile (in another task) raises ``EndOfChannel``."""
        if not self._done:
            self._done = True
            self._state.buffer.clear()
            self._state.lot.unpark_all()  # a receive() waiting in another task ends too
            self._forget(self._state.stream_id)
            if not self._state.ended:
                try:
                    self._outbox.stop_stream(self._state.stream_id)
                except OutboxClosed:
                    pass
        await trio.lowlevel.checkpoint()
