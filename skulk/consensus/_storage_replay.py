"""Reading a storage directory back (:mod:`._storage`'s start-up): scanning segments,
replaying their batches over the snapshot in effect, and the plan of what to repair.

The format read is in :mod:`._storage_format`. :func:`_scan` takes damage at the end of the
newest plain segment for a torn tail and reports where to cut it (``good_end``); any other
failed check raises :class:`StorageCorrupt`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs

from ._disk import Disk
from ._storage_format import (
    _HEADER_BYTES,
    _PLAIN_RE,
    _SEGMENT_RE,
    _SNAPSHOT_RE,
    _TEMP_RE,
    StorageCorrupt,
    _Bad,
    _decode,
    _decode_snapshot,
    _Header,
    _Mark,
    _Pos,
    _Record,
    _record_end,
    _segment_name,
    _snapshot_name,
    _unframe,
    _zero,
)
from ._types import (
    Entry,
    HardState,
    Snapshot,
)


@attrs.frozen
class _Scan:
    """One segment as read: complete batches ``(offset, records)`` and where damage would be
    taken for a torn write (``fragile_from``; the file's size for closed segments)."""

    seq: int
    file: str
    file_size: int
    compressed: bool
    batches: tuple[tuple[int, tuple[_Record, ...]], ...]
    good_end: int
    fragile_from: int
    max_index: int


def _scan(seq: int, file: str, data: bytes, *, compressed: bool, tail: bool) -> _Scan:
    view = memoryview(data) if not compressed else memoryview(_unframe(file, data))
    batches: list[tuple[int, tuple[_Record, ...]]] = []
    pending: list[_Record] = []
    at = good_end = last_start = batch_at = max_index = 0
    while at < len(view):
        end = _record_end(file, view, at, tail=tail)
        if end is None:
            break
        try:
            record = _decode(view[at + _HEADER_BYTES : end])
        except _Bad as exc:
            raise StorageCorrupt(file, at, str(exc)) from None
        batch_at = batch_at if pending else at
        pending.append(record)
        last_start, at = at, end
        if type(record) is HardState:
            batches.append((batch_at, tuple(pending)))
            max_index = max([max_index, *(r.index for r in pending if type(r) is Entry)])
            pending.clear()
            good_end = at
    if not tail and good_end != len(view):
        raise StorageCorrupt(file, good_end, "the segment ends inside a batch of records")
    fragile = at if at < len(view) and not _zero(view[at:]) else last_start
    fragile = fragile if tail else len(data)
    return _Scan(seq, file, len(data), compressed, tuple(batches), good_end, fragile, max_index)


@attrs.define
class _Replay:
    """The log as replayed so far: entries ``(base.index, first)`` were in deleted segments
    (a later snapshot mark must cover them), ``entries`` run from ``first``."""

    base: _Pos | None
    first: int
    entries: list[Entry]
    hard_state: HardState

    @property
    def base_index(self) -> int:
        return 0 if self.base is None else self.base.index

    @property
    def last_index(self) -> int:
        return self.first + len(self.entries) - 1

    def header(self, h: _Header, hs: HardState) -> None:
        if (h.snapshot, h.last_index) != (self.base, self.last_index):
            raise _Bad("segment does not continue the previous one (a segment is missing)")
        self.hard_state = hs

    def mark(self, m: _Mark) -> None:
        same_index = self.base is not None and m.index == self.base.index
        if m.index < self.base_index or (same_index and self.base != _Pos(m.index, m.term)):
            raise _Bad("snapshot mark goes backwards")
        if m.keep and m.index < self.last_index:
            drop = max(0, m.index + 1 - self.first)
            del self.entries[:drop]
            self.first += drop
        else:
            self.entries.clear()
            self.first = m.index + 1
        self.base = _Pos(m.index, m.term)

    def entry(self, e: Entry) -> None:
        if not self.base_index < e.index <= self.last_index + 1:
            raise _Bad(f"entry {e.index} does not follow the log (gap or below the snapshot)")
        if e.index < self.first:
            self.entries.clear()
            self.first = e.index
        del self.entries[e.index - self.first :]
        self.entries.append(e)


def _start(first: tuple[_Record, ...]) -> _Replay:
    h, hs = first
    assert type(h) is _Header and type(hs) is HardState
    if h.last_index < (0 if h.snapshot is None else h.snapshot.index):
        raise _Bad("segment header places the log before its snapshot")
    return _Replay(h.snapshot, h.last_index + 1, [], hs)


def _apply(state: _Replay, records: tuple[_Record, ...]) -> None:
    for k, r in enumerate(records[:-1]):
        if type(r) is Entry:
            state.entry(r)
        elif type(r) is _Mark and k == 0:
            state.mark(r)
        else:
            raise _Bad("records out of order in a batch")
    hs = records[-1]
    assert type(hs) is HardState
    state.hard_state = hs


def _replay(scans: Sequence[_Scan]) -> _Replay:
    state: _Replay | None = None
    for scan in scans:
        for k, (at, records) in enumerate(scan.batches):
            try:
                head = type(records[0]) is _Header
                if head != (k == 0) or (head and len(records) != 2):
                    raise _Bad("a segment must start with exactly one header batch")
                h = records[0]
                if type(h) is _Header and h.seq != scan.seq:
                    raise _Bad(f"the file holds segment {h.seq}")
                if type(h) is _Header and state is None:
                    state = _start(records)
                elif type(h) is _Header:
                    assert state is not None and type(records[1]) is HardState
                    state.header(h, records[1])
                elif state is not None:
                    _apply(state, records)
            except _Bad as exc:
                raise StorageCorrupt(scan.file, at, str(exc)) from None
    if state is None:
        return _Replay(None, 1, [], HardState())
    if state.first > state.base_index + 1:
        raise StorageCorrupt(scans[0].file, None, "log entries before it are missing")
    return state


@attrs.frozen
class _Plan:
    """What :meth:`Storage.open` finds, before it repairs anything."""

    temps: tuple[str, ...]
    duplicates: tuple[str, ...]
    scans: tuple[_Scan, ...]
    """The segments replayed (without an empty newest one)."""
    tail: _Scan | None
    """The newest plain segment, if it is the newest segment (cut at ``good_end``)."""
    stale_snapshots: tuple[str, ...]
    replay: _Replay
    snapshot: Snapshot | None
    snapshot_file: str | None


def _scan_segments(disk: Disk, names: tuple[str, ...]) -> list[_Scan]:
    """Every segment, oldest first, in its plain form where both exist."""
    found = [(int(m[1]), bool(m[2])) for m in map(_SEGMENT_RE.fullmatch, names) if m]
    plain = {seq for seq, packed in found if not packed}
    seqs = sorted({seq for seq, _ in found})
    for a, b in itertools.pairwise(seqs):
        if b != a + 1:
            raise StorageCorrupt(_segment_name(a + 1), None, "this segment file is missing")
    scans = []
    for seq in seqs:
        name, packed = _segment_name(seq, seq not in plain), seq not in plain
        tail = seq == seqs[-1] and not packed
        scans.append(_scan(seq, name, disk.read(name), compressed=packed, tail=tail))
    return scans


def _load_snapshot(disk: Disk, base: _Pos | None, files: dict[int, str]) -> Snapshot | None:
    if base is None:
        return None
    name = _snapshot_name(base.index)
    if base.index not in files:
        raise StorageCorrupt(name, None, "the snapshot in effect is missing")
    snapshot = _decode_snapshot(name, disk.read(name))
    if _Pos(snapshot.meta.index, snapshot.meta.term) != base:
        raise StorageCorrupt(name, None, "snapshot is not the one the log refers to")
    return snapshot


def _plan(disk: Disk) -> _Plan:
    names = disk.list()
    scans = _scan_segments(disk, names)
    tail = scans[-1] if scans and not scans[-1].compressed else None
    if tail is not None and tail.good_end == 0:
        scans.pop()
    snapshots = {int(m[1]): m[0] for m in map(_SNAPSHOT_RE.fullmatch, names) if m}
    if not scans and snapshots:
        raise StorageCorrupt(snapshots[max(snapshots)], None, "snapshot without any log segment")
    replay = _replay(scans)
    snapshot = _load_snapshot(disk, replay.base, snapshots)
    current = None if replay.base is None else _snapshot_name(replay.base.index)
    return _Plan(
        temps=tuple(n for n in names if _TEMP_RE.fullmatch(n)),
        duplicates=tuple(
            f"{n}.zst" for n in names if _PLAIN_RE.fullmatch(n) and f"{n}.zst" in names
        ),
        scans=tuple(scans),
        tail=tail,
        stale_snapshots=tuple(n for n in snapshots.values() if n != current),
        replay=replay,
        snapshot=snapshot,
        snapshot_file=current,
    )
