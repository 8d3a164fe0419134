"""The store's index (names → model, per model: size, last use, names) and the pure
decisions made from it: name lookup, and which models to evict for room.

The index is one small CBOR file (``<root>/index.cbor``), replaced atomically (tmp + fsync +
rename + directory fsync) on every change, so a crash leaves the old index or the new one.
Nothing here touches the disk except :func:`read_index` and :func:`write_index`.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from pathlib import Path

import attrs

from skulk.models import write_atomically
from skulk.wire import Codec, WireError

INDEX_VERSION = 1
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
MAX_NAME_LENGTH = 256


@attrs.frozen
class IndexEntry:
    """One stored model: its manifest hash, the bytes of its distinct blobs, its last use
    (wall time, seconds) and the names that lead to it."""

    sha256: str
    size: int
    last_used: float
    names: tuple[str, ...]


@attrs.frozen
class Index:
    version: int
    models: tuple[IndexEntry, ...]


_INDEX_CODEC: Codec[Index] = Codec(Index, max_frame_size=64 * 1024 * 1024)
EMPTY = Index(INDEX_VERSION, ())


def is_sha256_hex(text: str) -> bool:
    return bool(_HEX64.match(text))


def check_name(name: str) -> str:
    """``name`` if it may name a model (``org/repo@rev``, ``skulk-demo``, a directory's
    basename): 1..256 printable characters, no surrounding space, not a bare sha256 (which
    would be read as a manifest hash). ``ValueError`` naming the problem otherwise."""
    if not 0 < len(name) <= MAX_NAME_LENGTH:
        raise ValueError(f"a model name must be 1..{MAX_NAME_LENGTH} characters: {name!r}")
    if not name.isprintable() or name != name.strip():
        raise ValueError(f"a model name must be printable, without surrounding space: {name!r}")
    if is_sha256_hex(name):
        raise ValueError(f"a model name must not be a bare sha256 (a model's identity): {name!r}")
    return name


def read_index(path: Path) -> Index | None:
    """The index at ``path``; an empty one if there is none; ``None`` if it is damaged (the
    caller rebuilds it from the model directories)."""
    try:
        body = path.read_bytes()
    except FileNotFoundError:
        return EMPTY
    try:
        index = _INDEX_CODEC.decode(body)
    except WireError:
        return None
    if index.version != INDEX_VERSION:
        return None
    return index


def write_index(path: Path, index: Index) -> None:
    write_atomically(path, _INDEX_CODEC.encode(index))


def find(index: Index, name_or_hash: str) -> IndexEntry | None:
    """The model whose manifest hash or one of whose names is ``name_or_hash``."""
    for entry in index.models:
        if entry.sha256 == name_or_hash or name_or_hash in entry.names:
            return entry
    return None


def with_entry(index: Index, entry: IndexEntry) -> Index:
    """``index`` with ``entry`` added or replacing the one of the same hash; its names are
    taken from any other model that had them (a name leads to one model: the latest)."""
    taken = set(entry.names)
    models = [
        attrs.evolve(e, names=tuple(n for n in e.names if n not in taken))
        for e in index.models
        if e.sha256 != entry.sha256
    ]
    models.append(entry)
    models.sort(key=lambda e: e.sha256)
    return Index(INDEX_VERSION, tuple(models))


def without(index: Index, sha256: str) -> Index:
    return Index(INDEX_VERSION, tuple(e for e in index.models if e.sha256 != sha256))


@attrs.frozen
class EvictionPlan:
    """Evict ``victims`` (manifest hashes, least recently used first) to free ``freed``
    bytes; ``reclaimable`` is what evicting every candidate would free."""

    victims: tuple[str, ...]
    freed: int
    reclaimable: int
    enough: bool


def plan_eviction(
    index: Index,
    blobs_of: Mapping[str, Mapping[str, int]],
    need: int,
    in_use: Collection[str],
    keep_blobs: Collection[str] = (),
) -> EvictionPlan:
    """Which models to evict, least recently used first, to free at least ``need`` bytes.
    A model in ``in_use`` is never a candidate; a blob frees its bytes only once no remaining
    model (nor ``keep_blobs``) uses it. ``enough`` is false when even evicting every candidate
    frees less than ``need``; then ``victims`` is empty."""
    if need <= 0:
        return EvictionPlan((), 0, 0, True)
    refs: dict[str, int] = {}
    for entry in index.models:
        for blob in blobs_of.get(entry.sha256, {}):
            refs[blob] = refs.get(blob, 0) + 1
    candidates = sorted(
        (e for e in index.models if e.sha256 not in in_use),
        key=lambda e: (e.last_used, e.sha256),
    )
    freed = 0
    cumulative: list[tuple[str, int]] = []  # (victim, bytes freed once it and those before go)
    for entry in candidates:
        for blob, size in blobs_of.get(entry.sha256, {}).items():
            refs[blob] -= 1
            if refs[blob] == 0 and blob not in keep_blobs:
                freed += size
        cumulative.append((entry.sha256, freed))
    for count, (_, freed_so_far) in enumerate(cumulative, start=1):
        if freed_so_far >= need:
            return EvictionPlan(tuple(v for v, _ in cumulative[:count]), freed_so_far, freed, True)
    return EvictionPlan((), 0, freed, False)
