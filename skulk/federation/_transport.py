"""Message transports: what a federation link runs over.

A link needs whole binary messages in both directions and a close carrying a code and a reason
(WebSocket semantics). :class:`MessageTransport` is that interface; two adapters provide it:

* :class:`WebSocketTransport` over a trio-websocket ``WebSocketConnection`` (what nodes use);
* :class:`StreamTransport` over any ``trio.abc.Stream``: each message is a 4-byte big-endian
  length and the body; a close is the length ``0xFFFFFFFF``, a 2-byte code, a 1-byte reason
  length and the UTF-8 reason (``specs/wire.cddl``). Used in-process with trio's memory streams
  (:func:`memory_transport_pair`), and usable over any socket.

Errors, the same for every adapter:

* :class:`TransportClosed` (``code``, ``reason``, ``by_peer``) from ``send_message`` /
  ``get_message`` once the transport is closed: by the peer (its close code and reason; ``1006``
  when the connection ended without a close), or by this side (``aclose``).
* :class:`MessageTooLarge` from ``get_message`` for an incoming message over the limit (checked
  before the body is read) and from ``send_message`` for an outgoing one.
* :class:`TransportViolation` from ``get_message`` for something that is not a binary message
  (a WebSocket text message).
"""

from __future__ import annotations

import struct
from typing import Protocol

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from ._refusal import fit_close_reason

ABNORMAL_CLOSURE = 1006
"""The close code reported when a connection ended without a close (RFC 6455)."""

_PREFIX = struct.Struct(">I")
_CLOSE_MARK = 0xFFFF_FFFF
_CLOSE_HEAD = struct.Struct(">HB")
MAX_STREAM_MESSAGE_SIZE = _CLOSE_MARK - 1
_RECEIVE_CHUNK = 65536


class TransportError(Exception):
    """Base of the transport's typed errors."""


class TransportClosed(TransportError):
    """The transport is closed: ``code``/``reason`` of the close; ``by_peer`` says who closed."""

    def __init__(self, code: int, reason: str, *, by_peer: bool) -> None:
        super().__init__(f"transport closed by {'peer' if by_peer else 'us'}: {code} {reason!r}")
        self.code = code
        self.reason = reason
        self.by_peer = by_peer


class MessageTooLarge(TransportError):
    """A message of ``size`` bytes exceeds the transport's ``limit``."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"message of {size} bytes exceeds the limit of {limit} bytes")
        self.size = size
        self.limit = limit


class TransportViolation(TransportError):
    """The peer sent something that is not a binary message."""


class MessageTransport(Protocol):
    """Whole binary messages both ways, and a close with a code and a reason.

    ``send_message`` must not be called concurrently with itself (the link has one sender task);
    ``get_message`` likewise. ``aclose`` may be called at any time, more than once (later calls
    do nothing), and is bounded only by the caller's deadline: call it under
    ``trio.move_on_after(t, shield=True)``. ``remote`` names the peer for log lines.
    """

    @property
    def remote(self) -> str: ...

    async def send_message(self, data: bytes) -> None: ...

    async def get_message(self) -> bytes: ...

    async def aclose(self, code: int = 1000, reason: str = "") -> None: ...


class WebSocketTransport:
    """:class:`MessageTransport` over a trio-websocket connection.

    Open the connection with ``max_message_size`` equal to the link's frame limit: trio-websocket
    itself then closes a connection that receives a larger message (code 1009), which surfaces
    here as :class:`TransportClosed`. A text message is a :class:`TransportViolation`.
    """

    def __init__(self, ws: WebSocketConnection, *, remote: str | None = None) -> None:
        self._ws = ws
        self._closed_locally = False
        if remote is None:
            try:
                remote = str(ws.remote)
            except Exception:  # memory streams have no address
                remote = "websocket peer"
        self._remote = remote

    @property
    def remote(self) -> str:
        return self._remote

    def _closed(self, exc: ConnectionClosed) -> TransportClosed:
        reason = exc.reason
        code = reason.code if reason is not None and reason.code is not None else ABNORMAL_CLOSURE
        text = (reason.reason if reason is not None else None) or ""
        return TransportClosed(code, text, by_peer=not self._closed_locally)

    async def send_message(self, data: bytes) -> None:
        try:
            await self._ws.send_message(data)
        except ConnectionClosed as exc:
            raise self._closed(exc) from None

    async def get_message(self) -> bytes:
        try:
            message = await self._ws.get_message()
        except ConnectionClosed as exc:
            raise self._closed(exc) from None
        if isinstance(message, str):
            raise TransportViolation("a text message (link frames are binary messages)")
        return bytes(message)

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        if self._ws.closed is None:
            self._closed_locally = True
        await self._ws.aclose(code, fit_close_reason(reason) or None)


class StreamTransport:
    """:class:`MessageTransport` over a byte stream with length-prefixed messages.

    ``max_message_size`` bounds message bodies both ways (at most ``2**32 - 2``); an incoming
    length prefix over it raises :class:`MessageTooLarge` before any of the body is read, and
    reads never ask the stream for more than the current message still needs, so at most one
    message is buffered. A close sends the close record (unless a cancelled send may have left a
    partial message on the stream), then closes the stream.
    """

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        max_message_size: int,
        remote: str = "stream peer",
    ) -> None:
        if not 1 <= max_message_size <= MAX_STREAM_MESSAGE_SIZE:
            raise ValueError(f"max_message_size must be in 1..{MAX_STREAM_MESSAGE_SIZE}")
        self._stream = stream
        self._limit = max_message_size
        self._remote = remote
        self._send_lock = trio.Lock()
        self._buffer = bytearray()
        self._closed: TransportClosed | None = None
        self._send_broken = False

    @property
    def remote(self) -> str:
        return self._remote

    async def send_message(self, data: bytes) -> None:
        if self._closed is not None:
            raise self._closed
        if len(data) > self._limit:
            raise MessageTooLarge(len(data), self._limit)
        await self._send_raw(_PREFIX.pack(len(data)) + data)

    async def _send_raw(self, record: bytes) -> None:
        async with self._send_lock:
            done = False
            try:
                await self._stream.send_all(record)
                done = True
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise self._lost() from None
            finally:
                if not done:
                    self._send_broken = True  # part of the record may be on the stream

    def _lost(self) -> TransportClosed:
        if self._closed is None:
            self._closed = TransportClosed(
                ABNORMAL_CLOSURE, "connection lost without a close", by_peer=True
            )
        return self._closed

    async def _read_exactly(self, size: int) -> bytes:
        while len(self._buffer) < size:
            try:
                chunk = await self._stream.receive_some(
                    min(size - len(self._buffer), _RECEIVE_CHUNK)
                )
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise self._lost() from None
            if not chunk:
                raise self._lost()
            self._buffer += chunk
        data = bytes(self._buffer[:size])
        del self._buffer[:size]
        return data

    async def get_message(self) -> bytes:
        if self._closed is not None:
            raise self._closed
        (size,) = _PREFIX.unpack(await self._read_exactly(_PREFIX.size))
        if size == _CLOSE_MARK:
            code, length = _CLOSE_HEAD.unpack(await self._read_exactly(_CLOSE_HEAD.size))
            reason = (await self._read_exactly(length)).decode("utf-8", "replace")
            self._closed = TransportClosed(code, reason, by_peer=True)
            raise self._closed
        if size > self._limit:
            raise MessageTooLarge(size, self._limit)
        return await self._read_exactly(size)

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        if self._closed is not None and not self._closed.by_peer:
            return
        peer_closed = self._closed is not None
        self._closed = TransportClosed(code, reason, by_peer=False)
        try:
            if not peer_closed and not self._send_broken and not self._send_lock.locked():
                text = fit_close_reason(reason).encode("utf-8")
                record = _PREFIX.pack(_CLOSE_MARK) + _CLOSE_HEAD.pack(code, len(text)) + text
                try:
                    await self._stream.send_all(record)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
        finally:
            await self._stream.aclose()


def memory_transport_pair(
    *, max_message_size: int, lockstep: bool = True
) -> tuple[StreamTransport, StreamTransport]:
    """Two connected :class:`StreamTransport`\\ s in memory, for tests.

    ``lockstep=True`` uses :func:`trio.testing.lockstep_stream_pair`: a send returns only once
    the peer has read it, like a socket with no buffer, so backpressure is real. ``False`` uses
    :func:`trio.testing.memory_stream_pair` (unbounded buffer: sends never block).
    """
    import trio.testing  # not imported by `import trio`; only tests need it

    left: trio.abc.Stream
    right: trio.abc.Stream
    if lockstep:
        left, right = trio.testing.lockstep_stream_pair()
    else:
        left, right = trio.testing.memory_stream_pair()
    return (
        StreamTransport(left, max_message_size=max_message_size, remote="memory-a"),
        StreamTransport(right, max_message_size=max_message_size, remote="memory-b"),
    )
