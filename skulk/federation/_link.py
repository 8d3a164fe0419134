"""An authenticated federation link: topics, heartbeats, clean failure.

A :class:`Link` is made by :func:`~skulk.federation.run_link` / ``open_link``
(:mod:`skulk.federation._linkopen`) once the handshake established the peer's identity.

Once established the link runs three tasks until it closes: a *sender* (drains the
:class:`~skulk.federation._outbox.Outbox`, control before data), a *receiver* (decodes each
message with a strict codec (a binary data frame by its fixed header, any other message as one
CBOR link frame) and routes it without ever blocking: raft and telemetry into
bounded inboxes that drop when full, rpc requests to handler tasks under a concurrency limit,
data chunks into per-stream buffers bounded by credit) and a *heartbeat* (pings, RTT,
liveness). Whatever the peer sends, the link's tasks never raise: bad input closes the link
with a typed :class:`LinkCloseReason` and its close code, pending calls fail at once with
:class:`PeerUnreachable`, inboxes end, and the transport is closed shielded and bounded.

The rpc topic's calls both ways are kept by :class:`~skulk.federation._linkrpc.LinkRpc`, the
data streams by :class:`~skulk.federation._linkstreams.StreamTable`; the link routes frames to
them and closes them with itself.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from skulk.wire import Codec, FrameTooLarge, WireError
from skulk.wire.link import (
    DataAbort,
    DataCredit,
    DataStop,
    LinkFrame,
    Ping,
    Pong,
    RaftMessage,
    RpcError,
    RpcRequest,
    RpcResponse,
    decode_data_chunk,
    is_data_frame,
)
from skulk.wire.telemetry import TelemetryDigest, TelemetryFrame, TelemetryPush

from ._datastream import DataReceiver, DataSender
from ._linkbase import (
    LinkBusy,
    LinkClosed,
    LinkCloseReason,
    LinkConfig,
    LinkState,
    LinkStatistics,
    PeerUnreachable,
)
from ._linkrpc import LinkRpc, RpcHandler
from ._linkstreams import StreamTable
from ._outbox import Outbox, OutboxClosed
from ._refusal import one_line, quote
from ._transport import MessageTooLarge, MessageTransport, TransportClosed, TransportViolation

log = logging.getLogger("skulk.federation.link")

_MAX_PINGS_OUTSTANDING = 8
T = TypeVar("T")


@functools.lru_cache(maxsize=8)
def _codec(max_frame_size: int) -> Codec[LinkFrame]:
    """Codecs are immutable and costly to build (hooks for every frame class): share them."""
    return Codec(LinkFrame, max_frame_size=max_frame_size)


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
        self._rpc = LinkRpc(
            peer_id,
            config,
            self._codec,
            self._outbox,
            rpc_handler,
            closed=lambda: self._closed,
            violation=self._violation,
            spawn=self._spawn,
        )
        self._streams = StreamTable(
            peer_id,
            config.max_streams,
            config.credit_timeout,
            self._outbox,
            self._streams_send,
            closed=lambda: self._closed,
            violation=self._violation,
        )
        self._pings: dict[int, tuple[int, float]] = {}
        self._rtt: float | None = None
        self._last_received = trio.current_time()
        self._last_error: str | None = None
        self._bytes_in = self._bytes_out = self._frames_in = self._frames_out = 0
        self._dropped_in = 0  # raft/telemetry frames dropped on a full inbox
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

    def send_raft_nowait(self, body: bytes) -> int:
        """Queue a raft message; :class:`LinkBusy` if the control queue is full,
        :class:`PeerUnreachable` if the link is closed, ``FrameTooLarge`` if it is too big.
        Returns the size of the frame queued (bytes), for the sender's own counters."""
        return self._put_nowait(RaftMessage(body=body))

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

    def send_telemetry_nowait(self, frame: TelemetryFrame) -> int:
        """Queue a telemetry frame; errors and result as for :meth:`send_raft_nowait`."""
        return self._put_nowait(frame)

    def _put_nowait(self, frame: LinkFrame) -> int:
        encoded = self._codec.encode(frame)
        try:
            accepted = self._outbox.put_control_nowait(encoded)
        except OutboxClosed:
            raise PeerUnreachable(self._closed) from None
        if not accepted:
            raise LinkBusy(f"control queue to {self.peer_id} is full")
        return len(encoded)

    async def call(self, method: str, body: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        """Call ``method`` on the peer and return its response body.

        ``timeout`` is a parameter (not the caller's cancel scope) because it travels: the peer
        runs its handler under the same deadline.

        Raises :class:`RpcTimeout` when no answer came within ``timeout`` seconds,
        :class:`RpcFailed` with the peer's typed reason, :class:`PeerUnreachable` at once when
        the link is closed or closes while waiting, :class:`LinkBusy` when too many calls are
        pending.
        """
        return await self._rpc.call(method, body, timeout)

    def open_stream(self) -> DataSender:
        """A new outgoing data stream (:class:`LinkBusy` beyond ``config.max_streams``)."""
        return self._streams.open()

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
        self._rpc.fail_all(PeerUnreachable(closed))
        for channel in (self._raft_send, self._telemetry_send, self._streams_send):
            channel.close()
        self._sent_lot.unpark_all()
        self._streams.wake_all()

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

    def _spawn(self, task: Callable[[], Awaitable[None]]) -> None:
        """Start ``task`` in the link's nursery, guarded (for the rpc handlers' tasks)."""
        assert self._nursery is not None
        self._nursery.start_soon(self._guard, task)

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
            if is_data_frame(message):  # a data chunk: a fixed header and the raw body
                try:
                    chunk = decode_data_chunk(message)
                except WireError as exc:
                    self._violation(LinkCloseReason.MALFORMED_FRAME, str(exc)[:200])
                    return
                self._streams.on_chunk(chunk)
                continue
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
            self._rpc.on_request(frame)
        elif isinstance(frame, RpcResponse | RpcError):
            self._rpc.on_answer(frame)
        elif isinstance(frame, DataAbort):
            self._streams.on_abort(frame)
        elif isinstance(frame, DataCredit):
            self._streams.on_credit(frame)
        elif isinstance(frame, DataStop):
            self._streams.on_stop(frame)

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
            pending_calls=self._rpc.pending,
            rpcs_in_flight=self._rpc.in_flight,
            streams_in=self._streams.inbound,
            streams_out=self._streams.outbound,
            dropped_in=self._dropped_in + self._rpc.dropped + self._streams.dropped,
            duplicates_dropped=self._streams.duplicates,
        )
