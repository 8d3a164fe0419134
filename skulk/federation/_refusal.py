"""Why a federation handshake was refused: typed reasons, close codes and log lines.

A refused handshake ends with the refusing side closing the WebSocket with
``refusal.close_code`` (private range 4000-4999, one per reason) and ``refusal.close_reason``
(short text for the peer), and logging ``refusal.log_line(peer)`` once. The side that receives
the close turns it back into a :class:`Refusal` with :func:`refusal_from_close` to log its own
line. The state machines never log: they hand back a :class:`Refusal` and the driver logs it.
"""

from __future__ import annotations

import enum

import attrs

_MAX_CLOSE_REASON_BYTES = 123  # RFC 6455: a close frame's reason fits in 123 bytes of UTF-8
_EXCERPT = 48


class RefusalReason(enum.Enum):
    """Why a handshake failed; the value is the WebSocket close code the refusing side sends."""

    WRONG_SECRET = 4001
    """The peer's proof does not verify: it does not hold this cluster's secret."""
    REPLAYED = 4002
    """The client's nonce was seen recently: a captured handshake is being replayed."""
    VERSION_MISMATCH = 4003
    """The peer speaks another federation protocol version."""
    DUPLICATE_NODE_ID = 4004
    """An authenticated peer claims a node id that already has a live link."""
    MALFORMED = 4005
    """Bytes that are not the expected handshake frame (bad CBOR, wrong frame, wrong order,
    bad field sizes)."""
    WRONG_CLUSTER = 4006
    """The peer names another cluster id: it was given a different cluster secret."""
    HANDSHAKE_TIMEOUT = 4007
    """The handshake did not finish before the driver's deadline."""
    OWN_NODE_ID = 4008
    """An authenticated peer claims this node's own id: this node dialed itself, or two nodes
    share a data dir's node id."""

    @property
    def close_code(self) -> int:
        return self.value

    @property
    def label(self) -> str:
        """Stable snake_case name (``wrong_secret``), for logs, metrics and close reasons."""
        return self.name.lower()

    @classmethod
    def from_close_code(cls, code: int | None) -> RefusalReason | None:
        """The reason a close code stands for, or ``None`` for any other code."""
        for reason in cls:
            if reason.value == code:
                return reason
        return None


_HINTS: dict[RefusalReason, str] = {
    RefusalReason.WRONG_SECRET: "the peer does not hold this cluster's secret",
    RefusalReason.REPLAYED: "a previously seen handshake was replayed",
    RefusalReason.VERSION_MISMATCH: "run the same Skulk version on every node",
    RefusalReason.DUPLICATE_NODE_ID: "a node with this id is already connected",
    RefusalReason.MALFORMED: "not a valid handshake frame",
    RefusalReason.WRONG_CLUSTER: "the nodes have different cluster secrets",
    RefusalReason.HANDSHAKE_TIMEOUT: "the handshake did not finish in time",
    RefusalReason.OWN_NODE_ID: "the peer has this node's own id (dialed itself?)",
}


@attrs.frozen
class Refusal:
    """A refused handshake. ``detail`` is one line for this node's log (peer-supplied parts
    quoted and shortened; never the secret). ``close_reason`` is what the refusing side tells
    the peer in the close frame: the reason's label and a fixed hint, no local values beyond the
    protocol version. ``by_peer`` is ``True`` when the peer refused us (from its close frame).
    ``peer_node_id`` is the id the peer claimed, if it got that far (unverified unless the
    reason is ``DUPLICATE_NODE_ID`` or ``OWN_NODE_ID``)."""

    reason: RefusalReason
    detail: str
    close_reason: str
    by_peer: bool = False
    peer_node_id: str | None = None

    @property
    def close_code(self) -> int:
        return self.reason.close_code

    def log_line(self, peer: str) -> str:
        """The one log line for this refusal; ``peer`` is the link's remote address."""
        who = f"{peer} (node {quote(self.peer_node_id)})" if self.peer_node_id else peer
        if self.by_peer:
            head = f"federation handshake with {who} refused by the peer"
        else:
            head = f"federation handshake with {who} refused"
        return one_line(f"{head}: {self.reason.label} (close {self.close_code}): {self.detail}")


def make_refusal(
    reason: RefusalReason,
    detail: str,
    *,
    peer_node_id: str | None = None,
    close_reason: str | None = None,
) -> Refusal:
    """A local refusal with the standard close reason for ``reason`` (or ``close_reason``)."""
    text = close_reason if close_reason is not None else f"{reason.label}: {_HINTS[reason]}"
    return Refusal(
        reason=reason,
        detail=one_line(detail),
        close_reason=fit_close_reason(text),
        peer_node_id=peer_node_id,
    )


def refusal_from_close(code: int | None, reason: str | None) -> Refusal | None:
    """The peer's refusal, from the close frame it sent during the handshake; ``None`` if the
    code is not one of ours (a plain disconnect: the driver logs that its own way)."""
    kind = RefusalReason.from_close_code(code)
    if kind is None:
        return None
    said = quote(reason) if reason else "(no reason given)"
    return Refusal(
        reason=kind, detail=f"the peer said {said}", close_reason=reason or "", by_peer=True
    )


def quote(text: str | None, limit: int = _EXCERPT) -> str:
    """Peer-controlled text made safe for a log line: shortened, then ``repr``-quoted (so no
    newline or control character reaches the log)."""
    if text is None:
        return "None"
    short = text if len(text) <= limit else text[: limit - 1] + "…"
    return repr(short)


def one_line(text: str) -> str:
    return " ".join(text.split())


def fit_close_reason(text: str) -> str:
    """``text`` cut to fit a WebSocket close frame (123 bytes of UTF-8)."""
    data = text.encode("utf-8", "replace")
    if len(data) <= _MAX_CLOSE_REASON_BYTES:
        return text
    return data[: _MAX_CLOSE_REASON_BYTES - 3].decode("utf-8", "ignore") + "..."
