"""The fetched-weights store: ``<home>/models/.peer/<model>/``, in the model's own layout.

Every file of the manifest keeps its name. A safetensors file is a sparse file of its full
size: its header and the tensors fetched so far are written at their original offsets, the
rest are holes (never read: a runner evaluates only the tensors its shard needs, and those
are fetched). A small file (config, tokenizer, index) is fetched whole into ``.<name>.part``
and renamed into place once it verified.

A *piece* is what is verified at once: a safetensors header, one tensor, or a whole small
file (its ``[start, end)`` and the sha256 the manifest gives it). The record
``.skulk-fetch.cbor`` lists the verified pieces; it is written atomically (tmp + fsync +
rename + directory fsync) and only after the pieces' data was fsynced, so after a crash it
never claims a byte that is not on disk: it is the truth on restart. The manifest itself is
kept as ``.skulk-manifest.cbor`` (its bytes hash to the card's ``manifest_sha256``).

Everything here is blocking file I/O: call it from a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

import attrs

from skulk.models import fsync_directory, manifest_sha256, write_atomically
from skulk.wire import Codec, WireError
from skulk.wire.transfer import ByteRange, FileEntry, Manifest

RECORD_NAME = ".skulk-fetch.cbor"
MANIFEST_NAME = ".skulk-manifest.cbor"
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
_PLAIN_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


@attrs.frozen
class Piece:
    """``[start, end)`` of ``file``, verified against ``sha256`` at once. ``whole``: the
    file is small and fetched whole (into its ``.part`` file)."""

    file: str
    start: int
    end: int
    sha256: bytes
    whole: bool

    @property
    def size(self) -> int:
        return self.end - self.start

    @property
    def key(self) -> tuple[str, int, int]:
        return (self.file, self.start, self.end)


@attrs.frozen
class _RecordFile:
    name: str
    ranges: tuple[ByteRange, ...]


@attrs.frozen
class FetchRecord:
    """What the store holds verified (see the module doc)."""

    manifest_sha256: str
    files: tuple[_RecordFile, ...]


_RECORD_CODEC: Codec[FetchRecord] = Codec(FetchRecord, max_frame_size=512 * 1024 * 1024)


def store_directory(home: Path, model_id: str) -> Path:
    """Where fetched weights of ``model_id`` live on a node with data dir ``home``. A plain id
    is used as it is; others (``org/repo``) are made plain and suffixed with a hash of the id,
    so two ids never share a directory."""
    if _PLAIN_ID.match(model_id) and model_id not in (".", ".."):
        name = model_id
    else:
        plain = re.sub(r"[^A-Za-z0-9_.-]", "-", model_id).strip(".-")[:80] or "model"
        name = f"{plain}-{hashlib.sha256(model_id.encode()).hexdigest()[:12]}"
    return home / "models" / ".peer" / name


def pieces_of(entry: FileEntry) -> list[Piece]:
    """Every piece of one file: the whole file, or the header and each tensor."""
    if entry.header_length is None or entry.header_sha256 is None:
        return [Piece(entry.name, 0, entry.size, entry.sha256, True)]
    header = Piece(entry.name, 0, entry.header_length, entry.header_sha256, False)
    return [header] + [Piece(entry.name, t.start, t.end, t.sha256, False) for t in entry.tensors]


def part_path(directory: Path, name: str) -> Path:
    return directory / f".{name}.part"


class PeerStore:
    """One model's store directory (see the module doc); blocking methods."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def stored_manifest(self, expected_sha256: str) -> bytes | None:
        """The kept manifest if it hashes to ``expected_sha256``."""
        try:
            body = (self.directory / MANIFEST_NAME).read_bytes()
        except OSError:
            return None
        return body if manifest_sha256(body) == expected_sha256 else None

    def reset(self, manifest_body: bytes) -> None:
        """Start over for a new manifest: everything in the directory goes (an older version
        of the model), then the manifest is kept."""
        if self.directory.exists():
            shutil.rmtree(self.directory)
        self.directory.mkdir(parents=True)
        write_atomically(self.directory / MANIFEST_NAME, manifest_body)

    def open(self, manifest: Manifest, sha256: str) -> set[tuple[str, int, int]]:
        """Make the layout (a sparse file of the right size for every safetensors file) and
        return the keys of the pieces verified before: those the record lists, for the same
        manifest, whose file is still there with its size (others are fetched again)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        recorded = self._read_record(sha256)
        verified: set[tuple[str, int, int]] = set()
        for entry in manifest.files:
            path = self.directory / entry.name
            valid = {p.key for p in pieces_of(entry)}
            kept = {(entry.name, r.start, r.end) for r in recorded.get(entry.name, ())} & valid
            try:
                size = path.stat().st_size
            except FileNotFoundError:
                size = -1
            if entry.header_length is not None and size != entry.size:
                with open(path, "wb") as f:  # new (or wrong): sparse, nothing verified in it
                    f.truncate(entry.size)
                kept = set()
            elif entry.header_length is None and size != entry.size:
                kept = set()
            verified |= kept
        return verified

    def record(self, sha256: str, verified: Iterable[tuple[str, int, int]]) -> None:
        """Write the record: exactly ``verified`` (atomically). Their data must be fsynced."""
        by_file: dict[str, list[ByteRange]] = {}
        for name, start, end in sorted(verified):
            by_file.setdefault(name, []).append(ByteRange(start, end))
        record = FetchRecord(
            sha256, tuple(_RecordFile(n, tuple(rs)) for n, rs in sorted(by_file.items()))
        )
        write_atomically(self.directory / RECORD_NAME, _RECORD_CODEC.encode(record))

    def _read_record(self, sha256: str) -> dict[str, tuple[ByteRange, ...]]:
        try:
            record = _RECORD_CODEC.decode((self.directory / RECORD_NAME).read_bytes())
        except (OSError, WireError):
            return {}
        if record.manifest_sha256 != sha256:
            return {}
        return {f.name: f.ranges for f in record.files}


class CorruptPiece(Exception):
    """A piece's bytes do not hash to what the manifest says."""

    def __init__(self, piece: Piece) -> None:
        super().__init__(f"{piece.file} bytes [{piece.start}, {piece.end}) fail their sha256")
        self.piece = piece


class TooMuchData(Exception):
    """More bytes arrived than the ranges asked for."""


class BatchWriter:
    """Writes one request's bytes (the pieces of one file, in order, as one concatenated
    stream) at their offsets and hashes each piece as it completes. Blocking: use from one
    worker thread at a time. ``OSError`` (``errno`` in :data:`FULL_ERRNOS` for a full disk)
    from :meth:`feed`, :meth:`sync` and :meth:`finish`."""

    def __init__(self, directory: Path, pieces: list[Piece]) -> None:
        assert pieces and len({p.file for p in pieces}) == 1
        self._pieces = pieces
        self._whole = pieces[0].whole
        name = pieces[0].file
        self._final = directory / name
        self._directory = directory
        self._path = part_path(directory, name) if self._whole else self._final
        flags = os.O_WRONLY | (os.O_CREAT | os.O_TRUNC if self._whole else 0)
        self._fd: int | None = os.open(self._path, flags, 0o644)
        self._index = 0
        self._offset = 0  # into the current piece
        self._hasher = hashlib.sha256()
        self.verified: list[Piece] = []
        self.verified_bytes = 0

    @property
    def file(self) -> str:
        return self._pieces[0].file

    @property
    def landed(self) -> int:
        """Bytes written so far: the pieces verified and the one in progress."""
        return self.verified_bytes + self._offset

    @property
    def complete(self) -> bool:
        return self._index == len(self._pieces)

    @property
    def partial(self) -> int:
        """Bytes received of the piece in progress."""
        return self._offset

    def feed_all(self, chunks: Iterable[bytes | memoryview]) -> None:
        """:meth:`feed` each of ``chunks`` in turn (one worker-thread hop for several)."""
        for data in chunks:
            self.feed(data)

    def feed(self, data: bytes | memoryview) -> list[Piece]:
        """Write and hash ``data``; the pieces it completed (and verified). Raises
        :class:`CorruptPiece` at the first piece that fails its hash (it is not written
        further), :class:`TooMuchData` past the last piece."""
        assert self._fd is not None
        view = memoryview(data)
        done: list[Piece] = []
        while True:
            while self._index < len(self._pieces) and self._offset == self._current.size:
                done.append(self._finish_piece())  # zero-length pieces complete at once too
            if not view:
                return done
            if self._index == len(self._pieces):
                raise TooMuchData(f"{len(view)} bytes beyond the ranges asked for")
            piece = self._current
            take = view[: piece.size - self._offset]
            _pwrite_all(self._fd, take, piece.start + self._offset)
            self._hasher.update(take)
            self._offset += len(take)
            view = view[len(take) :]

    @property
    def _current(self) -> Piece:
        return self._pieces[self._index]

    def _finish_piece(self) -> Piece:
        piece = self._current
        if self._hasher.digest() != piece.sha256:
            raise CorruptPiece(piece)
        self._index += 1
        self._offset = 0
        self._hasher = hashlib.sha256()
        self.verified.append(piece)
        self.verified_bytes += piece.size
        return piece

    def sync(self) -> None:
        """fsync what was written (before any of it is recorded)."""
        if self._fd is not None:
            os.fsync(self._fd)

    def finish(self) -> None:
        """Close; a whole file that verified is renamed into place (then the directory is
        fsynced); an unverified part file is removed."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        if not self._whole:
            return
        if self.verified:
            os.replace(self._path, self._final)
            fsync_directory(self._directory)
        else:
            with contextlib.suppress(OSError):
                self._path.unlink()

    def abort(self) -> None:
        """Close without syncing (the pieces stay unrecorded)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
            if self._whole:
                with contextlib.suppress(OSError):
                    self._path.unlink()


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n
