"""The in-memory Raft log: a snapshot position followed by contiguous entries.

Indices start at 1; index ``snapshot_index`` is covered by the snapshot (index 0 with term 0
for a freshly bootstrapped cluster). Membership is tracked alongside: each CONF entry changes
the effective :class:`ConfState` from the moment it is appended, so truncating the log rolls
the membership back too.
"""

from __future__ import annotations

from ._types import ConfState, Entry, EntryKind, SnapshotMeta


class LogConflict(AssertionError):
    """A leader asked to overwrite a committed entry: a safety bug, never a runtime condition."""


class RaftLog:
    def __init__(self, meta: SnapshotMeta | None, entries: tuple[Entry, ...]) -> None:
        self.snapshot_index = meta.index if meta else 0
        self.snapshot_term = meta.term if meta else 0
        base = meta.conf if meta else ConfState(())
        self._entries: list[Entry] = []
        # (index, membership from that index on); the first element is the snapshot's.
        self._confs: list[tuple[int, ConfState]] = [(self.snapshot_index, base)]
        self.extend(entries)

    # --- reading ---------------------------------------------------------------------------

    @property
    def last_index(self) -> int:
        return self.snapshot_index + len(self._entries)

    @property
    def last_term(self) -> int:
        return self._entries[-1].term if self._entries else self.snapshot_term

    @property
    def first_index(self) -> int:
        return self.snapshot_index + 1

    @property
    def conf(self) -> ConfState:
        return self._confs[-1][1]

    def conf_at(self, index: int) -> ConfState:
        """Membership in effect once the log is applied through ``index``."""
        for at, conf in reversed(self._confs):
            if at <= index:
                return conf
        return self._confs[0][1]

    def last_conf_index(self) -> int:
        return self._confs[-1][0]

    def term_at(self, index: int) -> int | None:
        if index == self.snapshot_index:
            return self.snapshot_term
        if self.snapshot_index < index <= self.last_index:
            return self._entries[index - self.snapshot_index - 1].term
        return None

    def entry(self, index: int) -> Entry:
        return self._entries[index - self.snapshot_index - 1]

    def slice(self, lo: int, hi: int) -> tuple[Entry, ...]:
        """Entries ``lo..hi`` inclusive (clipped to what the log holds after the snapshot)."""
        lo = max(lo, self.first_index)
        hi = min(hi, self.last_index)
        if lo > hi:
            return ()
        base = self.snapshot_index + 1
        return tuple(self._entries[lo - base : hi - base + 1])

    def is_up_to_date(self, last_index: int, last_term: int) -> bool:
        """Raft §5.4.1: is a log ending at (``last_index``, ``last_term``) at least as
        up-to-date as this one?"""
        return last_term > self.last_term or (
            last_term == self.last_term and last_index >= self.last_index
        )

    def find_conflict_by_term(self, index: int, term: int) -> tuple[int, int]:
        """The largest index ``<= index`` whose term is ``<= term``, with its term (fast
        backtracking: one round trip skips a whole term of mismatching entries). Stops at the
        snapshot, whose position is known to match any leader's log."""
        index = min(index, self.last_index)
        while index > self.snapshot_index:
            t = self.term_at(index)
            assert t is not None
            if t <= term:
                return index, t
            index -= 1
        return self.snapshot_index, self.snapshot_term

    # --- writing ---------------------------------------------------------------------------

    def extend(self, entries: tuple[Entry, ...] | list[Entry]) -> None:
        """Append entries that continue the log exactly."""
        for e in entries:
            if e.index != self.last_index + 1:
                raise ValueError(f"entry {e.index} does not follow {self.last_index}")
            self._entries.append(e)
            if e.kind is EntryKind.CONF and e.conf is not None:
                self._confs.append((e.index, self.conf.apply(e.conf)))

    def truncate_from(self, index: int) -> None:
        """Drop entries ``index..`` (and the membership changes they made)."""
        del self._entries[index - self.snapshot_index - 1 :]
        while len(self._confs) > 1 and self._confs[-1][0] >= index:
            self._confs.pop()

    def merge(self, entries: tuple[Entry, ...], commit: int) -> tuple[int, list[Entry]]:
        """Merge a leader's entries that follow a matching position: entries already present
        with the same term are kept (a stale, reordered request never truncates), the first
        conflicting one truncates the log from there. Returns the conflict index (0 if none)
        and the entries actually added."""
        for k, e in enumerate(entries):
            t = self.term_at(e.index)
            if t is None and e.index <= self.snapshot_index:
                continue  # already covered by our snapshot
            if t == e.term:
                continue
            if t is None:
                added = list(entries[k:])
                self.extend(added)
                return 0, added
            if e.index <= commit:
                raise LogConflict(f"entry {e.index} (term {t}) is committed; leader sent {e.term}")
            self.truncate_from(e.index)
            added = list(entries[k:])
            self.extend(added)
            return e.index, added
        return 0, []

    def compact(self, meta: SnapshotMeta) -> None:
        """Drop entries through ``meta.index`` (which this log holds, with ``meta.term``)."""
        drop = meta.index - self.snapshot_index
        del self._entries[:drop]
        self.snapshot_index, self.snapshot_term = meta.index, meta.term
        later = [(i, c) for i, c in self._confs if i > meta.index]
        self._confs = [(meta.index, meta.conf), *later]

    def restore(self, meta: SnapshotMeta) -> bool:
        """Install a leader's snapshot. If the log holds the snapshot's last entry (same index
        and term) the entries after it are kept (Raft §7); otherwise the whole log is
        discarded. Returns whether entries were kept."""
        if self.term_at(meta.index) == meta.term and meta.index <= self.last_index:
            self.compact(meta)
            return True
        self._entries.clear()
        self.snapshot_index, self.snapshot_term = meta.index, meta.term
        self._confs = [(meta.index, meta.conf)]
        return False
