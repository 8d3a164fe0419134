"""The on-disk format of :mod:`._storage`: file names, records, their encoding and checks,
and snapshot files. Reading a directory back (scanning segments, replaying batches) is in
:mod:`._storage_replay`.

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
both), except that :func:`~._storage_replay._scan` takes damage at the end of the newest plain
segment for a torn tail and reports where to cut it (``good_end``).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable

import attrs
import cbor2
import zstandard
from crc32c import crc32c

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
