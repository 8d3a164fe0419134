"""Forwarded submissions: what a follower's :meth:`Transport.forward` sends the leader and what
comes back.

A :class:`SubmitRequest` carries the command, its ``(client_id, seq)`` and what is left of the
caller's deadline; the answer is :class:`Applied` (the result) or :class:`Rejected` (a typed
driver error as a reason). :func:`serve_request` is the leader's side (decode, submit, encode,
errors become :class:`Rejected`); :func:`result_of` the follower's (the result, or the typed
error raised again). Every transport encodes them with :data:`REQUEST_CODEC` and
:data:`REPLY_CODEC`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Awaitable, Callable

import attrs
import trio

from skulk.wire import Codec

from ._errors import (
    ForwardFailed,
    NoQuorum,
    NotLeader,
    SubmitTimeout,
    Unavailable,
    UnavailableReason,
)
from ._types import NodeId


@attrs.frozen
class SubmitRequest:
    """A command forwarded to the leader; ``timeout_ms`` is what is left of the caller's
    deadline when it was sent (the leader answers before it runs out)."""

    command: bytes
    client_id: str
    seq: int
    timeout_ms: int


@attrs.frozen
class Applied:
    """The forwarded command committed; ``result`` is what the state machine returned."""

    result: bytes


class RejectReason(enum.Enum):
    NOT_LEADER = "not_leader"
    NO_QUORUM = "no_quorum"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"


@attrs.frozen
class Rejected:
    """The forwarded command failed on the receiver: ``reason`` maps back to the driver's typed
    error; ``leader`` is the receiver's leader hint (``not_leader``); ``unavailable`` carries
    the :class:`UnavailableReason` value in ``detail``."""

    reason: RejectReason
    leader: NodeId | None = None
    detail: str = ""


SubmitReply = Applied | Rejected

REQUEST_CODEC: Codec[SubmitRequest] = Codec(SubmitRequest)

REPLY_CODEC: Codec[SubmitReply] = Codec(SubmitReply)

SubmitHandler = Callable[[SubmitRequest, float], Awaitable[bytes]]
"""``await handler(request, deadline)``: submit on this node without forwarding (``deadline``
on the Trio clock); returns the result or raises the driver's typed errors."""


def remaining_ms(deadline: float) -> int:
    """Milliseconds left until ``deadline`` (at least 1), for :attr:`SubmitRequest.timeout_ms`."""
    return max(1, math.floor((deadline - trio.current_time()) * 1000))


def reply_for(error: Exception) -> Rejected | None:
    """The :class:`Rejected` a typed driver error travels as (``None`` for anything else)."""
    if isinstance(error, NotLeader):
        return Rejected(RejectReason.NOT_LEADER, error.leader)
    if isinstance(error, NoQuorum):
        return Rejected(RejectReason.NO_QUORUM, detail=error.detail)
    if isinstance(error, SubmitTimeout):
        return Rejected(RejectReason.TIMEOUT, detail=f"{error.timeout:.6f}")
    if isinstance(error, Unavailable):
        return Rejected(RejectReason.UNAVAILABLE, detail=error.reason.value)
    return None


def result_of(reply: SubmitReply, peer: NodeId, timeout: float) -> bytes:
    """The result an answer carries, or the typed error it stands for."""
    if isinstance(reply, Applied):
        return reply.result
    if reply.reason is RejectReason.NOT_LEADER:
        raise NotLeader(reply.leader)
    if reply.reason is RejectReason.NO_QUORUM:
        raise NoQuorum(f"{peer}: {reply.detail}" if reply.detail else peer)
    if reply.reason is RejectReason.TIMEOUT:
        raise SubmitTimeout(timeout)
    try:
        why = UnavailableReason(reply.detail)
    except ValueError:
        raise ForwardFailed(peer, f"unknown unavailable reason {reply.detail!r:.40}") from None
    raise Unavailable(why, f"on {peer}")


async def serve_request(handler: SubmitHandler | None, body: bytes, deadline: float) -> bytes:
    """Decode a forwarded submission, run ``handler`` on it and encode its answer (typed errors
    become :class:`Rejected`). The receiving side of :meth:`Transport.forward`."""
    if handler is None:
        reply: SubmitReply = Rejected(
            RejectReason.UNAVAILABLE, detail=UnavailableReason.STOPPED.value
        )
        return REPLY_CODEC.encode(reply)
    request = REQUEST_CODEC.decode(body)  # WireError: the caller answers "bad request"
    # Answer a little before the caller's deadline, so the answer (not a timeout) reaches it.
    budget = request.timeout_ms / 1000
    deadline = min(deadline, trio.current_time() + budget * 0.95)
    try:
        reply = Applied(await handler(request, deadline))
    except (NotLeader, NoQuorum, SubmitTimeout, Unavailable) as exc:
        rejected = reply_for(exc)
        assert rejected is not None
        reply = rejected
    return REPLY_CODEC.encode(reply)
