"""Frames of an authenticated federation link: heartbeats and the four topics.

After the handshake (:mod:`skulk.wire.federation`) both sides of a link send :data:`LinkFrame`\\ s,
one CBOR body per WebSocket binary message (or per length-prefixed record on a byte stream).
The protocol version was settled by the handshake, so link frames carry none. Topics:

* heartbeats: :class:`Ping` / :class:`Pong` (the pong echoes the ping), for RTT and liveness;
* ``raft``: :class:`RaftMessage`, an opaque consensus message (lossy, like a datagram);
* ``rpc``: :class:`RpcRequest` answered by exactly one :class:`RpcResponse` or :class:`RpcError`
  with the same ``call_id`` (unless the link dies first);
* ``data``: :class:`DataChunk` streams, ordered per stream by ``seq`` and flow-controlled by
  credit (:class:`DataCredit`, :class:`DataStop`);
* ``telemetry``: :class:`~skulk.wire.telemetry.TelemetryDigest` and
  :class:`~skulk.wire.telemetry.TelemetryPush`, carried as they are.

The link driver (:mod:`skulk.federation._link`) enforces the rules; ``specs/wire.cddl`` states
them normatively.
"""

from __future__ import annotations

import attrs

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
    its streams upwards and never reuses an id on a link. ``end`` marks the last chunk."""

    stream_id: int
    seq: int
    body: bytes
    end: bool


@attrs.frozen
class DataCredit:
    """From a stream's receiver: the sender may send chunks with ``seq < limit``."""

    stream_id: int
    limit: int


@attrs.frozen
class DataStop:
    """From a stream's receiver: it no longer wants the stream; the sender stops sending it."""

    stream_id: int


LinkFrame = (
    Ping
    | Pong
    | RaftMessage
    | RpcRequest
    | RpcResponse
    | RpcError
    | DataChunk
    | DataCredit
    | DataStop
    | TelemetryDigest
    | TelemetryPush
)
