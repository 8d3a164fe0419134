"""Durable storage for the Raft log, written against :class:`~._disk.Disk` only.

The files and the record format are in :mod:`._storage_format`, how a directory is read back in
:mod:`._storage_replay`: log segments (the newest is active; closed ones are compressed),
snapshot files, and records that are length-prefixed, CRC32C-checked CBOR arrays -- log entries,
the hard state, snapshot marks and segment headers.

One :meth:`Storage.persist` appends one batch (``mark? entry* hard-state``) with one append and
one fsync. Every segment starts with a batch ``header, hard-state`` that restates the snapshot
in effect, the last log index and the hard state, so whole segments can be deleted from the
front without losing either. Recovery applies complete batches only: a batch is durable as a
whole or not at all.

Damage: in the newest plain segment a torn tail -- an incomplete record, a final record whose
checksum fails, zero bytes where records should be, complete records after the last complete
batch -- is cut off. Any other failed check raises :class:`StorageCorrupt`: the node refuses to
start rather than serve a log it cannot trust.
"""

from __future__ import annotations

import errno
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence

import attrs
import cbor2
import zstandard

from ._disk import Disk, DiskError, DiskFull
from ._storage_format import (
    _MARK,
    _SNAPSHOT_RE,
    StorageCorrupt,
    StorageError,
    _encode_snapshot,
    _entry_body,
    _framed,
    _hard_state_body,
    _Header,
    _header_body,
    _Pos,
    _put,
    _segment_name,
    _snapshot_name,
)
from ._storage_replay import _plan
from ._types import Entry, HardState, Recovered, Snapshot, SnapshotMeta

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "Storage",
    "StorageCorrupt",
    "StorageError",
    "StorageFailed",
    "StorageStatistics",
    "verified_regions",
]

DEFAULT_SEGMENT_BYTES = 4 * 1024 * 1024


class StorageFailed(StorageError):
    """An earlier disk error left this :class:`Storage` unsure of what is on disk: open the
    directory again (which recovers whatever is durable) and use the new instance."""


@attrs.frozen
class StorageStatistics:
    segments: int
    compressed_segments: int
    segment_file_bytes: int
    active_segment: int
    records_written: int
    bytes_written: int
    fsyncs: int
    """File and directory fsyncs."""
    snapshots_written: int
    segments_removed: int
    snapshot_index: int | None
    last_index: int


def verified_regions(disk: Disk) -> dict[str, tuple[int, int]]:
    """For each file that :meth:`Storage.open` would read, the byte range ``[start, end)`` in
    which any damage makes it raise :class:`StorageCorrupt`. Everything else is either not read
    (temporary files, superseded snapshots, a compressed twin of a plain segment) or the final
    record of the newest segment, where damage cannot be told from a torn write and is cut off
    like one (losing that last, possibly acknowledged, batch). For fault injection in tests
    and the simulator; raises :class:`StorageCorrupt` if the directory is already damaged."""
    plan = _plan(disk)
    regions = {s.file: (0, s.fragile_from) for s in plan.scans}
    if plan.tail is not None:
        regions[plan.tail.file] = (0, plan.tail.fragile_from)
    if plan.snapshot_file is not None:
        regions[plan.snapshot_file] = (0, disk.size(plan.snapshot_file))
    return regions


# --- the storage ------------------------------------------------------------------------------


@attrs.define
class _Segment:
    seq: int
    compressed: bool
    size: int
    max_index: int

    @property
    def file(self) -> str:
        return _segment_name(self.seq, self.compressed)


class Storage:
    """The durable half of a Raft node: its hard state, latest snapshot and log.

    Open with :meth:`open`, which recovers what is durable and hands it back as
    :class:`Recovered`; then :meth:`persist` each ``Ready`` before sending its messages. The
    caller keeps its own log in memory: storage remembers only the positions it needs (the
    snapshot's, the last index, where the term changes). Not thread-safe; one instance per
    directory.

    Errors from :meth:`persist` (a call that raises was not acknowledged):

    * ``DiskFull``: nothing of this call was persisted; the instance is unchanged and usable
      (unless cleaning up failed too: then it raises :class:`StorageFailed` next).
    * ``DiskError`` (a failed fsync, an I/O error): treat it as a crash -- drop the in-memory
      consensus state and :meth:`open` again; what was durable is recovered, the failed call
      maybe. The instance raises :class:`StorageFailed` from then on.
    * ``ValueError``: the call breaks the log's rules (entries not contiguous, not following the
      log or at/below the snapshot; a snapshot older than the one in effect).
    """

    def __init__(self, disk: Disk, segment_bytes: int, segments: list[_Segment]) -> None:
        """Use :meth:`open`."""
        self._disk = disk
        self._segment_bytes = segment_bytes
        self._segments = segments
        self._base: _Pos | None = None
        self._run_starts: list[int] = []  # first index of each run of equal terms after _base
        self._run_terms: list[int] = []
        self._last_index = 0
        self._hard_state = HardState()
        self._failed = False
        self._stats = dict.fromkeys(("records", "bytes", "fsyncs", "snapshots", "removed"), 0)

    @classmethod
    def open(
        cls, disk: Disk, *, segment_bytes: int = DEFAULT_SEGMENT_BYTES
    ) -> tuple[Storage, Recovered]:
        """Recover the directory: delete temporary files, cut a torn tail off the newest
        segment, replay the segments over the snapshot in effect, delete superseded snapshot
        files; start the first segment of an empty directory. Returns the storage and the
        recovered hard state, snapshot (None if none was ever persisted) and the log entries
        after the snapshot, contiguous. A new segment starts when the active one has reached
        ``segment_bytes``.

        Raises :class:`StorageCorrupt` (never start from this directory), ``DiskFull`` (retry
        when there is space) or ``DiskError``. Bootstrap is the caller's business: an empty
        directory recovers as ``Recovered(HardState(), None, ())``.
        """
        if segment_bytes < 1:
            raise ValueError("segment_bytes must be positive")
        plan = _plan(disk)
        doomed = plan.temps + plan.duplicates + plan.stale_snapshots
        tail = plan.tail
        if tail is not None and 0 < tail.good_end < tail.file_size:
            disk.truncate(tail.file, tail.good_end)
            disk.fsync(tail.file)
        elif tail is not None and tail.good_end == 0:
            doomed += (tail.file,)
        for name in doomed:
            disk.remove(name)
        if doomed:
            disk.fsync_dir()
        segments = [
            _Segment(s.seq, s.compressed, s.file_size if s.compressed else s.good_end, s.max_index)
            for s in plan.scans
        ]
        storage = cls(disk, segment_bytes, segments)
        replay = plan.replay
        storage._base, storage._hard_state = replay.base, replay.hard_state
        storage._last_index = replay.base_index
        storage._note_entries(replay.entries)
        if not segments or segments[-1].compressed:
            storage._guarded(storage._start_segment)
        return storage, Recovered(replay.hard_state, plan.snapshot, tuple(replay.entries))

    def persist(
        self,
        *,
        snapshot: Snapshot | None = None,
        entries: Sequence[Entry] = (),
        hard_state: HardState | None = None,
        restore: bool = False,
    ) -> None:
        """Make ``snapshot``, then ``entries``, then ``hard_state`` durable -- all of it or
        (after a crash) none of it -- with one fsync of the log (plus the snapshot file's).

        ``snapshot``: the log through its index is dropped. The entries after it are kept if
        the log holds the snapshot's own entry (same index and term) and ``restore`` is false
        (a local compaction); otherwise (``restore``: a leader's snapshot was installed) the
        whole log is dropped and the caller re-persists in ``entries`` whatever it kept.
        ``entries``: contiguous; an entry at or below the last stored index first truncates the
        log from there (overwrite). ``hard_state``: None keeps the current one.
        Returns once all of it is durable; see the class for the errors.
        """
        if self._failed:
            raise StorageFailed("a disk error interrupted this storage: open it again")
        if snapshot is None and not entries and hard_state is None:
            return
        keep = self._check(snapshot, entries, restore)
        hs = self._hard_state if hard_state is None else hard_state
        parts: list[bytes] = []
        if snapshot is not None:
            _put(parts, cbor2.dumps([_MARK, snapshot.meta.index, snapshot.meta.term, keep]))
        for e in entries:
            _put(parts, _entry_body(e))
        _put(parts, _hard_state_body(hs))
        try:
            if self._segments[-1].size >= self._segment_bytes:
                self._rotate()
            if snapshot is not None:
                self._write_snapshot(snapshot)
            self._append(b"".join(parts))
            self._fsync(self._segments[-1].file)
        except DiskFull:
            raise
        except DiskError:
            self._failed = True
            raise
        self._stats["records"] += len(parts) // 3
        self._stats["bytes"] += sum(map(len, parts))
        self._hard_state = hs
        if snapshot is not None:
            self._note_snapshot(snapshot.meta, keep)
        self._note_entries(entries)
        if entries:
            active = self._segments[-1]
            active.max_index = max(active.max_index, self._last_index)
        if snapshot is not None:
            self._guarded(self._compact)

    def _check(self, snapshot: Snapshot | None, entries: Sequence[Entry], restore: bool) -> bool:
        """Validate a persist call; returns whether a snapshot keeps the log after it."""
        keep = False
        floor, last = self._base_index, self._last_index
        if snapshot is not None:
            index, term = snapshot.meta.index, snapshot.meta.term
            same = self._base is not None and index == floor
            if index < floor or (same and self._base != _Pos(index, term)):
                raise ValueError(f"snapshot {index} is older than the one in effect")
            keep = not restore and self.term_at(index) == term
            floor, last = index, (max(last, index) if keep else index)
        if entries:
            first = entries[0].index
            if not floor < first <= last + 1:
                raise ValueError(f"entry {first} does not follow the log ({floor}, {last}]")
            for k, e in enumerate(entries):
                if e.index != first + k:
                    raise ValueError("entries are not contiguous")
        return keep

    # --- disk steps -----------------------------------------------------------------------

    def _append(self, batch: bytes) -> None:
        active = self._segments[-1]
        try:
            self._disk.append(active.file, batch)
        except DiskFull:
            self._cleanup(self._disk.truncate, active.file, active.size)
            raise
        active.size += len(batch)

    def _fsync(self, name: str) -> None:
        self._stats["fsyncs"] += 1
        self._guarded(self._disk.fsync, name)

    def _fsync_dir(self) -> None:
        self._stats["fsyncs"] += 1
        self._guarded(self._disk.fsync_dir)

    def _guarded(self, op: Callable[..., object], *args: object) -> None:
        """Run ``op``; if it fails, no longer trust this instance's view of the disk."""
        try:
            op(*args)
        except DiskError:
            self._failed = True
            raise

    def _cleanup(self, op: Callable[..., object], *args: object) -> None:
        """Undo a write that ran out of space; if that fails too, give up on this instance
        (the error being handled is the one the caller sees)."""
        try:
            op(*args)
        except DiskError as exc:
            if exc.errno != errno.ENOENT:
                self._failed = True

    def _write_new(self, name: str, data: bytes) -> None:
        """Create ``name`` holding ``data`` and sync it; on DiskFull remove the partial file."""
        try:
            self._disk.append(name, data)
        except DiskFull:
            self._cleanup(self._disk.remove, name)
            raise
        self._fsync(name)

    def _write_renamed(self, temp: str, final: str, data: bytes) -> None:
        """Write ``data`` to ``temp``, sync it and rename it to ``final``, durably."""
        self._write_new(temp, data)
        try:
            self._disk.rename(temp, final)
        except DiskFull:
            self._cleanup(self._disk.remove, temp)
            raise
        self._fsync_dir()

    def _write_snapshot(self, snapshot: Snapshot) -> None:
        final = _snapshot_name(snapshot.meta.index)
        self._write_renamed(final.removesuffix(".snap") + ".tmp", final, _encode_snapshot(snapshot))
        self._stats["snapshots"] += 1

    def _rotate(self) -> None:
        self._fsync(self._segments[-1].file)  # a cut-back tail must be durable before closing
        self._start_segment()
        for seg in self._segments[:-1]:
            if not seg.compressed and not self._compress(seg):
                break

    def _start_segment(self) -> None:
        seq = self._segments[-1].seq + 1 if self._segments else 1
        parts: list[bytes] = []
        _put(parts, _header_body(_Header(seq, self._base, self._last_index)))
        _put(parts, _hard_state_body(self._hard_state))
        data = b"".join(parts)
        self._write_new(_segment_name(seq), data)
        self._fsync_dir()
        self._segments.append(_Segment(seq, False, len(data), 0))

    def _compress(self, seg: _Segment) -> bool:
        """Replace closed segment ``seg`` by its ``.zst`` form; False if the disk is full (the
        plain form stays, which recovery reads as well)."""
        packed = _segment_name(seg.seq, True)
        blob = _framed(zstandard.ZstdCompressor().compress(self._disk.read(seg.file)))
        try:
            self._write_renamed(packed + ".tmp", packed, blob)
        except DiskFull:
            return False
        self._disk.remove(seg.file)
        seg.compressed, seg.size = True, len(blob)
        return True

    def _compact(self) -> None:
        """Delete the oldest closed segments whose entries the snapshot covers -- one at a time,
        each removal durable, so what is left is always a run of consecutive segments -- and
        superseded snapshot files."""
        while len(self._segments) > 1 and self._segments[0].max_index <= self._base_index:
            self._disk.remove(self._segments.pop(0).file)
            self._fsync_dir()
            self._stats["removed"] += 1
        current = _snapshot_name(self._base_index)
        stale = [n for n in self._disk.list() if _SNAPSHOT_RE.fullmatch(n) and n != current]
        for name in stale:
            self._disk.remove(name)
        if stale:
            self._fsync_dir()

    # --- the positions storage remembers ------------------------------------------------

    @property
    def _base_index(self) -> int:
        return 0 if self._base is None else self._base.index

    @property
    def last_index(self) -> int:
        """Index of the last stored entry (the snapshot's index if the log after it is empty)."""
        return self._last_index

    def term_at(self, index: int) -> int | None:
        """The term of the stored entry at ``index`` (the snapshot's at its index; 0 at index 0
        before any snapshot); None outside the stored log."""
        if index == self._base_index:
            return 0 if self._base is None else self._base.term
        if not self._base_index < index <= self._last_index:
            return None
        return self._run_terms[bisect_right(self._run_starts, index) - 1]

    def _note_snapshot(self, meta: SnapshotMeta, keep: bool) -> None:
        starts, terms = self._run_starts, self._run_terms
        if keep and meta.index < self._last_index:
            k = bisect_right(starts, meta.index + 1) - 1
            del starts[:k], terms[:k]
            starts[0] = meta.index + 1
        else:
            starts.clear()
            terms.clear()
        self._base = _Pos(meta.index, meta.term)
        self._last_index = max(self._last_index, meta.index) if keep else meta.index

    def _note_entries(self, entries: Sequence[Entry]) -> None:
        if not entries:
            return
        starts, terms = self._run_starts, self._run_terms
        if entries[0].index <= self._last_index:
            cut = bisect_left(starts, entries[0].index)
            del starts[cut:], terms[cut:]
        for e in entries:
            if not terms or terms[-1] != e.term:
                starts.append(e.index)
                terms.append(e.term)
        self._last_index = entries[-1].index

    def statistics(self) -> StorageStatistics:
        segments = self._segments
        return StorageStatistics(
            segments=len(segments),
            compressed_segments=sum(s.compressed for s in segments),
            segment_file_bytes=sum(s.size for s in segments),
            active_segment=segments[-1].seq,
            records_written=self._stats["records"],
            bytes_written=self._stats["bytes"],
            fsyncs=self._stats["fsyncs"],
            snapshots_written=self._stats["snapshots"],
            segments_removed=self._stats["removed"],
            snapshot_index=None if self._base is None else self._base.index,
            last_index=self._last_index,
        )
