"""The on-disk format of :mod:`._storage`: file names, records, their encoding and checks,
snapshot files, and reading a directory back (scanning segments, replaying batches).

Files (a flat directory)::

    0000000000000001.seg       log segments (16-digit sequence number); the newest is active
    0000000000000001.seg.zst   a closed segment, compressed
    snap-00000000000000000042.snap   the snapshot at index 42 (20-digit index)
    *.tmp                      half-written files: deleted at start-up

A *record* is ``length:u32 | crc32c(body):u32 | crc32c(the previous 8 bytes):u32 | body``
(big-endian); the body is one CBOR array ``[kind, fields...]``:

* ``[0, index, term, kind 0 noop / 1 command / 2 conf, data, client_id, seq, conf]`` with
  ``conf`` null or ``[op 0 add_learner / 1 promote / 2 remove, node]``: a log entry;
* ``[1, term, vote or null, commit]``: the hard state; it ends every *batch*;
* ``[2, index, term, keep]``: snapshot mark -- the snapshot ``(index, term)`` is in effect; the
  log through ``index`` is dropped, and the entries after it too unless ``keep``;
* ``[3, 1 (format version), seq, [index, term] or null, last_index]``: segment header.

A snapshot file and a ``.seg.zst`` are each exactly one record whose body is a zstd frame (of
``[1, index, term, voters, learners, data]``, resp. of the plain segment). A failed check raises
:class:`StorageCorrupt` (defined here with :class:`StorageError`; :mod:`._storage` re-exports
both), except that :func:`_scan` takes damage at the end of the newest plain segment for a
torn tail and reports where to cut it (``good_end``).
"""

from __future__ import annotations

import itertools
import re
import struct
from collections.abc import Callable, Sequence

import attrs
import cbor2
import zstandard
from crc32c import crc32c

from ._disk import Disk
from ._types import (
    ConfChange,
    ConfOp,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Snapshot,
    SnapshotMeta,
)

FORMAT_VERSION = 1
_HEAD = struct.Struct(">II")
_HCRC = struct.Struct(">I")
_HEADER_BYTES = 12
_ENTRY, _HARD_STATE, _MARK, _SEGMENT = range(4)
_KINDS = (EntryKind.NOOP, EntryKind.COMMAND, EntryKind.CONF)
_KIND_CODES = {kind: code for code, kind in enumerate(_KINDS)}
_OPS: tuple[ConfOp, ...] = ("add_learner", "promote", "remove")
_OP_CODES = {op: code for code, op in enumerate(_OPS)}
_SEGMENT_RE = re.compile(r"(\d{16})\.seg(\.zst)?")
_PLAIN_RE = re.compile(r"\d{16}\.seg")
_SNAPSHOT_RE = re.compile(r"snap-(\d{20})\.snap")
_TEMP_RE = re.compile(r"(\d{16}\.seg\.zst|snap-\d{20})\.tmp")


class StorageError(Exception):
    """Base of storage's own errors (the disk's are ``DiskError`` / ``DiskFull``)."""


@attrs.frozen(auto_exc=True)
class StorageCorrupt(StorageError):
    """``file`` failed a check at byte ``offset`` (None: the file as a whole; for a
    ``.seg.zst``, an offset in its decompressed content) for ``reason``. Not repairable
    locally: the node must not start from this directory."""

    file: str
    offset: int | None
    reason: str

    def __str__(self) -> str:
        where = "" if self.offset is None else f" at byte {self.offset}"
        return (
            f"{self.file} is corrupt{where}: {self.reason}; refusing to start. This node's "
            "data directory cannot be trusted: remove it and re-add the node to the cluster, "
            "which restores its state from a peer (or restore the directory from a backup)."
        )


# --- records --------------------------------------------------------------------------------


@attrs.frozen
class _Pos:
    index: int
    term: int


@attrs.frozen
class _Mark:
    index: int
    term: int
    keep: bool


@attrs.frozen
class _Header:
    seq: int
    snapshot: _Pos | None
    last_index: int


_Record = Entry | HardState | _Mark | _Header


class _Bad(Exception):
    """A well-checksummed body that is not a valid record or batch (becomes StorageCorrupt)."""


def _put(parts: list[bytes], body: bytes) -> None:
    head = _HEAD.pack(len(body), crc32c(body))
    parts += (head, _HCRC.pack(crc32c(head)), body)


def _framed(body: bytes) -> bytes:
    parts: list[bytes] = []
    _put(parts, body)
    return b"".join(parts)


def _entry_body(e: Entry) -> bytes:
    conf = None if e.conf is None else [_OP_CODES[e.conf.op], e.conf.node]
    kind = _KIND_CODES[e.kind]
    return cbor2.dumps([_ENTRY, e.index, e.term, kind, e.data, e.client_id, e.seq, conf])


def _hard_state_body(hs: HardState) -> bytes:
    return cbor2.dumps([_HARD_STATE, hs.term, hs.vote, hs.commit])


def _header_body(h: _Header) -> bytes:
    snap = None if h.snapshot is None else [h.snapshot.index, h.snapshot.term]
    return cbor2.dumps([_SEGMENT, FORMAT_VERSION, h.seq, snap, h.last_index])


def _int(x: object) -> int:
    if type(x) is not int:
        raise _Bad(f"expected an integer, found {type(x).__name__}")
    return x


def _bytes(x: object) -> bytes:
    if type(x) is not bytes:
        raise _Bad(f"expected bytes, found {type(x).__name__}")
    return x


def _str(x: object) -> str:
    if type(x) is not str:
        raise _Bad(f"expected a text string, found {type(x).__name__}")
    return x


def _code(x: object, table: tuple[object, ...]) -> int:
    if type(x) is not int or not 0 <= x < len(table):
        raise _Bad(f"unknown code {x!r}")
    return x


def _decode_entry(f: list[object]) -> Entry:
    _, index, term, kind, data, client_id, seq, conf = f
    change = None
    if conf is not None:
        if type(conf) is not list or len(conf) != 2:
            raise _Bad("bad membership change")
        change = ConfChange(_OPS[_code(conf[0], _OPS)], _str(conf[1]))
    kind_ = _KINDS[_code(kind, _KINDS)]
    return Entry(_int(index), _int(term), kind_, _bytes(data), _str(client_id), _int(seq), change)


def _decode_hard_state(f: list[object]) -> HardState:
    _, term, vote, commit = f
    return HardState(_int(term), None if vote is None else _str(vote), _int(commit))


def _decode_mark(f: list[object]) -> _Mark:
    _, index, term, keep = f
    if type(keep) is not bool:
        raise _Bad("bad snapshot mark")
    return _Mark(_int(index), _int(term), keep)


def _decode_header(f: list[object]) -> _Header:
    _, version, seq, snap, last_index = f
    if version != FORMAT_VERSION or type(version) is not int:
        raise _Bad(f"unsupported format version {version!r}")
    pos = None
    if snap is not None:
        if type(snap) is not list or len(snap) != 2:
            raise _Bad("bad segment header")
        pos = _Pos(_int(snap[0]), _int(snap[1]))
    return _Header(_int(seq), pos, _int(last_index))


_DECODERS: dict[int, tuple[int, Callable[[list[object]], _Record]]] = {
    _ENTRY: (8, _decode_entry),
    _HARD_STATE: (4, _decode_hard_state),
    _MARK: (4, _decode_mark),
    _SEGMENT: (5, _decode_header),
}


def _decode(body: memoryview) -> _Record:
    try:
        item = cbor2.loads(body)
    except Exception as exc:  # whatever cbor2 raises on bad bytes is damage
        raise _Bad(f"undecodable record ({exc})") from None
    if type(item) is not list or not item or type(item[0]) is not int:
        raise _Bad("not a record")
    arity, decoder = _DECODERS.get(item[0], (-1, _decode_entry))
    if len(item) != arity:
        raise _Bad(f"unknown record kind {item[0]} or wrong field count")
    return decoder(item)


def _zero(view: memoryview) -> bool:
    return not view.tobytes().strip(b"\0")


def _record_end(name: str, view: memoryview, at: int, *, tail: bool) -> int | None:
    """End of the record starting at ``at``; None if it is a torn write (``tail`` only)."""
    size = len(view)
    if size - at < _HEADER_BYTES:
        if tail:
            return None
        raise StorageCorrupt(name, at, "truncated record header")
    length: int
    crc: int
    length, crc = _HEAD.unpack_from(view, at)
    if crc32c(view[at : at + 8]) != _HCRC.unpack_from(view, at + 8)[0]:
        if tail and _zero(view[at:]):
            return None
        raise StorageCorrupt(name, at, "record header checksum mismatch")
    end = at + _HEADER_BYTES + length
    if end > size:
        if tail:
            return None
        raise StorageCorrupt(name, at, "record runs past the end of the file")
    if crc32c(view[at + _HEADER_BYTES : end]) != crc:
        if tail and _zero(view[end:]):
            return None
        raise StorageCorrupt(name, at, "checksum mismatch")
    return end


def _unframe(name: str, data: bytes) -> bytes:
    """The decompressed body of a file holding exactly one record of a zstd frame."""
    view = memoryview(data)
    end = _record_end(name, view, 0, tail=False)
    if end != len(data):
        raise StorageCorrupt(name, end, "unexpected bytes after the record")
    try:
        return bytes(zstandard.ZstdDecompressor().decompress(view[_HEADER_BYTES:]))
    except zstandard.ZstdError as exc:
        raise StorageCorrupt(name, _HEADER_BYTES, f"bad compressed data ({exc})") from None


# --- snapshot files ---------------------------------------------------------------------------


def _snapshot_name(index: int) -> str:
    return f"snap-{index:020d}.snap"


def _segment_name(seq: int, compressed: bool = False) -> str:
    return f"{seq:016d}.seg" + (".zst" if compressed else "")


def _encode_snapshot(s: Snapshot) -> bytes:
    conf = s.meta.conf
    body = [FORMAT_VERSION, s.meta.index, s.meta.term, conf.voters, conf.learners, s.data]
    return _framed(zstandard.ZstdCompressor().compress(cbor2.dumps(body)))


def _decode_snapshot(name: str, data: bytes) -> Snapshot:
    try:
        item = cbor2.loads(_unframe(name, data))
        if type(item) is not list or len(item) != 6 or item[0] != FORMAT_VERSION:
            raise _Bad("not a snapshot of a known format")
        _, index, term, voters, learners, image = item
        if type(voters) is not list or type(learners) is not list:
            raise _Bad("bad membership")
        conf = ConfState(tuple(map(_str, voters)), tuple(map(_str, learners)))
        return Snapshot(SnapshotMeta(_int(index), _int(term), conf), _bytes(image))
    except (_Bad, cbor2.CBORDecodeError) as exc:
        raise StorageCorrupt(name, None, f"bad snapshot ({exc})") from None


# --- scanning and replay ----------------------------------------------------------------------


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
