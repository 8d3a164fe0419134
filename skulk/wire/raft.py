"""Frames of the consensus (Raft) protocol, carried by the federation ``raft`` topic.

One :data:`RaftPayload` per :class:`~skulk.wire.link.RaftMessage` body. The sender and the
receiver are the two ends of the authenticated link, so a payload names neither (a node cannot
speak for another). Log entries, memberships and snapshot positions are values of the
replicated log as well as of the wire; :mod:`skulk.consensus` uses them directly.
``specs/consensus.md`` gives the protocol, ``specs/wire.cddl`` the encoding.
"""

from __future__ import annotations

import enum
from typing import Literal

import attrs

NodeId = str


class EntryKind(enum.Enum):
    """What a log entry carries."""

    NOOP = "noop"
    """Appended by a new leader so that it can commit entries of earlier terms."""
    COMMAND = "command"
    """A client command for the replicated state machine."""
    CONF = "conf"
    """A single-server membership change (:attr:`Entry.conf`)."""


ConfOp = Literal["add_learner", "promote", "remove"]


@attrs.frozen
class ConfChange:
    """One membership step: add ``node`` as a non-voting learner, promote a learner to voter,
    or remove a voter or learner. Takes effect when appended (Raft dissertation §4.1)."""

    op: ConfOp
    node: NodeId


@attrs.frozen
class ConfState:
    """The cluster's membership: voters decide, learners only receive the log."""

    voters: tuple[NodeId, ...]
    learners: tuple[NodeId, ...] = ()

    def apply(self, change: ConfChange) -> ConfState:
        """The membership after ``change`` (sorted, so equal memberships compare equal)."""
        voters = set(self.voters)
        learners = set(self.learners)
        if change.op == "add_learner":
            if change.node not in voters:
                learners.add(change.node)
        elif change.op == "promote":
            learners.discard(change.node)
            voters.add(change.node)
        else:
            voters.discard(change.node)
            learners.discard(change.node)
        return ConfState(tuple(sorted(voters)), tuple(sorted(learners)))

    def members(self) -> tuple[NodeId, ...]:
        return tuple(sorted((*self.voters, *self.learners)))


@attrs.frozen
class Entry:
    """One log entry. Commands carry ``(client_id, seq)`` so a retried command is applied once;
    ``client_id`` is ``""`` for entries that are not client commands."""

    index: int
    term: int
    kind: EntryKind
    data: bytes = b""
    client_id: str = ""
    seq: int = 0
    conf: ConfChange | None = None


@attrs.frozen
class SnapshotMeta:
    """The log position a snapshot replaces, and the membership as of that position."""

    index: int
    term: int
    conf: ConfState


@attrs.frozen
class VoteRequest:
    """Ask for a vote (or, with ``pre_vote``, whether a vote *would* be granted at ``term``
    without anyone changing term). ``transfer`` marks an election a leader asked for
    (leadership transfer), which overrides leader stickiness."""

    term: int
    last_index: int
    last_term: int
    pre_vote: bool = False
    transfer: bool = False


@attrs.frozen
class VoteReply:
    term: int
    granted: bool
    pre_vote: bool = False


@attrs.frozen
class AppendRequest:
    """AppendEntries; with no entries, a heartbeat. ``commit`` is the leader's commit index."""

    term: int
    prev_index: int
    prev_term: int
    entries: tuple[Entry, ...]
    commit: int


@attrs.frozen
class AppendReply:
    """``success``: the follower's log matches the leader's through ``index``. Otherwise
    ``index`` is the rejected ``prev_index`` and ``hint_index``/``hint_term`` let the leader
    skip back a whole term at a time (fast backtracking)."""

    term: int
    success: bool
    index: int
    hint_index: int = 0
    hint_term: int = 0
    needs_snapshot: bool = False
    """The follower has never been initialised (no snapshot, not even the bootstrap one): only
    an InstallSnapshot can give it the membership and state its log starts from."""


@attrs.frozen
class SnapshotChunk:
    """InstallSnapshot: bytes ``[offset, offset + len(data))`` of the leader's snapshot
    ``meta``; ``done`` on the last chunk."""

    term: int
    meta: SnapshotMeta
    offset: int
    data: bytes
    done: bool


@attrs.frozen
class SnapshotReply:
    """The follower holds the first ``offset`` bytes of snapshot ``index`` (``done`` once it
    installed it); a mismatch makes the leader restart the transfer at ``offset``."""

    term: int
    index: int
    offset: int
    done: bool


@attrs.frozen
class TimeoutNow:
    """From a leader transferring leadership: start an election now, skipping PreVote."""

    term: int


RaftPayload = (
    VoteRequest
    | VoteReply
    | AppendRequest
    | AppendReply
    | SnapshotChunk
    | SnapshotReply
    | TimeoutNow
)
