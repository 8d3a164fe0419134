"""The typed failures of :meth:`RaftDriver.submit` and its helpers.

Every failure of a submission says what the caller may do next:

* :class:`NotLeader` -- only with ``forward=False``: this node does not lead; ``leader``
  names the node it believes does (``None`` when it knows none). Nothing was proposed here.
* :class:`NoQuorum` -- no leader could be reached before the deadline (an election is under
  way, or this node cannot reach a majority). The command was not applied by this attempt
  *as far as this node knows*; retrying with the same ``(client_id, seq)`` is always safe.
* :class:`SubmitTimeout` -- a leader took the command but its commit was not seen before the
  deadline: the outcome is unknown. Retry with the same ``(client_id, seq)``: the command
  applies at most once (:class:`~skulk.consensus.Sessions`).
* :class:`Unavailable` -- this node cannot take part now (``reason``): its storage failed
  (disk full, I/O error; it recovers by itself when the disk does), it is not running, or it
  has too many submissions in flight. Try another node or later.

:class:`ForwardFailed` is the transports' "could not reach that peer" and never escapes
:meth:`RaftDriver.submit` (which retries until its deadline). A state-machine image that
cannot be decoded is :class:`skulk.wire.SnapshotCorrupt`, with the image format.
"""

from __future__ import annotations

import enum

from ._types import NodeId


class ConsensusError(Exception):
    """Base of the consensus layer's typed errors."""


class NotLeader(ConsensusError):
    """This node does not lead; ``leader`` is who it believes does (``None``: unknown)."""

    def __init__(self, leader: NodeId | None) -> None:
        super().__init__(f"not the leader (leader: {leader or 'unknown'})")
        self.leader = leader


class ProposalRefused(ConsensusError):
    """The leader cannot take this proposal now; ``reason`` is a stable snake_case name:
    ``transfer_in_progress``, ``conf_change_pending``, ``learner_not_caught_up``,
    ``would_lose_quorum``, ``invalid_conf_change``, ``invalid_transfer``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class NoQuorum(ConsensusError):
    """No leader was reachable before the deadline; ``detail`` says what was last seen."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(f"no quorum: {detail}" if detail else "no quorum")
        self.detail = detail


class SubmitTimeout(ConsensusError):
    """A leader took the command, its commit was not seen in ``timeout`` seconds: the outcome is
    unknown (retry with the same ``(client_id, seq)``)."""

    def __init__(self, timeout: float) -> None:
        super().__init__(f"no commit seen within {timeout:.3f} s (outcome unknown)")
        self.timeout = timeout


class UnavailableReason(enum.Enum):
    """Why a node cannot take submissions now (values are stable snake_case names)."""

    DISK_FULL = "disk_full"
    """Storage ran out of space; the node recovers when space returns."""
    DISK_ERROR = "disk_error"
    """Storage failed otherwise (a failed fsync); the node reopens it and recovers."""
    STOPPED = "stopped"
    """The driver is not running (not started yet, or shut down)."""
    OVERLOADED = "overloaded"
    """Too many submissions are waiting for their commit on this node."""


class Unavailable(ConsensusError):
    """This node cannot take the submission now; ``reason`` says why."""

    def __init__(self, reason: UnavailableReason, detail: str = "") -> None:
        text = f"unavailable ({reason.value})"
        super().__init__(f"{text}: {detail}" if detail else text)
        self.reason = reason
        self.detail = detail


class ForwardFailed(ConsensusError):
    """A transport could not carry a forwarded submission to ``peer`` (no link, link busy or
    lost, a malformed answer). Internal to the driver's retry loop."""

    def __init__(self, peer: NodeId, detail: str) -> None:
        super().__init__(f"forwarding to {peer} failed: {detail}")
        self.peer = peer
        self.detail = detail
