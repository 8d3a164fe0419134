"""A model directory's weight manifest: every file a runner needs, every tensor, their hashes.

:func:`local_manifest` reads a model directory into a :class:`~skulk.wire.transfer.Manifest`
(see there for what it lists), encodes it canonically (:func:`encode_manifest`: strict
frame types, ``cbor2`` canonical form, so equal directories give equal bytes on every node)
and hashes those bytes: the model card's ``manifest_sha256``. A node fetching the model from a
peer checks the manifest it receives against that hash, then every byte it receives against
the manifest. The manifest describes content only (no paths, no times): two copies of a model
anywhere have the same one.

Hashing a large model takes minutes: the result is cached on disk under
``<home>/models/.manifests/`` per directory, each file's entry kept for as long as the file's
``(size, mtime_ns)`` is unchanged, so a restart (or a second card for the same directory)
hashes nothing again. Everything here is blocking file I/O: call it from a worker thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import secrets
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import BinaryIO

import attrs
import cbor2

from skulk.wire import Codec, WireError
from skulk.wire.transfer import FileEntry, Manifest, TensorEntry

#: The largest manifest accepted (a checkpoint with ~10^6 tensors stays well under it).
MAX_MANIFEST_BYTES = 256 * 1024 * 1024
#: The largest safetensors JSON header accepted (the format's own limit is 100 MB).
MAX_HEADER_BYTES = 100 * 1000 * 1000
#: Files a runner reads besides ``*.safetensors`` and ``*.json``.
_OTHER_FILES = re.compile(r"^(tokenizer\.model|merges\.txt|vocab\.txt|.*\.tiktoken|.*\.jinja)$")
#: A file name a manifest may carry: plain, no directories, nothing hidden.
_SAFE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}$")
_BLOCK = 8 * 1024 * 1024

MANIFEST_CODEC: Codec[Manifest] = Codec(Manifest, max_frame_size=MAX_MANIFEST_BYTES)


class ManifestInvalid(ValueError):
    """Bytes that are not a valid manifest, or a directory that cannot be described by one
    (a damaged safetensors header, a file changing while it is read)."""


@attrs.frozen
class FileStamp:
    """What tells a file changed without reading it."""

    name: str
    size: int
    mtime_ns: int


@attrs.frozen
class LocalManifest:
    """A directory's manifest with its canonical bytes, their sha256 (hex) and the stamps
    of the files it was computed from."""

    manifest: Manifest
    body: bytes
    sha256: str
    stamps: tuple[FileStamp, ...]

    def stamp(self, name: str) -> FileStamp | None:
        return next((s for s in self.stamps if s.name == name), None)


@attrs.frozen
class _CachedFile:
    stamp: FileStamp
    entry: FileEntry


@attrs.frozen
class _ManifestCache:
    directory: str
    files: tuple[_CachedFile, ...]


_CACHE_CODEC: Codec[_ManifestCache] = Codec(_ManifestCache, max_frame_size=MAX_MANIFEST_BYTES)


def encode_manifest(manifest: Manifest) -> bytes:
    """The canonical CBOR bytes of ``manifest`` (what ``manifest_sha256`` hashes)."""
    return cbor2.dumps(MANIFEST_CODEC.unstructure(manifest), canonical=True)


def manifest_sha256(body: bytes) -> str:
    return hashlib.sha256(body).hexdigest()


def decode_manifest(body: bytes) -> Manifest:
    """A manifest from untrusted bytes: strictly decoded and checked (:func:`check_manifest`).
    Raises :class:`ManifestInvalid`."""
    try:
        manifest = MANIFEST_CODEC.decode(body)
    except WireError as exc:
        raise ManifestInvalid(f"not a manifest: {exc}") from None
    check_manifest(manifest)
    return manifest


def check_manifest(manifest: Manifest) -> None:
    """Raise :class:`ManifestInvalid` unless file names are plain and unique (sorted), every
    range lies inside its file, a safetensors file's tensors follow its header in order without
    overlapping, and every hash is 32 bytes."""
    names = [f.name for f in manifest.files]
    if names != sorted(set(names)):
        raise ManifestInvalid("file names are not sorted and unique")
    for f in manifest.files:
        where = f"file {f.name!r}"
        if not _SAFE_NAME.match(f.name) or ".." in f.name:
            raise ManifestInvalid(f"{where}: not a plain file name")
        if f.size < 0 or len(f.sha256) != 32:
            raise ManifestInvalid(f"{where}: bad size or hash")
        if f.header_length is None:
            if f.header_sha256 is not None or f.tensors:
                raise ManifestInvalid(f"{where}: tensors without a header")
            continue
        if f.header_sha256 is None or len(f.header_sha256) != 32:
            raise ManifestInvalid(f"{where}: bad header hash")
        if not 8 <= f.header_length <= f.size:
            raise ManifestInvalid(f"{where}: header length outside the file")
        at = f.header_length
        for t in f.tensors:
            if not at <= t.start <= t.end <= f.size or len(t.sha256) != 32:
                raise ManifestInvalid(f"{where}: tensor {t.name!r} out of order or outside")
            at = t.end


def is_weight_file(name: str) -> bool:
    """Whether a file of a model directory belongs in its manifest."""
    if name.startswith(".") or not _SAFE_NAME.match(name):
        return False
    return name.endswith((".safetensors", ".json")) or bool(_OTHER_FILES.match(name))


def manifest_cache_path(directory: Path, home: Path) -> Path:
    key = hashlib.sha256(str(directory.resolve()).encode()).hexdigest()[:32]
    return home / "models" / ".manifests" / f"{key}.cbor"


def local_manifest(directory: Path, home: Path | None = None) -> LocalManifest:
    """The manifest of the model directory ``directory`` (slow the first time: reads and hashes
    every file; blocking). With ``home``, entries are cached under ``home`` and reused while a
    file's size and mtime are unchanged. Raises ``OSError`` for unreadable files and
    :class:`ManifestInvalid` for a damaged safetensors file."""
    directory = directory.resolve()
    names = sorted(p.name for p in directory.iterdir() if is_weight_file(p.name) and p.is_file())
    cache_path = manifest_cache_path(directory, home) if home is not None else None
    cached = _read_cache(cache_path, directory) if cache_path is not None else {}
    files: list[_CachedFile] = []
    for name in names:
        st = (directory / name).stat()
        stamp = FileStamp(name, st.st_size, st.st_mtime_ns)
        hit = cached.get(name)
        if hit is not None and hit.stamp == stamp:
            files.append(hit)
            continue
        files.append(_CachedFile(stamp, file_entry(directory / name)))
    if cache_path is not None and files != [cached.get(n) for n in names]:
        _write_cache(cache_path, _ManifestCache(str(directory), tuple(files)))
    manifest = Manifest(tuple(c.entry for c in files))
    check_manifest(manifest)
    body = encode_manifest(manifest)
    return LocalManifest(manifest, body, manifest_sha256(body), tuple(c.stamp for c in files))


def file_entry(path: Path) -> FileEntry:
    """One file's entry: size and hash, plus header and tensors for a safetensors file."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header: tuple[int, list[tuple[str, str, tuple[int, ...], int, int]]] | None = None
        if path.name.endswith(".safetensors"):
            header = read_safetensors_header(f, size, path.name)
        f.seek(0)
        pieces = [(0, header[0])] + [(s, e) for _, _, _, s, e in header[1]] if header else []
        file_hash, piece_hashes = _hash(f, size, pieces, path.name)
    if header is None:
        return FileEntry(path.name, size, file_hash, None, None, ())
    tensors = tuple(
        TensorEntry(name, dtype, shape, start, end, digest)
        for (name, dtype, shape, start, end), digest in zip(
            header[1], piece_hashes[1:], strict=True
        )
    )
    return FileEntry(path.name, size, file_hash, header[0], piece_hashes[0], tensors)


def read_safetensors_header(
    f: BinaryIO, size: int, name: str
) -> tuple[int, list[tuple[str, str, tuple[int, ...], int, int]]]:
    """``(header_length, tensors)`` of a safetensors file: tensors as ``(name, dtype, shape,
    start, end)`` with absolute byte offsets, sorted by ``start``."""
    prefix = f.read(8)
    if len(prefix) != 8:
        raise ManifestInvalid(f"{name}: too short for a safetensors file")
    (length,) = struct.unpack("<Q", prefix)
    if length > MAX_HEADER_BYTES or 8 + length > size:
        raise ManifestInvalid(f"{name}: safetensors header length {length} is impossible")
    raw = f.read(length)
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ManifestInvalid(f"{name}: safetensors header is not JSON: {exc}") from None
    if not isinstance(header, dict):
        raise ManifestInvalid(f"{name}: safetensors header is not an object")
    base = 8 + length
    tensors: list[tuple[str, str, tuple[int, ...], int, int]] = []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
            ok = (
                isinstance(dtype, str)
                and isinstance(shape, list)
                and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
                and isinstance(offsets, list)
                and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
                and 0 <= offsets[0] <= offsets[1]
                and base + offsets[1] <= size
            )
        except (TypeError, KeyError):
            ok = False
        if not ok:
            raise ManifestInvalid(f"{name}: bad safetensors entry for tensor {key!r}")
        tensors.append((key, dtype, tuple(shape), base + offsets[0], base + offsets[1]))
    tensors.sort(key=lambda t: (t[3], t[4], t[0]))
    at = base
    for t in tensors:
        if t[3] < at:
            raise ManifestInvalid(f"{name}: tensor {t[0]!r} overlaps another")
        at = t[4]
    return base, tensors


def _hash(
    f: io.BufferedReader, size: int, pieces: list[tuple[int, int]], name: str
) -> tuple[bytes, list[bytes]]:
    """Hash the whole file and each piece ``[start, end)`` (sorted, not overlapping) in one
    sequential read."""
    whole = hashlib.sha256()
    hashers = [hashlib.sha256() for _ in pieces]
    buf = bytearray(_BLOCK)
    view = memoryview(buf)
    pos = idx = 0
    while True:
        n = f.readinto(buf)
        if not n:
            break
        block = view[:n]
        whole.update(block)
        end = pos + n
        while idx < len(pieces):
            s, e = pieces[idx]
            lo, hi = max(s, pos), min(e, end)
            if lo < hi:
                hashers[idx].update(block[lo - pos : hi - pos])
            if e > end:
                break
            idx += 1
        pos = end
    if pos != size:
        raise ManifestInvalid(f"{name}: changed while it was being read")
    return whole.digest(), [h.digest() for h in hashers]


def _read_cache(path: Path, directory: Path) -> dict[str, _CachedFile]:
    try:
        cache = _CACHE_CODEC.decode(path.read_bytes())
    except (OSError, WireError):
        return {}  # none yet, or damaged: hash again
    if cache.directory != str(directory):
        return {}
    return {c.stamp.name: c for c in cache.files}


def _write_cache(path: Path, cache: _ManifestCache) -> None:
    """Atomically (tmp + fsync + rename); a cache that cannot be written is only slower."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, _CACHE_CODEC.encode(cache))


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` by a file holding ``data``: a temporary file, fsynced, renamed over
    it, then the directory fsynced, so a crash leaves the old file or the new one."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_directory(path.parent)


def fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def stamps_of(directory: Path, names: Iterable[str]) -> tuple[FileStamp, ...]:
    """The current stamps of ``names`` in ``directory`` (``OSError`` if one is gone)."""
    out = []
    for name in names:
        st = (directory / name).stat()
        out.append(FileStamp(name, st.st_size, st.st_mtime_ns))
    return tuple(out)
