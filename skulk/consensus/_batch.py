"""Pure bookkeeping of the Raft driver's loop (no I/O, no Trio tasks).

- :class:`Retry`: a submission's proposal was lost or refused; try again after a pause.
- :class:`Waiter` / :class:`WaiterTable`: submissions (and leadership transfers) waiting on
  this node, indexed by the log position their proposal was placed at, finished exactly once
  with a result, a :class:`Retry` or an error.
- :class:`Batch`: the readies folded into one persist (one fsync): their log writes in order
  (a later entry at an index already in the batch truncates from there), the latest hard
  state and the outgoing messages; :meth:`Batch.take_early` picks the leader's
  AppendRequests that may go out while the batch is being synced.
- :class:`CommitQueue`: committed entries waiting until this node's own log holds them
  durably, then handed out in order to be applied.
- :func:`_coalesce`: folds consecutive messages to one peer into one (AppendRequests of one
  term that continue each other, up to :data:`MAX_COALESCED_ENTRIES` entries; successful
  AppendReplies of one term).

Used by the driver (:mod:`skulk.consensus._driver` and its parts).
"""

from __future__ import annotations

import collections
import heapq
import itertools
import math
from collections.abc import Iterable

import attrs
import trio

from ._types import (
    AppendReply,
    AppendRequest,
    Entry,
    EntryKind,
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
    """One submission (or transfer) waiting for the loop; finished exactly once. At
    ``deadline`` (Trio clock) :meth:`WaiterTable.expire` finishes it with a :class:`Retry`."""

    event: trio.Event = attrs.Factory(trio.Event)
    outcome: bytes | Retry | Exception | None = None
    abandoned: bool = False
    index: int = 0
    term: int = 0
    deadline: float = math.inf

    def finish(self, outcome: bytes | Retry | Exception) -> None:
        if not self.event.is_set():
            self.outcome = outcome
            self.event.set()


class WaiterTable:
    """The submissions waiting on this node, those placed in the log by index, and their
    deadlines.

    Deadlines are kept here, in one heap, rather than in a cancel scope per submission: a
    deadline scope costs a Trio deadline registration per command, a tenth of a loaded
    leader's CPU. One task sleeps until :meth:`next_deadline` and calls :meth:`expire`.
    Finished waiters leave the heap lazily (when they reach its top, or when the heap grows to
    twice the live waiters and is rebuilt)."""

    def __init__(self) -> None:
        self._all: set[Waiter] = set()
        self._at: dict[int, list[Waiter]] = {}
        self._deadlines: list[tuple[float, int, Waiter]] = []
        self._added = itertools.count()

    def __len__(self) -> int:
        return len(self._all)

    def add(self, waiter: Waiter) -> None:
        self._all.add(waiter)
        if waiter.deadline < math.inf:
            heap = self._deadlines
            if len(heap) > 2 * len(self._all) + 64:
                heap[:] = [d for d in heap if not d[2].event.is_set() and d[2] in self._all]
                heapq.heapify(heap)
            heapq.heappush(heap, (waiter.deadline, next(self._added), waiter))

    def next_deadline(self) -> float:
        """The earliest deadline of a waiter that may still be waiting (``inf``: none)."""
        return self._deadlines[0][0] if self._deadlines else math.inf

    def expire(self, now: float) -> None:
        """Finish every waiter whose deadline is at or before ``now`` with ``Retry(0.0)`` (its
        caller sees the deadline passed), and drop finished ones from the top of the heap."""
        heap = self._deadlines
        while heap and (heap[0][0] <= now or heap[0][2].event.is_set()):
            heapq.heappop(heap)[2].finish(Retry(0.0))

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
    already in the batch truncates from there) and their messages. A ready carrying a snapshot
    only starts a batch (:meth:`add` refuses it otherwise). Committed entries are not kept
    here: the driver applies them through a :class:`CommitQueue`."""

    def __init__(self) -> None:
        self.snapshot: Snapshot | None = None
        self.restore = False
        self.entries: list[Entry] = []
        self.hard_state: HardState | None = None
        self.messages: list[Message] = []
        self.inputs = 0
        self._last_to: dict[NodeId, int] = {}  # position of the last message to each peer

    def empty(self) -> bool:
        return not (self.snapshot or self.entries or self.hard_state or self.messages)

    def needs_sync(self, synced: HardState) -> bool:
        """Whether this batch must be on disk before its messages go out: it writes the log,
        or changes the term or vote (a commit index alone need not be synced first)."""
        return (
            self.snapshot is not None or bool(self.entries) or not self._keeps_term_and_vote(synced)
        )

    def _keeps_term_and_vote(self, synced: HardState) -> bool:
        hs = self.hard_state
        return hs is None or (hs.term, hs.vote) == (synced.term, synced.vote)

    def take_early(self, synced: HardState) -> list[Message]:
        """Take out the AppendRequests that may be sent *before* this batch is synced, and
        return them (Ongaro's dissertation §10.2.1: a leader writes its log in parallel with
        replicating it). Safe because the driver counts this node's copy of an entry only once
        it is durable here: it applies nothing, and tells followers no commit index, beyond
        :attr:`CommitQueue.durable`. Nothing is taken when the batch changes the term or the
        vote (an AppendRequest must never speak for a term this node could forget), holds a
        snapshot, or appends a membership change (a change is counted committed on the
        leader's word alone, so it must be durable here before anyone else sees it)."""
        if (
            self.snapshot is not None
            or not self._keeps_term_and_vote(synced)
            or any(e.kind is EntryKind.CONF for e in self.entries)
        ):
            return []
        early = [m for m in self.messages if isinstance(m.payload, AppendRequest)]
        if early:
            self.messages = [m for m in self.messages if not isinstance(m.payload, AppendRequest)]
            self._last_to = {m.dst: k for k, m in enumerate(self.messages)}
        return early

    def last_index_after(self, durable: int) -> int:
        """The last index of this node's durable log once this batch is synced, ``durable``
        before it (a leader's snapshot replaces the log; written entries end it, a truncating
        write included)."""
        if self.snapshot is not None and self.restore:
            durable = self.snapshot.meta.index
        return self.entries[-1].index if self.entries else durable

    def add(self, ready: Ready) -> bool:
        """Fold ``ready``'s writes and messages in; ``False`` (nothing folded) for a ready
        carrying a snapshot when the batch is not empty."""
        if ready.snapshot is not None:
            if not self.empty():
                return False
            self.snapshot, self.restore = ready.snapshot, ready.restore
        if ready.entries:
            first = ready.entries[0].index
            if self.entries and first <= self.entries[-1].index:
                del self.entries[max(0, first - self.entries[0].index) :]
            self.entries.extend(ready.entries)
        if ready.hard_state is not None:
            self.hard_state = ready.hard_state
        for message in ready.messages:
            self._send(message)
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


class CommitQueue:
    """Committed entries not yet applied, applied only once this node holds them durably.

    A leader counts its own log when it decides what is committed, and it sends entries before
    its own fsync of them ends (:meth:`Batch.take_early`): an entry can be "committed" with one
    durable copy elsewhere and this node's copy still in flight. Holding the entry back until
    :attr:`durable` covers it keeps what is applied (and answered) on a durable majority. On a
    follower the gate costs at most its own fsync (a commit index it learns from a leader is
    already durable on a majority). A lone voter commits on its own append: the same gate
    makes it wait for the persist."""

    def __init__(self, durable: int = 0) -> None:
        self.durable = durable
        """Every entry of this node's log through this index is on disk."""
        self._waiting: collections.deque[Entry] = collections.deque()

    def __len__(self) -> int:
        return len(self._waiting)

    def push(self, entries: Iterable[Entry]) -> None:
        """Entries the core just reported committed (in log order, after those pushed before)."""
        self._waiting.extend(entries)

    def clear(self) -> None:
        """Forget the waiting entries (a leader's snapshot covers them, or the core is gone)."""
        self._waiting.clear()

    def take(self) -> list[Entry]:
        """The waiting entries now durable here, in order (removed from the queue)."""
        waiting, durable = self._waiting, self.durable
        out: list[Entry] = []
        while waiting and waiting[0].index <= durable:
            out.append(waiting.popleft())
        return out

    def cap(self, message: Message) -> Message:
        """``message`` with an AppendRequest's commit index lowered to :attr:`durable`, so a
        follower never applies what is durable only on a minority (the leader's own copy
        counted before its fsync ended). Batches are taken in order and an acknowledgement
        covers only entries sent before, so this holds by construction today; the cap keeps it
        true where it matters, whatever the batching does. Other messages as they are."""
        p = message.payload
        if isinstance(p, AppendRequest) and p.commit > self.durable:
            capped = AppendRequest(p.term, p.prev_index, p.prev_term, p.entries, self.durable)
            return Message(message.src, message.dst, capped)
        return message


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
