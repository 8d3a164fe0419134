"""Frames of an authenticated federation link: heartbeats and the four topics.

After the handshake (:mod:`skulk.wire.federation`) both sides of a link send :data:`LinkFrame`\\ s,
one CBOR body per WebSocket binary message (or per length-prefixed record on a byte stream).
The protocol version was settled by the handshake, so link frames carry none. Topics:

* heartbeats: :class:`Ping` / :class:`Pong` (the pong echoes the ping), for RTT and liveness;
* ``raft``: :class:`RaftMessage`, an opaque consensus message (lossy, like a datagram);
* ``rpc``: :class:`RpcRequest` answered by exactly one :class:`RpcResponse` or :class:`RpcError`
  with the same ``call_id`` (unless the link dies first);
* ``data``: :class:`DataChunk` streams, ordered per stream by ``seq`` and flow-controlled by
  credit (:class:`DataCredit`, :class:`DataStop`, :class:`DataAbort`). A data chunk is not a
  CBOR frame: it is a *binary data frame* (:func:`encode_data_chunk` /
  :func:`decode_data_chunk`), a fixed 18-byte header and the raw body, so a chunk's bytes are
  never CBOR-encoded or decoded. A message whose first byte is :data:`DATA_FRAME_KIND` (``0x00``,
  never the first byte of a CBOR map) is one; every other message is a CBOR :data:`LinkFrame`;
* ``telemetry``: :class:`~skulk.wire.telemetry.TelemetryDigest` and
  :class:`~skulk.wire.telemetry.TelemetryPush`, carried as they are.

The link driver (:mod:`skulk.federation._link`) enforces the rules; ``specs/wire.cddl`` states
them normatively.
"""

from __future__ import annotations

import struct

import attrs

from ._errors import MalformedFrame
from .telemetry import TelemetryDigest, TelemetryPush

LINK_MAX_FRAME_SIZE = 4 * 1024 * 1024
"""Default limit on one link frame's CBOR body (bytes); the WebSocket message size limit is set
to the same value. Larger payloads (snapshots) are chunked by their topic."""

DATA_INITIAL_CREDIT = 16
"""Chunks a sender may send on a new data stream before the receiver grants more: a stream's
chunks with ``seq < DATA_INITIAL_CREDIT`` need no :class:`DataCredit`."""


@attrs.frozen
class Ping:
    """Heartbeat. The receiver answers with a :class:`Pong` carrying the same values;
    ``sent_ns`` is the sender's monotonic clock (meaningful to the sender only)."""

    seq: int
    sent_ns: int


@attrs.frozen
class Pong:
    """The answer to the :class:`Ping` with this ``seq`` and ``sent_ns``."""

    seq: int
    sent_ns: int


@attrs.frozen
class RaftMessage:
    """One consensus message (its own encoding, opaque here). May be dropped by a full
    receiver: Raft tolerates message loss."""

    body: bytes


@attrs.frozen
class RpcRequest:
    """Call ``method`` on the receiver. ``call_id`` is unique among the sender's calls in
    flight on this link; ``timeout_ms`` is the caller's deadline, which the receiver applies
    to the handler (capped by its own limit)."""

    call_id: int
    method: str
    body: bytes
    timeout_ms: int


@attrs.frozen
class RpcResponse:
    """The handler's result for the call ``call_id``."""

    call_id: int
    body: bytes


@attrs.frozen
class RpcError:
    """The call ``call_id`` failed. ``reason`` is a stable snake_case name: the link's own
    (``no_handler``, ``handler_failed``, ``busy``, ``deadline_exceeded``) or one the handler
    chose; ``message`` is for humans."""

    call_id: int
    reason: str
    message: str


@attrs.frozen
class DataChunk:
    """Chunk ``seq`` (0, 1, 2, ...) of the sender's data stream ``stream_id``. A sender numbers
    its streams upwards and never reuses an id on a link. ``end`` marks the last chunk.

    Carried as a binary data frame (:func:`encode_data_chunk`), not as CBOR."""

    stream_id: int
    seq: int
    body: bytes
    end: bool


DATA_FRAME_KIND = 0x00
"""The first byte of a binary data frame. A CBOR link frame is a map (first byte 0xA0-0xBF)."""
DATA_HEADER = struct.Struct(">BBQQ")
"""A binary data frame's header: kind (:data:`DATA_FRAME_KIND`), flags, ``stream_id``, ``seq``
(both unsigned 64-bit, big-endian); the chunk's body follows, to the end of the message."""
DATA_HEADER_SIZE = DATA_HEADER.size
DATA_FLAG_END = 0x01
"""The only flag: the stream's last chunk. Any other flag bit set is a malformed frame."""
_MAX_U64 = 2**64 - 1


def encode_data_chunk(
    stream_id: int, seq: int, body: bytes | bytearray | memoryview, end: bool
) -> bytes:
    """The binary data frame of chunk ``seq`` of stream ``stream_id`` (one copy of ``body``)."""
    if not (0 <= stream_id <= _MAX_U64 and 0 <= seq <= _MAX_U64):
        raise ValueError(f"stream id {stream_id} or seq {seq} outside 0..2**64-1")
    head = DATA_HEADER.pack(DATA_FRAME_KIND, DATA_FLAG_END if end else 0, stream_id, seq)
    return head + body


def is_data_frame(message: bytes) -> bool:
    """Whether ``message`` is a binary data frame (by its first byte; not yet validated)."""
    return bool(message) and message[0] == DATA_FRAME_KIND


def decode_data_chunk(message: bytes) -> DataChunk:
    """The chunk in a binary data frame. Raises :class:`~skulk.wire.MalformedFrame` for a
    message shorter than the header, of another kind, or with an unknown flag bit set. The
    size limit is the transport's (a data frame is one link message)."""
    if len(message) < DATA_HEADER_SIZE:
        raise MalformedFrame(f"a data frame of {len(message)} bytes is shorter than its header")
    kind, flags, stream_id, seq = DATA_HEADER.unpack_from(message)
    if kind != DATA_FRAME_KIND:
        raise MalformedFrame(f"a data frame of kind {kind:#04x}, not {DATA_FRAME_KIND:#04x}")
    if flags & ~DATA_FLAG_END:
        raise MalformedFrame(f"a data frame with unknown flags {flags:#04x}")
    return DataChunk(stream_id, seq, message[DATA_HEADER_SIZE:], bool(flags & DATA_FLAG_END))


@attrs.frozen
class DataCredit:
    """From a stream's receiver: the sender may send chunks with ``seq < limit``."""

    stream_id: int
    limit: int


@attrs.frozen
class DataStop:
    """From a stream's receiver: it no longer wants the stream; the sender stops sending it."""

    stream_id: int


@attrs.frozen
class DataAbort:
    """From a stream's sender: the stream ends here, unfinished; no more chunks of it follow.
    ``reason`` is a stable snake_case name: the link's own ``credit_timeout`` (the receiver
    granted no credit within the sender's deadline) or one the sending side chose."""

    stream_id: int
    reason: str


LinkFrame = (
    Ping
    | Pong
    | RaftMessage
    | RpcRequest
    | RpcResponse
    | RpcError
    | DataCredit
    | DataStop
    | DataAbort
    | TelemetryDigest
    | TelemetryPush
)
