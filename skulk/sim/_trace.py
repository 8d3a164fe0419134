"""The trace hash: a sha256 over a canonical line for every event the world processes.

Two runs with the same seed, plan and configuration must produce the same hash, in the same
process or another one: so the lines contain only ints, node ids, type names and values
derived from them -- never ``id()``, ``hash()`` of a str, a clock or a set's order. The last
:attr:`Trace.tail_size` lines are kept for repro files and violation reports.
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Callable

from skulk.consensus import (
    AppendReply,
    AppendRequest,
    Message,
    Payload,
    SnapshotChunk,
    SnapshotReply,
    TimeoutNow,
    VoteReply,
    VoteRequest,
)


def summarize(payload: Payload) -> str:
    """A short canonical description of a consensus message payload."""
    if isinstance(payload, AppendRequest):
        last = payload.entries[-1] if payload.entries else None
        tail = f" ..{last.index}@{last.term}" if last is not None else ""
        return (
            f"App t{payload.term} p{payload.prev_index}@{payload.prev_term} "
            f"n{len(payload.entries)}{tail} c{payload.commit}"
        )
    if isinstance(payload, AppendReply):
        return (
            f"AppR t{payload.term} {'ok' if payload.success else 'no'} i{payload.index} "
            f"h{payload.hint_index}@{payload.hint_term}"
        )
    if isinstance(payload, VoteRequest):
        kind = "Pre" if payload.pre_vote else "Vote"
        return (
            f"{kind} t{payload.term} l{payload.last_index}@{payload.last_term}"
            f"{' xfer' if payload.transfer else ''}"
        )
    if isinstance(payload, VoteReply):
        kind = "PreR" if payload.pre_vote else "VoteR"
        return f"{kind} t{payload.term} {'yes' if payload.granted else 'no'}"
    if isinstance(payload, SnapshotChunk):
        return (
            f"Snap t{payload.term} s{payload.meta.index}@{payload.meta.term} "
            f"o{payload.offset} n{len(payload.data)}{' done' if payload.done else ''}"
        )
    if isinstance(payload, SnapshotReply):
        return (
            f"SnapR t{payload.term} s{payload.index} o{payload.offset}"
            f"{' done' if payload.done else ''}"
        )
    if isinstance(payload, TimeoutNow):
        return f"TimeoutNow t{payload.term}"
    return type(payload).__name__


def describe(message: Message) -> str:
    return f"{message.src}>{message.dst} {summarize(message.payload)}"


class Trace:
    """Accumulates the trace hash; :meth:`add` one canonical line per event. ``sink`` (for
    debugging: ``python -m skulk.sim replay FILE --trace OUT``) receives every line."""

    tail_size = 200

    def __init__(self, sink: Callable[[str], None] | None = None) -> None:
        self._hash = hashlib.sha256()
        self._tail: deque[str] = deque(maxlen=self.tail_size)
        self._sink = sink
        self.events = 0

    def add(self, line: str) -> None:
        self._hash.update(line.encode())
        self._hash.update(b"\n")
        self._tail.append(line)
        self.events += 1
        if self._sink is not None:
            self._sink(line)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()

    def tail(self, n: int | None = None) -> list[str]:
        """The last ``n`` (default: all kept) lines."""
        lines = list(self._tail)
        return lines if n is None else lines[-n:]
