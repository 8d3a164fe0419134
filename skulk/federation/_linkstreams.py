"""A link's data streams, both ways: opening outgoing ones, and routing each received chunk,
credit grant and stop to its stream.

:class:`StreamTable` is driven by its :class:`~skulk.federation.Link`: the link's receiver task
hands it the data frames, which it handles without ever blocking (a new incoming stream beyond
``max_streams``, or one nobody takes, is stopped at once; a gap, a chunk beyond the credit
granted, or a stream not starting at 0 closes the link; an abort ends its stream after what
arrived, and one for a stream this side never saw is ignored). The stream ends themselves are
:class:`~skulk.federation.DataSender` and :class:`~skulk.federation.DataReceiver`
(:mod:`skulk.federation._datastream`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import trio

from skulk.wire.link import DataAbort, DataChunk, DataCredit, DataStop

from ._datastream import ClosedInfo, DataReceiver, DataSender, InStream, OutStream
from ._linkbase import LinkBusy, LinkCloseReason, PeerUnreachable
from ._outbox import Outbox


class StreamTable:
    """The open data streams of one link.

    ``incoming`` takes each new incoming stream's receiver (the link's
    :attr:`~skulk.federation.Link.incoming_streams`); ``closed`` says how the link ended
    (``None`` while open); ``violation`` closes the link for a peer that breaks the protocol.
    """

    def __init__(
        self,
        peer_id: str,
        max_streams: int,
        credit_timeout: float,
        outbox: Outbox,
        incoming: trio.MemorySendChannel[DataReceiver],
        *,
        closed: ClosedInfo,
        violation: Callable[[LinkCloseReason, str], None],
    ) -> None:
        self._peer_id = peer_id
        self._max_streams = max_streams
        self._credit_timeout = credit_timeout
        self._outbox = outbox
        self._incoming = incoming
        self._closed = closed
        self._violation = violation
        self._out_streams: dict[int, OutStream] = {}
        self._stream_ids = itertools.count()
        self._in_streams: dict[int, InStream] = {}
        self._highest_in_stream = -1
        self.dropped = 0
        """Incoming streams stopped at once: beyond ``max_streams``, or not taken."""
        self.duplicates = 0
        """Chunks received again, or after their stream ended or was stopped."""

    @property
    def inbound(self) -> int:
        return len(self._in_streams)

    @property
    def outbound(self) -> int:
        return len(self._out_streams)

    def open(self) -> DataSender:
        """:meth:`Link.open_stream <skulk.federation.Link.open_stream>`."""
        closed = self._closed()
        if closed is not None:
            raise PeerUnreachable(closed)
        if len(self._out_streams) >= self._max_streams:
            raise LinkBusy(f"{len(self._out_streams)} data streams to {self._peer_id} are open")
        state = OutStream(next(self._stream_ids))
        self._out_streams[state.stream_id] = state
        return DataSender(state, self._outbox, self._closed, self._forget_out, self._credit_timeout)

    def _forget_out(self, stream_id: int) -> None:
        self._out_streams.pop(stream_id, None)

    def _forget_in(self, stream_id: int) -> None:
        self._in_streams.pop(stream_id, None)

    def wake_all(self) -> None:
        """The link closed: every task waiting on a stream wakes to see it."""
        for out_stream in self._out_streams.values():
            out_stream.lot.unpark_all()
        for in_stream in self._in_streams.values():
            in_stream.lot.unpark_all()

    def on_credit(self, frame: DataCredit) -> None:
        out_stream = self._out_streams.get(frame.stream_id)
        if out_stream is not None and frame.limit > out_stream.credit:
            out_stream.credit = frame.limit
            out_stream.lot.unpark_all()

    def on_stop(self, frame: DataStop) -> None:
        out_stream = self._out_streams.pop(frame.stream_id, None)
        if out_stream is not None:
            out_stream.stopped = True
            out_stream.lot.unpark_all()

    def on_abort(self, frame: DataAbort) -> None:
        st = self._in_streams.pop(frame.stream_id, None)
        if st is not None and not st.ended:
            # Peer-supplied text, shown in logs: printable and short.
            st.aborted = "".join(c for c in frame.reason[:64] if c.isprintable()) or "unknown"
            st.lot.unpark_all()

    def on_chunk(self, chunk: DataChunk) -> None:
        st = self._in_streams.get(chunk.stream_id)
        if st is None:
            if chunk.stream_id <= self._highest_in_stream:
                self.duplicates += 1  # a stream that ended or was stopped
                return
            if chunk.seq != 0:
                self._violation(
                    LinkCloseReason.DATA_GAP,
                    f"data stream {chunk.stream_id} started at seq {chunk.seq}, not 0",
                )
                return
            self._highest_in_stream = chunk.stream_id
            if len(self._in_streams) >= self._max_streams:
                self.dropped += 1
                self._outbox.stop_stream(chunk.stream_id)
                return
            st = InStream(chunk.stream_id)
            receiver = DataReceiver(st, self._outbox, self._closed, self._forget_in)
            try:
                self._incoming.send_nowait(receiver)
            except (trio.WouldBlock, trio.BrokenResourceError):
                self.dropped += 1
                self._outbox.stop_stream(chunk.stream_id)
                return
            self._in_streams[chunk.stream_id] = st
        if chunk.seq < st.expected or st.ended:
            self.duplicates += 1  # a copy of a chunk delivered already, or after the end
        elif chunk.seq > st.expected:
            self._violation(
                LinkCloseReason.DATA_GAP,
                f"data stream {chunk.stream_id}: chunk {chunk.seq}, expected {st.expected}",
            )
        elif chunk.seq >= st.granted:
            self._violation(
                LinkCloseReason.FLOW_CONTROL,
                f"data stream {chunk.stream_id}: chunk {chunk.seq} beyond credit {st.granted}",
            )
        else:
            st.expected += 1
            st.buffer.append(chunk.body)
            st.ended = chunk.end
            st.lot.unpark_all()
