"""An authenticated federation link: topics, heartbeats, clean failure.

A :class:`Link` is made by :func:`~skulk.federation.run_link` / :func:`~skulk.federation.open_link`
(:mod:`skulk.federation._linkopen`) once the handshake established the peer's identity.

Once established the link runs three tasks until it closes: a *sender* (drains the
:class:`~skulk.federation._outbox.Outbox`, control before data), a *receiver* (decodes each
message with a strict codec and routes it without ever blocking: raft and telemetry into
bounded inboxes that drop when full, rpc requests to handler tasks under a concurrency limit,
data chunks into per-stream buffers bounded by credit) and a *heartbeat* (pings, RTT,
liveness). Whatever the peer sends, the link's tasks never raise: bad input closes the link
with a typed :class:`LinkCloseReason` and its close code, pending calls fail at once with
:class:`PeerUnreachable`, inboxes end, and the transport is closed shielded and bounded.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs
import trio

from skulk.wire import Codec, FrameTooLarge, WireError
from skulk.wire.link import (
    DataChunk,
    DataCredit,
    DataStop,
    LinkFrame,
    Ping,
    Pong,
    RaftMessage,
    RpcError,
    RpcRequest,
    RpcResponse,
)
from skulk.wire.telemetry import TelemetryDigest, TelemetryFrame, TelemetryPush

from ._datastream import DataReceiver, DataSender, InStream, OutStream
from ._linkbase import (
    LinkBusy,
    LinkClosed,
    LinkCloseReason,
    LinkConfig,
    LinkState,
    LinkStatistics,
    PeerUnreachable,
    RpcFailed,
    RpcTimeout,
)
from ._outbox import Outbox, OutboxClosed
from ._refusal import one_line, quote
from ._transport import MessageTooLarge, MessageTransport, TransportClosed, TransportViolation

log = logging.getLogger("skulk.federation.link")

RpcHandler = Callable[[str, bytes], Awaitable[bytes]]
"""``await handler(method, body)`` answers an incoming call: return the response body, or raise
:class:`RpcFailed` for a typed error. Any other exception answers ``handler_failed``."""

_MAX_PINGS_OUTSTANDING = 8
T = TypeVar("T")


@functools.lru_cache(maxsize=8)
def _codec(max_frame_size: int) -> Codec[LinkFrame]:
    """Codecs are immutable and costly to build (hooks for every frame class): share them."""
    return Codec(LinkFrame, max_frame_size=max_frame_size)


@attrs.define
class _Call:
    event: trio.Event = attrs.Factory(trio.Event)
    result: bytes = b""
    error: Exception | None = None


class Link:
    """An established link to node :attr:`peer_id`. Made by :func:`run_link` / :func:`open_link`.

    Topics: :meth:`send_raft_nowait` / :attr:`raft_inbox`; :meth:`call` (rpc, answered by the
    ``rpc_handler`` given to :func:`run_link` on the other side); :meth:`open_stream` /
    :attr:`incoming_streams` (data); :meth:`send_telemetry_nowait` / :attr:`telemetry_inbox`.
    Inboxes end (``EndOfChannel``) when the link closes. :meth:`close` closes it;
    :meth:`wait_closed` waits for that and says how it ended.
    """

    def __init__(
        self,
        transport: MessageTransport,
        peer_id: str,
        config: LinkConfig,
        rpc_handler: RpcHandler | None,
    ) -> None:
        self._transport = transport
        self.peer_id = peer_id
        self._config = config
        self._handler = rpc_handler
        self._codec = _codec(config.max_frame_size)
        self._outbox = Outbox(self._codec, control=config.control_queue, data=config.data_queue)
        self._raft_send, self.raft_inbox = trio.open_memory_channel[bytes](config.raft_inbox)
        self._raft_handler: Callable[[bytes], None] | None = None
        self._telemetry_send, self.telemetry_inbox = trio.open_memory_channel[TelemetryFrame](
            config.telemetry_inbox
        )
        self._streams_send, self.incoming_streams = trio.open_memory_channel[DataReceiver](
            config.max_streams
        )
        self._scope = trio.CancelScope()
        self._send_scope = trio.CancelScope()
        self._closed: LinkClosed | None = None
        self._done = trio.Event()
        self._calls: dict[int, _Call] = {}
        self._call_ids = itertools.count()
        self._serving: set[int] = set()
        self._out_streams: dict[int, OutStream] = {}
        self._stream_ids = itertools.count()
        self._in_streams: dict[int, InStream] = {}
        self._highest_in_stream = -1
        self._pings: dict[int, tuple[int, float]] = {}
        self._rtt: float | None = None
        self._last_received = trio.current_time()
        self._last_error: str | None = None
        self._bytes_in = self._bytes_out = self._frames_in = self._frames_out = 0
        self._dropped_in = self._duplicates = 0
        self._nursery: trio.Nursery | None = None
        self._control_sent = 0  # control frames written out (Outbox.control_out when taken)
        self._sent_lot = trio.lowlevel.ParkingLot()

    @property
    def remote(self) -> str:
        return self._transport.remote

    @property
    def state(self) -> LinkState:
        return LinkState.OPEN if self._closed is None else LinkState.CLOSED

    @property
    def closed(self) -> LinkClosed | None:
        """How the link ended, or ``None`` while it is open."""
        return self._closed

    @property
    def rtt(self) -> float | None:
        """Round-trip time of the latest answered ping, in seconds."""
        return self._rtt

    # ---- the public topics ----

    def send_raft_nowait(self, body: bytes) -> None:
        """Queue a raft message; :class:`LinkBusy` if the control queue is full,
        :class:`PeerUnreachable` if the link is closed, ``FrameTooLarge`` if it is too big."""
        self._put_nowait(RaftMessage(body=body))

    def receive_raft_with(self, handler: Callable[[bytes], None]) -> None:
        """From now on, hand each received raft body to ``handler`` in the link's receive task
        instead of queueing it in :attr:`raft_inbox` (bodies already queued go to it first, in
        order): a consumer that never blocks saves a task switch per message. ``handler`` must
        return promptly and not raise (an exception closes the link as an internal error)."""
        while True:
            try:
                handler(self.raft_inbox.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        self._raft_handler = handler

    async def wait_sent(self) -> None:
        """Wait until every raft, rpc and telemetry frame queued before this call has been
        written to the transport, or the link closed. No deadline of its own: bound it (a peer
        that stops reading stalls the sender).

        For a caller about to block the Trio thread (an inline fsync) that wants what it just
        queued on the wire first, without waiting for anything queued later."""
        target = self._outbox.control_in
        while self._closed is None and self._control_sent < target:
            await self._sent_lot.park()

    def send_telemetry_nowait(self, frame: TelemetryFrame) -> None:
        """Queue a telemetry frame; errors as for :meth:`send_raft_nowait`."""
        self._put_nowait(frame)

    def _put_nowait(self, frame: LinkFrame) -> None:
        encoded = self._codec.encode(frame)
        try:
            accepted = self._outbox.put_control_nowait(encoded)
        except OutboxClosed:
            raise PeerUnreachable(self._closed) from None
        if not accepted:
            raise LinkBusy(f"control queue to {self.peer_id} is full")

    async def call(self, method: str, body: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        """Call ``method`` on the peer and return its response body.

        ``timeout`` is a parameter (not the caller's cancel scope) because it travels: the peer
        runs its handler under the same deadline.

        Raises :class:`RpcTimeout` when no answer came within ``timeout`` seconds,
        :class:`RpcFailed` with the peer's typed reason, :class:`PeerUnreachable` at once when
        the link is closed or closes while waiting, :class:`LinkBusy` when too many calls are
        pending.
        """
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be finite and > 0, not {timeout!r}")
        if self._closed is not None:
            raise PeerUnreachable(self._closed)
        if len(self._calls) >= self._config.max_pending_calls:
            raise LinkBusy(f"{len(self._calls)} calls to {self.peer_id} are pending")
        call_id = next(self._call_ids)
        timeout_ms = min(math.ceil(timeout * 1000), 2**63)
        frame = self._codec.encode(RpcRequest(call_id, method, body, timeout_ms))
        call = _Call()
        self._calls[call_id] = call
        try:
            with trio.move_on_after(timeout):
                await self._outbox.put_control(frame)
                await call.event.wait()
        except OutboxClosed:
            raise PeerUnreachable(self._closed) from None
        finally:
            self._calls.pop(call_id, None)
        if not call.event.is_set():
            raise RpcTimeout(method, timeout)
        if call.error is not None:
            raise call.error
        return call.result

    def open_stream(self) -> DataSender:
        """A new outgoing data stream (:class:`LinkBusy` beyond ``config.max_streams``)."""
        if self._closed is not None:
            raise PeerUnreachable(self._closed)
        if len(self._out_streams) >= self._config.max_streams:
            raise LinkBusy(f"{len(self._out_streams)} data streams to {self.peer_id} are open")
        state = OutStream(next(self._stream_ids))
        self._out_streams[state.stream_id] = state
        return DataSender(state, self._outbox, self._codec, lambda: self._closed, self._forget_out)

    def _forget_out(self, stream_id: int) -> None:
        self._out_streams.pop(stream_id, None)

    def _forget_in(self, stream_id: int) -> None:
        self._in_streams.pop(stream_id, None)

    # ---- closing ----

    def close(self) -> None:
        """Close the link (code 1000) unless it is closed already; returns at once."""
        self._close(LinkClosed(LinkCloseReason.CLOSED, 1000, "closed by this node", False))

    async def wait_closed(self) -> LinkClosed:
        """Wait until the link is closed and its transport released; how it ended."""
        await self._done.wait()
        assert self._closed is not None
        return self._closed

    def _violation(self, reason: LinkCloseReason, detail: str) -> None:
        # Details quote peer-supplied text (codec paths name unknown keys): keep it printable.
        safe = "".join(c if c.isprintable() else repr(c)[1:-1] for c in one_line(detail))
        self._close(LinkClosed(reason, reason.code, safe[:300], False))

    def _close(self, closed: LinkClosed) -> None:
        if self._closed is not None:
            return
        self._closed = closed
        if closed.reason is not LinkCloseReason.CLOSED:
            self._last_error = f"{closed.reason.label}: {closed.detail}"
            who = "peer closed" if closed.by_peer else "closing"
            log.warning(
                "federation link to %s (%s): %s %s (close %d): %s",
                quote(self.peer_id),
                self.remote,
                who,
                closed.reason.label,
                closed.code,
                closed.detail,
            )
        self._scope.cancel()
        self._send_scope.deadline = min(
            self._send_scope.deadline, trio.current_time() + self._config.close_timeout
        )
        self._outbox.close()  # the sender returns once its current message is sent
        unreachable = PeerUnreachable(closed)
        for call in self._calls.values():
            call.error = unreachable
            call.event.set()
        for channel in (self._raft_send, self._telemetry_send, self._streams_send):
            channel.close()
        self._sent_lot.unpark_all()
        for out_stream in self._out_streams.values():
            out_stream.lot.unpark_all()
        for in_stream in self._in_streams.values():
            in_stream.lot.unpark_all()

    # ---- the tasks ----

    async def _run(self) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._send_task)
                with self._scope:  # cancelled when the link closes
                    async with trio.open_nursery() as tasks:
                        self._nursery = tasks
                        tasks.start_soon(self._guard, self._receive_loop)
                        tasks.start_soon(self._guard, self._heartbeat_loop)
        finally:
            self.close()  # cancelled from outside: still a clean close
            assert self._closed is not None
            with trio.move_on_after(self._config.close_timeout, shield=True):
                if self._closed.by_peer:
                    await self._transport.aclose()
                else:
                    await self._transport.aclose(self._closed.code, self._closed.close_reason)
            self._done.set()

    async def _send_task(self) -> None:
        # Not cancelled on close: the message being sent is finished (within close_timeout) so
        # the transport is not left mid-message and the close frame can follow it.
        with self._send_scope:
            await self._guard(self._send_loop)

    async def _guard(self, task: Callable[[], Awaitable[None]]) -> None:
        """Run one of the link's tasks; a transport close or a bug closes the link, never
        escapes."""
        try:
            await task()
        except TransportClosed as exc:
            reason = LinkCloseReason.from_close_code(exc.code)
            detail = f"{exc.code} {quote(exc.reason)}"
            self._close(LinkClosed(reason, exc.code, detail, exc.by_peer))
        except OutboxClosed:
            pass
        except Exception as exc:
            log.exception("federation link to %s: internal error", quote(self.peer_id))
            self._violation(LinkCloseReason.INTERNAL_ERROR, type(exc).__name__)

    async def _send_loop(self) -> None:
        while True:
            frame = await self._outbox.get()
            taken = self._outbox.control_out
            await self._transport.send_message(frame)
            self._bytes_out += len(frame)
            self._frames_out += 1
            if taken != self._control_sent:
                self._control_sent = taken
                self._sent_lot.unpark_all()

    async def _receive_loop(self) -> None:
        while self._closed is None:
            try:
                message = await self._transport.get_message()
            except MessageTooLarge as exc:
                self._violation(LinkCloseReason.FRAME_TOO_LARGE, str(exc))
                return
            except TransportViolation as exc:
                self._violation(LinkCloseReason.PROTOCOL_VIOLATION, str(exc))
                return
            self._last_received = trio.current_time()
            self._bytes_in += len(message)
            self._frames_in += 1
            try:
                frame = self._codec.decode(message)
            except FrameTooLarge as exc:
                self._violation(LinkCloseReason.FRAME_TOO_LARGE, str(exc))
                return
            except WireError as exc:
                self._violation(LinkCloseReason.MALFORMED_FRAME, str(exc)[:200])
                return
            self._dispatch(frame)

    def _dispatch(self, frame: LinkFrame) -> None:
        """Route one frame; never blocks (full inboxes drop, the rest is bounded by credit
        and limits)."""
        if isinstance(frame, Ping):
            self._outbox.set_pong(Pong(seq=frame.seq, sent_ns=frame.sent_ns))
        elif isinstance(frame, Pong):
            self._on_pong(frame)
        elif isinstance(frame, RaftMessage):
            if self._raft_handler is not None:
                self._raft_handler(frame.body)
            else:
                self._deliver(self._raft_send, frame.body)
        elif isinstance(frame, TelemetryDigest | TelemetryPush):
            self._deliver(self._telemetry_send, frame)
        elif isinstance(frame, RpcRequest):
            self._on_request(frame)
        elif isinstance(frame, RpcResponse | RpcError):
            self._on_answer(frame)
        elif isinstance(frame, DataChunk):
            self._on_chunk(frame)
        elif isinstance(frame, DataCredit):
            out_stream = self._out_streams.get(frame.stream_id)
            if out_stream is not None and frame.limit > out_stream.credit:
                out_stream.credit = frame.limit
                out_stream.lot.unpark_all()
        elif isinstance(frame, DataStop):
            out_stream = self._out_streams.pop(frame.stream_id, None)
            if out_stream is not None:
                out_stream.stopped = True
                out_stream.lot.unpark_all()

    def _deliver(self, channel: trio.MemorySendChannel[T], item: T) -> None:
        try:
            channel.send_nowait(item)
        except trio.WouldBlock:
            self._dropped_in += 1
        except trio.BrokenResourceError:  # the consumer closed its end: not interested
            self._dropped_in += 1

    def _on_pong(self, pong: Pong) -> None:
        sent = self._pings.get(pong.seq)
        if sent is not None and sent[0] == pong.sent_ns:
            self._rtt = trio.current_time() - sent[1]
            for seq in [s for s in self._pings if s <= pong.seq]:
                del self._pings[seq]

    def _on_request(self, frame: RpcRequest) -> None:
        if frame.call_id in self._serving:
            self._violation(
                LinkCloseReason.PROTOCOL_VIOLATION,
                f"rpc call id {frame.call_id} reused while that call is in flight",
            )
            return
        if self._handler is None or len(self._serving) >= self._config.max_concurrent_rpcs:
            reason = "no_handler" if self._handler is None else "busy"
            error = RpcError(frame.call_id, reason, f"{reason.replace('_', ' ')} on this node")
            if reason == "busy":
                self._dropped_in += 1
            self._outbox.put_control_nowait(self._codec.encode(error))  # full: caller times out
            return
        assert self._nursery is not None
        self._serving.add(frame.call_id)
        self._nursery.start_soon(self._guard, functools.partial(self._serve, frame))

    async def _serve(self, frame: RpcRequest) -> None:
        assert self._handler is not None
        timeout = min(max(frame.timeout_ms, 0) / 1000, self._config.max_rpc_timeout)
        reply: RpcResponse | RpcError
        try:
            with trio.move_on_after(timeout) as scope:
                try:
                    body = await self._handler(frame.method, frame.body)
                    reply = RpcResponse(frame.call_id, body)
                except RpcFailed as exc:
                    reply = RpcError(frame.call_id, exc.reason, exc.message)
                except Exception as exc:
                    log.exception("rpc handler for %s failed", quote(frame.method))
                    reply = RpcError(frame.call_id, "handler_failed", type(exc).__name__)
            if scope.cancelled_caught:
                reply = RpcError(frame.call_id, "deadline_exceeded", f"no answer in {timeout} s")
            try:
                encoded = self._codec.encode(reply)
            except WireError as exc:
                reply = RpcError(frame.call_id, "handler_failed", f"bad response: {exc}"[:200])
                encoded = self._codec.encode(reply)
            await self._outbox.put_control(encoded)
        finally:
            self._serving.discard(frame.call_id)

    def _on_answer(self, frame: RpcResponse | RpcError) -> None:
        call = self._calls.get(frame.call_id)
        if call is None or call.event.is_set():
            return  # the caller gave up (timeout): a late answer
        if isinstance(frame, RpcResponse):
            call.result = frame.body
        else:
            call.error = RpcFailed(frame.reason, frame.message)
        call.event.set()

    def _on_chunk(self, chunk: DataChunk) -> None:
        st = self._in_streams.get(chunk.stream_id)
        if st is None:
            if chunk.stream_id <= self._highest_in_stream:
                self._duplicates += 1  # a stream that ended or was stopped
                return
            if chunk.seq != 0:
                self._violation(
                    LinkCloseReason.DATA_GAP,
                    f"data stream {chunk.stream_id} started at seq {chunk.seq}, not 0",
                )
                return
            self._highest_in_stream = chunk.stream_id
            if len(self._in_streams) >= self._config.max_streams:
                self._dropped_in += 1
                self._outbox.stop_stream(chunk.stream_id)
                return
            st = InStream(chunk.stream_id)
            receiver = DataReceiver(st, self._outbox, lambda: self._closed, self._forget_in)
            try:
                self._streams_send.send_nowait(receiver)
            except (trio.WouldBlock, trio.BrokenResourceError):
                self._dropped_in += 1
                self._outbox.stop_stream(chunk.stream_id)
                return
            self._in_streams[chunk.stream_id] = st
        if chunk.seq < st.expected or st.ended:
            self._duplicates += 1  # a copy of a chunk delivered already, or after the end
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

    async def _heartbeat_loop(self) -> None:
        interval = self._config.heartbeat_interval
        liveness = self._config.liveness_timeout
        seq = 0
        next_ping = trio.current_time()
        while True:
            now = trio.current_time()
            silent = now - self._last_received
            if silent >= liveness:
                self._violation(
                    LinkCloseReason.LIVENESS_TIMEOUT, f"nothing received for {silent:.3f} s"
                )
                return
            if now >= next_ping:
                seq += 1
                sent_ns = int(now * 1e9)
                self._pings[seq] = (sent_ns, now)
                if len(self._pings) > _MAX_PINGS_OUTSTANDING:
                    del self._pings[min(self._pings)]
                self._outbox.set_ping(Ping(seq=seq, sent_ns=sent_ns))
                next_ping = now + interval
            await trio.sleep_until(min(next_ping, self._last_received + liveness))

    def statistics(self) -> LinkStatistics:
        return LinkStatistics(
            peer_id=self.peer_id,
            remote=self.remote,
            state=self.state,
            rtt_ms=None if self._rtt is None else self._rtt * 1000,
            bytes_in=self._bytes_in,
            bytes_out=self._bytes_out,
            frames_in=self._frames_in,
            frames_out=self._frames_out,
            last_error=self._last_error,
            closed=self._closed,
            control_queued=self._outbox.control_queued,
            data_queued=self._outbox.data_queued,
            raft_queued=self._raft_send.statistics().current_buffer_used,
            telemetry_queued=self._telemetry_send.statistics().current_buffer_used,
            pending_calls=len(self._calls),
            rpcs_in_flight=len(self._serving),
            streams_in=len(self._in_streams),
            streams_out=len(self._out_streams),
            dropped_in=self._dropped_in,
            duplicates_dropped=self._duplicates,
        )
