"""What a federation link's users see: its configuration, close reasons, errors and statistics.

The link itself is in :mod:`skulk.federation._link`; its data streams in
:mod:`skulk.federation._datastream`.
"""

from __future__ import annotations

import enum
import math

import attrs

from skulk.wire.link import LINK_MAX_FRAME_SIZE

from ._refusal import Refusal, fit_close_reason, one_line


class LinkCloseReason(enum.Enum):
    """Why a link closed; the value is the WebSocket close code the closing side sends.

    Codes 4100-4199 are the link's own (the handshake's are 4001-4008, see
    :class:`~skulk.federation.RefusalReason`).
    """

    CLOSED = 1000
    """A side closed the link on purpose (shutdown, link replaced)."""
    CONNECTION_LOST = 1006
    """The connection ended without a close, or with a code the link does not know."""
    INTERNAL_ERROR = 1011
    """A bug on the closing side (logged there with its traceback)."""
    MALFORMED_FRAME = 4100
    """A message that is not a valid link frame (bad CBOR, unknown tag, wrong types)."""
    FRAME_TOO_LARGE = 4101
    """A message over the frame size limit (WebSocket 1009 reads as this too)."""
    PROTOCOL_VIOLATION = 4102
    """A valid frame used wrongly: a text message, an rpc call id reused while in flight."""
    DATA_GAP = 4103
    """A data chunk skipped a sequence number: chunks were lost or reordered."""
    LIVENESS_TIMEOUT = 4104
    """Nothing at all arrived from the peer within the liveness timeout."""
    FLOW_CONTROL = 4105
    """A data chunk beyond the credit the receiver granted."""

    @property
    def code(self) -> int:
        return self.value

    @property
    def label(self) -> str:
        """Stable snake_case name (``data_gap``) for logs, metrics and close reasons."""
        return self.name.lower()

    @classmethod
    def from_close_code(cls, code: int) -> LinkCloseReason:
        """The reason a peer's close code stands for (unknown codes: ``CONNECTION_LOST``)."""
        for reason in cls:
            if reason.value == code:
                return reason
        if code == 1009:  # WebSocket "message too big", sent by trio-websocket itself
            return cls.FRAME_TOO_LARGE
        if code == 1001:  # going away
            return cls.CLOSED
        return cls.CONNECTION_LOST


@attrs.frozen
class LinkClosed:
    """How a link ended: ``reason``, the close ``code`` on the wire (the peer's own code when
    ``by_peer``), and one line of ``detail`` for logs (peer-supplied text is quoted)."""

    reason: LinkCloseReason
    code: int
    detail: str
    by_peer: bool

    @property
    def close_reason(self) -> str:
        """What the closing side says in its close frame (fits the 123-byte limit)."""
        return fit_close_reason(f"{self.reason.label}: {one_line(self.detail)}")


class LinkState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be finite and > 0, not {value!r}")


@attrs.frozen
class LinkConfig:
    """Limits and timings of a link. Both sides of a link should use the same values.

    ``max_frame_size`` bounds one frame's body both ways; the transport's own limit (the
    WebSocket ``max_message_size``) must be the same. Queue sizes are in frames. Times are in
    seconds.
    """

    max_frame_size: int = LINK_MAX_FRAME_SIZE
    handshake_timeout: float = attrs.field(default=10.0, validator=_positive)
    heartbeat_interval: float = attrs.field(default=1.0, validator=_positive)
    liveness_timeout: float = attrs.field(default=5.0, validator=_positive)
    close_timeout: float = attrs.field(default=1.0, validator=_positive)
    max_rpc_timeout: float = attrs.field(default=300.0, validator=_positive)
    control_queue: int = 256
    """Outgoing raft, rpc and telemetry frames waiting for the sender."""
    data_queue: int = 64
    """Outgoing data chunks waiting for the sender (all streams together)."""
    raft_inbox: int = 256
    """Received raft messages not yet taken; more are dropped (counted)."""
    telemetry_inbox: int = 64
    """Received telemetry frames not yet taken; more are dropped (counted)."""
    max_pending_calls: int = 1024
    """Outgoing rpc calls waiting for an answer; more raise :class:`LinkBusy`."""
    max_concurrent_rpcs: int = 64
    """Incoming rpc calls being handled; more are answered ``busy``."""
    max_streams: int = 256
    """Open data streams per direction: outgoing beyond it raise :class:`LinkBusy`, incoming
    beyond it are stopped at once (the sender sees :class:`StreamStopped`)."""
    credit_timeout: float = attrs.field(default=30.0, validator=_positive)
    """How long a data stream's ``send`` waits for the receiver's credit. Past it the stream is
    aborted (``DataAbort`` with reason ``credit_timeout``), its slot freed, and the sender sees
    :class:`StreamStarved`: a peer that never grants credit cannot hold a stream for ever."""

    def __attrs_post_init__(self) -> None:
        for name in (
            "max_frame_size",
            "control_queue",
            "data_queue",
            "raft_inbox",
            "telemetry_inbox",
            "max_pending_calls",
            "max_concurrent_rpcs",
            "max_streams",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, not {value!r}")


class LinkError(Exception):
    """Base of the link's typed errors."""


class HandshakeFailed(LinkError):
    """The link was never established. ``refusal`` is the typed reason when one side refused
    (``refusal.by_peer`` tells which; the refusal was logged once); ``None`` when the transport
    ended without a handshake close code (``detail`` says how)."""

    def __init__(self, refusal: Refusal | None, detail: str) -> None:
        super().__init__(detail)
        self.refusal = refusal
        self.detail = detail


class PeerUnreachable(LinkError):
    """The link is closed (or closed while waiting); ``closed`` says how it ended."""

    def __init__(self, closed: LinkClosed | None) -> None:
        what = f"{closed.reason.label}: {closed.detail}" if closed else "link is not open"
        super().__init__(f"peer unreachable ({what})")
        self.closed = closed


class LinkBusy(LinkError):
    """A bounded queue or limit of the link is full; try later or shed the work."""


class RpcTimeout(LinkError):
    """The call got no answer before its timeout."""

    def __init__(self, method: str, timeout: float) -> None:
        super().__init__(f"rpc {method!r} got no answer within {timeout} s")
        self.method = method
        self.timeout = timeout


class RpcFailed(LinkError):
    """The call failed on the peer: ``reason`` is a stable snake_case name, ``message`` text.

    An rpc handler raises this to answer with a typed error of its own; the caller gets it back
    with the same ``reason`` and ``message``.
    """

    def __init__(self, reason: str, message: str = "") -> None:
        super().__init__(f"{reason}: {message}" if message else reason)
        self.reason = reason
        self.message = message


class StreamStopped(LinkError):
    """The receiver of a data stream stopped it (or refused it: too many open streams)."""

    def __init__(self, stream_id: int) -> None:
        super().__init__(f"data stream {stream_id} was stopped by its receiver")
        self.stream_id = stream_id


class StreamStarved(StreamStopped):
    """The receiver of a data stream granted no credit within ``LinkConfig.credit_timeout``
    (``waited`` seconds): the sender aborted the stream (``credit_timeout``) and freed its slot.
    A :class:`StreamStopped`: the stream is over, as if the receiver had stopped it."""

    def __init__(self, stream_id: int, waited: float) -> None:
        LinkError.__init__(
            self, f"data stream {stream_id}: no credit from its receiver for {waited:g} s"
        )
        self.stream_id = stream_id
        self.waited = waited


class StreamAborted(PeerUnreachable):
    """The sender of a data stream aborted it (``DataAbort``): no more chunks will come.
    ``reason`` is its stable snake_case name (``credit_timeout``, or the sender's own). A
    :class:`PeerUnreachable` (with ``closed`` ``None``: the link itself may be open), so a
    consumer that handles a lost peer handles it too."""

    def __init__(self, stream_id: int, reason: str) -> None:
        LinkError.__init__(self, f"data stream {stream_id} was aborted by its sender: {reason}")
        self.closed = None
        self.stream_id = stream_id
        self.reason = reason


@attrs.frozen
class LinkStatistics:
    """A snapshot of a link (see :meth:`Link.statistics`)."""

    peer_id: str
    remote: str
    state: LinkState
    #: round-trip time of the latest answered ping, in ms (``None`` before the first)
    rtt_ms: float | None
    bytes_in: int
    bytes_out: int
    frames_in: int
    frames_out: int
    #: why the link closed, unless it closed cleanly (``None`` while open)
    last_error: str | None
    closed: LinkClosed | None
    #: outgoing frames waiting: control (raft, rpc, telemetry) and data
    control_queued: int
    data_queued: int
    #: received frames waiting for their consumer
    raft_queued: int
    telemetry_queued: int
    pending_calls: int
    rpcs_in_flight: int
    streams_in: int
    streams_out: int
    #: received raft/telemetry frames dropped on a full inbox, and rpc requests refused busy
    dropped_in: int
    #: data chunks dropped as duplicates (or for stopped streams)
    duplicates_dropped: int
