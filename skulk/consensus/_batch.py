"""Pure bookkeeping of the Raft driver's loop (no I/O, no Trio tasks).

- :class:`Retry`: a submission's proposal was lost or refused; try again after a pause.
- :class:`Waiter` / :class:`WaiterTable`: submissions (and leadership transfers) waiting on
  this node, indexed by the log position their proposal was placed at, finished exactly once
  with a result, a :class:`Retry` or an error.
- :class:`Batch`: the readies folded into one persist (one fsync): their log writes in order
  (a later entry at an index already in the batch truncates from there), the latest hard
  state, the outgoing messages and the committed entries to apply afterwards.
- :func:`_coalesce`: folds consecutive messages to one peer into one (AppendRequests of one
  term that continue each other, up to :data:`MAX_COALESCED_ENTRIES` entries; successful
  AppendReplies of one term).

Used by :mod:`skulk.consensus._driver`.
"""

from __future__ import annotations

import attrs
import trio

from ._types import (
    AppendReply,
    AppendRequest,
    Entry,
    HardState,
    Message,
    NodeId,
    Payload,
    Ready,
    Snapshot,
)


@attrs.frozen
class Retry:
    """A proposal's fate is unknown or it was refused: submit it again after ``pause`` s."""

    pause: float


@attrs.define(eq=False)
class Waiter:
    """One submission (or transfer) waiting for the loop; finished exactly once."""

    event: trio.Event = attrs.Factory(trio.Event)
    outcome: bytes | Retry | Exception | None = None
    abandoned: bool = False
    index: int = 0
    term: int = 0

    def finish(self, outcome: bytes | Retry | Exception) -> None:
        if not self.event.is_set():
            self.outcome = outcome
            self.event.set()


class WaiterTable:
    """The submissions waiting on this node, and those placed in the log by index."""

    def __init__(self) -> None:
        self._all: set[Waiter] = set()
        self._at: dict[int, list[Waiter]] = {}

    def __len__(self) -> int:
        return len(self._all)

    def add(self, waiter: Waiter) -> None:
        self._all.add(waiter)

    def discard(self, waiter: Waiter) -> None:
        self._all.discard(waiter)
        placed = self._at.get(waiter.index)
        if placed is not None and waiter in placed:
            placed.remove(waiter)
            if not placed:
                del self._at[waiter.index]

    def place(self, waiter: Waiter, index: int, term: int) -> None:
        waiter.index, waiter.term = index, term
        self._at.setdefault(index, []).append(waiter)

    def committed(self, index: int, term: int, result: bytes) -> None:
        """The entry at ``index`` was applied: its own waiters get ``result``; a waiter whose
        proposal sat there in another term lost it (retry)."""
        for waiter in self._at.pop(index, ()):
            waiter.finish(result if waiter.term == term else Retry(0.0))

    def retry_through(self, index: int) -> None:
        """A snapshot replaced the log through ``index``: those proposals' fate is unknown."""
        for at in [i for i in self._at if i <= index]:
            for waiter in self._at.pop(at):
                waiter.finish(Retry(0.0))

    def retry_all(self) -> None:
        for waiter in self._all:
            waiter.finish(Retry(0.0))

    def fail_all(self, error: Exception) -> None:
        for waiter in self._all:
            waiter.finish(error)


class Batch:
    """Readies folded into one persist: their writes in order (a later entry at an index
    already in the batch truncates from there), their messages and committed entries. A
    ready carrying a snapshot only starts a batch (:meth:`add` refuses it otherwise)."""

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.restore = False
        self.entries: list[Entry] = []
        self.hard_state: HardState | None = None
        self.messages: list[Message] = []
        self.committed: list[Entry] = []
        self.inputs = 0
        self.applied_early = False
        self._last_to: dict[NodeId, int] = {}  # position of the last message to each peer

    def empty(self) -> bool:
        return not (
            self.snapshot or self.entries or self.hard_state or self.messages or self.committed
        )

    def needs_sync(self, synced: HardState) -> bool:
        """Whether this batch must be on disk before its messages go out: it writes the log,
        or changes the term or vote (a commit index alone need not be synced first)."""
        hs = self.hard_state
        return (
            self.snapshot is not None
            or bool(self.entries)
            or (hs is not None and (hs.term, hs.vote) != (synced.term, synced.vote))
        )

    @property
    def restored(self) -> Snapshot | None:
        """The snapshot to restore the state machine from once persisted (``None``: none,
        or it was restored when stepped)."""
        return self.snapshot if self.restore and not self.applied_early else None

    def add(self, ready: Ready, early: bool = False) -> bool:
        """Fold ``ready`` in (``early``: its restore and committed entries were applied when
        stepped, so the batch keeps only its writes and messages)."""
        if ready.snapshot is not None:
            if not self.empty():
                return False
            self.snapshot, self.restore = ready.snapshot, ready.restore
            self.applied_early = early
        if ready.entries:
            first = ready.entries[0].index
            if self.entries and first <= self.entries[-1].index:
                del self.entries[max(0, first - self.entries[0].index) :]
            self.entries.extend(ready.entries)
        if ready.hard_state is not None:
            self.hard_state = ready.hard_state
        for message in ready.messages:
            self._send(message)
        if not early:
            self.committed.extend(ready.committed)
        return True

    def _send(self, message: Message) -> None:
        """Queue ``message``, folded into the previous message to the same peer when that says
        the same and more: consecutive AppendRequests of one term become one, and a successful
        AppendReply replaces an earlier one (acknowledging index n acknowledges all below)."""
        at = self._last_to.get(message.dst)
        if at is not None:
            merged = _coalesce(self.messages[at].payload, message.payload)
            if merged is not None:
                self.messages[at] = Message(message.src, message.dst, merged)
                return
        self._last_to[message.dst] = len(self.messages)
        self.messages.append(message)


MAX_COALESCED_ENTRIES = 1024


def _coalesce(first: Payload, second: Payload) -> Payload | None:
    """One payload saying what ``first`` then ``second`` say, or ``None``."""
    if isinstance(first, AppendRequest) and isinstance(second, AppendRequest):
        last_term = first.entries[-1].term if first.entries else first.prev_term
        if (
            first.term == second.term
            and second.prev_index == first.prev_index + len(first.entries)
            and second.prev_term == last_term
            and len(first.entries) + len(second.entries) <= MAX_COALESCED_ENTRIES
        ):
            commit = max(first.commit, second.commit)
            entries = first.entries + second.entries
            return AppendRequest(first.term, first.prev_index, first.prev_term, entries, commit)
    if isinstance(first, AppendReply) and isinstance(second, AppendReply):
        if first.success and second.success and first.term == second.term:
            return second if second.index >= first.index else first
    return None
