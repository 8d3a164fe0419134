"""The two ends of a data stream on a federation link: ordered, credit-flow-controlled chunks.

A stream is one-way. Its sender (:class:`DataSender`, from :meth:`Link.open_stream`) numbers
chunks 0, 1, 2, ...; the receiver (:class:`DataReceiver`, from :attr:`Link.incoming_streams`)
buffers at most the credit it granted (``DATA_INITIAL_CREDIT`` chunks) and grants more as its
consumer takes chunks, so a slow consumer slows its sender down (backpressure) without ever
blocking the link's receiver task, and without holding up any other stream or topic.

A sender waits for credit at most ``LinkConfig.credit_timeout``; then it aborts the stream
(``DataAbort``, reason ``credit_timeout``) and frees its slot (:class:`StreamStarved`). A sender
may also :meth:`DataSender.abort` a stream with a reason of its own. The receiver of an aborted
stream gets the chunks that came before, then :class:`StreamAborted`.

Chunks travel as binary data frames (:func:`skulk.wire.link.encode_data_chunk`): a fixed header
and the body as it is, with no CBOR encoding or decoding of the body.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import trio

from skulk.wire.link import DATA_INITIAL_CREDIT, encode_data_chunk

from ._linkbase import LinkClosed, PeerUnreachable, StreamAborted, StreamStarved, StreamStopped
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
        self.aborted: str | None = None  # why this side aborted it
        self.lot = trio.lowlevel.ParkingLot()


class DataSender:
    """The sending end of a data stream. :meth:`send` chunks, then :meth:`end` it.

    ``send`` waits while the receiver has granted no credit or the link's data queue is full
    (backpressure); put a deadline around it. It raises :class:`StreamStopped` once the
    receiver stopped the stream, :class:`StreamStarved` (a ``StreamStopped``) once it waited
    ``credit_timeout`` seconds for credit (the stream is then aborted), and
    :class:`PeerUnreachable` once the link is closed. A cancelled ``send`` sent nothing, so it
    never leaves a gap. Concurrent sends on one stream are each atomic; their order is the
    order they get room in. :meth:`abort` ends the stream unfinished, with a reason; a send
    after it (or waiting meanwhile) raises :class:`StreamStopped`.
    """

    def __init__(
        self,
        state: OutStream,
        outbox: Outbox,
        closed: ClosedInfo,
        forget: Callable[[int], None],
        credit_timeout: float,
    ) -> None:
        self._state = state
        self._outbox = outbox
        self._closed = closed
        self._forget = forget
        self._credit_timeout = credit_timeout

    @property
    def stream_id(self) -> int:
        return self._state.stream_id

    @property
    def ended(self) -> bool:
        return self._state.ended

    async def send(self, body: bytes | bytearray | memoryview, *, end: bool = False) -> None:
        """Send one chunk (the last one if ``end``)."""
        st = self._state
        starved_since: float | None = None
        while True:
            if st.aborted == "credit_timeout":  # a concurrent send gave up on the credit
                raise StreamStarved(st.stream_id, self._credit_timeout)
            if st.aborted is not None:
                raise StreamStopped(st.stream_id)
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
            # No credit: wait for it, at most credit_timeout in all.
            now = trio.current_time()
            if starved_since is None:
                starved_since = now
            if now - starved_since >= self._credit_timeout:
                self._abort("credit_timeout")
                raise StreamStarved(st.stream_id, self._credit_timeout)
            with trio.move_on_at(starved_since + self._credit_timeout):
                await st.lot.park()
        # From here to the end nothing awaits: the chunk is numbered and queued atomically.
        frame = encode_data_chunk(st.stream_id, st.next_seq, body, end)
        self._outbox.put_data_nowait(frame)
        st.next_seq += 1
        if end:
            st.ended = True
            self._forget(st.stream_id)

    def abort(self, reason: str) -> None:
        """End the stream unfinished: the receiver gets the chunks sent so far, then
        :class:`StreamAborted` with ``reason`` (a snake_case name). Frees the stream's slot at
        once. Does nothing once the stream ended, was stopped or the link closed."""
        if not self._state.ended and not self._state.stopped:
            self._abort(reason)

    def _abort(self, reason: str) -> None:
        st = self._state
        st.ended = st.stopped = True
        st.aborted = reason
        self._forget(st.stream_id)
        st.lot.unpark_all()  # a concurrent send() sees it
        try:
            self._outbox.abort_stream(st.stream_id, reason)
        except OutboxClosed:
            pass

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
        self.aborted: str | None = None  # the sender's reason, once it aborted the stream
        self.lot = trio.lowlevel.ParkingLot()


class DataReceiver:
    """The receiving end of a data stream: ``async for chunk in receiver`` until the end.

    :meth:`receive` returns the next chunk's body (the end chunk's body only if it is not
    empty), raises :class:`trio.EndOfChannel` after the last one, and
    :class:`PeerUnreachable` if the link closed before the stream ended (chunks that arrived
    before that are still delivered first), and :class:`StreamAborted` (a ``PeerUnreachable``)
    once the sender aborted it (after the chunks that came before). :meth:`aclose` stops the
    stream early: the sender is told (:class:`StreamStopped` there) and anything still
    arriving is dropped.
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
            if st.aborted is not None:
                self._done = True
                raise StreamAborted(st.stream_id, st.aborted)
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
            if st.aborted is not None:
                raise StreamAborted(st.stream_id, st.aborted)
            if (closed := self._closed()) is not None:
                raise PeerUnreachable(closed)
            await st.lot.park()

    def _consumed(self) -> None:
        st = self._state
        st.consumed += 1
        if (
            not st.ended
            and st.aborted is None
            and st.granted - st.consumed <= DATA_INITIAL_CREDIT // 2
        ):
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
            if not self._state.ended and self._state.aborted is None:
                try:
                    self._outbox.stop_stream(self._state.stream_id)
                except OutboxClosed:
                    pass
        await trio.lowlevel.checkpoint()
