"""State-machine images: plain values as canonical CBOR compressed with zstd.

:func:`pack` turns a plain CBOR value (ints, strs, bytes, lists, dicts, ...) into bytes that
are equal for equal values; :func:`unpack` turns them back, with a size cap on the way in, and
raises :class:`SnapshotCorrupt` for anything :func:`pack` did not write. The Raft state machines
(:class:`skulk.consensus.Sessions`, :class:`skulk.cluster.ClusterMachine`, the simulator's) keep
their snapshots in this format. Unlike frames, images are not strict CBOR: they are read back
only from this node's own storage or from a leader's snapshot.
"""

from __future__ import annotations

import io
from typing import TypeVar

import cbor2
import zstandard

T = TypeVar("T")

MAX_SNAPSHOT_BYTES = 256 * 1024 * 1024
"""Default cap on an unpacked state-machine image."""


class SnapshotCorrupt(Exception):
    """A state-machine image is not what :func:`pack` wrote (bad zstd, bad CBOR, over the size
    limit, wrong shape)."""


def pack(value: object) -> bytes:
    """``value`` (plain CBOR values: ints, strs, bytes, lists, dicts, ...) as canonical CBOR
    compressed with zstd: equal values give equal bytes."""
    return zstandard.ZstdCompressor(level=3).compress(cbor2.dumps(value, canonical=True))


def unpack(data: bytes, *, max_size: int = MAX_SNAPSHOT_BYTES) -> object:
    """The value :func:`pack` made; :class:`SnapshotCorrupt` for anything else or for an image
    over ``max_size`` bytes once decompressed (checked while reading: a frame header's size
    claim is not trusted)."""
    try:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)) as reader:
            raw = reader.read(max_size + 1)
    except zstandard.ZstdError as exc:
        raise SnapshotCorrupt(f"not a zstd frame: {exc}") from None
    if len(raw) > max_size:
        raise SnapshotCorrupt(f"image over {max_size} bytes")
    try:
        stream = io.BytesIO(raw)
        value: object = cbor2.CBORDecoder(stream).decode()
    except (cbor2.CBORDecodeError, ValueError, TypeError, RecursionError) as exc:
        raise SnapshotCorrupt(f"not CBOR: {exc}") from None
    if stream.tell() != len(raw):
        raise SnapshotCorrupt("trailing bytes after the image")
    return value


def unpack_as(data: bytes, kind: type[T], *, max_size: int = MAX_SNAPSHOT_BYTES) -> T:
    """:func:`unpack`, checking that the value is a ``kind`` (``int``, ``dict``, ...)."""
    value = unpack(data, max_size=max_size)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SnapshotCorrupt(f"expected {kind.__name__}, got {type(value).__name__}")
    return value
