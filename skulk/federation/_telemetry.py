"""The telemetry plane's pure core: a last-writer-wins view of node readings, and its keeper.

Two layers, kept apart so the merge laws stay provable:

* :class:`TelemetryView` is the lattice: an immutable map ``node_id -> TelemetryEntry``.
  :meth:`TelemetryView.merge` keeps, per node, the entry with the greatest version key
  ``(epoch, seq, fingerprint, canonical readings)``; that is a total order on entries of one node,
  so merge is a join: commutative, associative and idempotent, whatever order and however often
  views are exchanged (``tests/property/test_telemetry_merge.py``).
* :class:`TelemetryStore` is what one node's telemetry actor owns: the view plus local
  bookkeeping the lattice knows nothing about: when each entry was last *refreshed* (the local
  monotonic time at which a newer version arrived), the versions it dropped on expiry, a cap on
  nodes, and this node's own ``(epoch, seq)`` counter. No clock is read here: every method that
  needs the time takes ``now``.

Expiry and resurrection. :meth:`TelemetryStore.expire` drops every other node's entry not
refreshed for ``ttl`` seconds, so a node that stops publishing ages out (a live node publishes a
new ``seq`` at least every few seconds, which refreshes it everywhere). A dropped entry's version
is *remembered* ("forgotten" record, a tombstone of a few dozen bytes) for ``forget_after``
seconds, at most ``max_forgotten`` of them (oldest dropped first beyond that): while it is
remembered, gossip bringing that version or an older one is refused as stale, so a peer that has
not expired the node yet cannot resurrect it; a newer version (the node came back, or restarted
with a new epoch) is accepted and clears the record. Once forgotten for good, a stale copy could
come back for at most one more ``ttl``; with ``forget_after`` several times ``ttl`` every peer
has expired it by then (each peer also drops it ``ttl`` after it was last refreshed there).

Caps. A store holds at most ``max_nodes`` entries, its own included (one slot is always kept for
it). An entry for an unknown node arriving while full is refused
(:attr:`TelemetryRefusalReason.FULL`, counted in :meth:`TelemetryStore.statistics`) until expiry
makes room; known nodes keep updating. Entries are never evicted to make room, so a flood of
bogus ids cannot push out live nodes.
"""

from __future__ import annotations

import enum
import hashlib
import math
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import attrs
import cbor2

from skulk.wire import TAG_KEY, Codec, EncodeError
from skulk.wire.telemetry import (
    NodeReadings,
    TelemetryDigest,
    TelemetryEntry,
    TelemetryPush,
    TelemetryVersion,
)

FINGERPRINT_SIZE = 16
"""Bytes of BLAKE2b digest in a version's fingerprint."""

EPOCH_FILE_NAME = "telemetry-epoch"
"""The file in the data dir holding the last epoch this node used (decimal, ASCII)."""

_READINGS_CODEC: Codec[NodeReadings] = Codec(NodeReadings)

# (epoch, seq, fingerprint, canonical CBOR of the readings): the total order of one node's
# entries. The canonical bytes only matter if two fingerprints collide. "Canonical" is cbor2's
# canonical mode: RFC 8949 §4.2.3 length-first map key order, shortest ints and floats that keep
# the value, definite lengths (specs/wire.cddl states it for other implementations).
_Key = tuple[int, int, bytes, bytes]
# What a digest can say about a node: (epoch, seq, fingerprint).
_ShortKey = tuple[int, int, bytes]


@attrs.frozen
class _Slot:
    key: _Key
    entry: TelemetryEntry

    @property
    def version(self) -> TelemetryVersion:
        return TelemetryVersion(self.entry.node_id, self.key[0], self.key[1], self.key[2])


def _slot(entry: TelemetryEntry) -> _Slot:
    """``entry`` with its version key; raises :class:`EncodeError` if its readings cannot be
    encoded (a NaN load, a string with lone surrogates), which no decoded frame can hold."""
    plain = dict(_READINGS_CODEC.unstructure(entry.readings))
    plain.pop(TAG_KEY, None)  # hash the map as it sits in a TelemetryEntry: untagged
    try:
        canonical = cbor2.dumps(plain, canonical=True)
    except Exception as exc:
        raise EncodeError("$", f"not encodable as CBOR ({type(exc).__name__})") from None
    fingerprint = hashlib.blake2b(canonical, digest_size=FINGERPRINT_SIZE).digest()
    return _Slot((entry.epoch, entry.seq, fingerprint, canonical), entry)


def telemetry_version(entry: TelemetryEntry) -> TelemetryVersion:
    """The version a digest gives for ``entry`` (its fingerprint computed here).

    Raises :class:`~skulk.wire.EncodeError` if the readings cannot be encoded."""
    return _slot(entry).version


def _join(slots: dict[str, _Slot], slot: _Slot) -> bool:
    """Put ``slot`` into ``slots`` if it beats what is there; whether it did."""
    node_id = slot.entry.node_id
    current = slots.get(node_id)
    if current is not None and current.key >= slot.key:
        return False
    slots[node_id] = slot
    return True


class TelemetryView(Mapping[str, TelemetryEntry]):
    """An immutable last-writer-wins map ``node_id -> TelemetryEntry``, ordered by node id.

    Built from any entries (``TelemetryView(entries)``; several entries for one node join to the
    greatest). Two views are equal when they hold the same entries byte for byte (a ``0.0`` and
    a ``-0.0`` reading differ). Cheap to share: never mutated after construction. Raises
    :class:`~skulk.wire.EncodeError` for readings that cannot be encoded (a NaN load).
    """

    __slots__ = ("_hash", "_slots")

    def __init__(self, entries: Iterable[TelemetryEntry] = ()) -> None:
        slots: dict[str, _Slot] = {}
        for entry in entries:
            _join(slots, _slot(entry))
        self._slots = {k: slots[k] for k in sorted(slots)}
        self._hash: int | None = None

    @classmethod
    def _from_slots(cls, slots: Mapping[str, _Slot]) -> TelemetryView:
        view = cls.__new__(cls)
        view._slots = {k: slots[k] for k in sorted(slots)}
        view._hash = None
        return view

    def merge(self, other: TelemetryView) -> TelemetryView:
        """The join of two views: per node, the entry with the greater version.

        Commutative, associative and idempotent. Versions compare as ``(epoch, seq)``, then,
        for two different readings under one ``(epoch, seq)``, by fingerprint (and by canonical
        encoding should fingerprints collide), so every node picks the same winner."""
        if other is self or not other._slots:
            return self
        if not self._slots:
            return other
        slots = dict(self._slots)
        changed = False
        for slot in other._slots.values():
            changed |= _join(slots, slot)
        if not changed:
            return self
        if len(slots) == len(other._slots) and all(
            slots[k] is other._slots[k] for k in other._slots
        ):
            return other
        return TelemetryView._from_slots(slots)

    def version(self, node_id: str) -> TelemetryVersion | None:
        """The version held for ``node_id``, or ``None``."""
        slot = self._slots.get(node_id)
        return None if slot is None else slot.version

    def versions(self) -> tuple[TelemetryVersion, ...]:
        """Every entry's version, ordered by node id."""
        return tuple(slot.version for slot in self._slots.values())

    def entries(self) -> tuple[TelemetryEntry, ...]:
        """Every entry, ordered by node id."""
        return tuple(slot.entry for slot in self._slots.values())

    def __getitem__(self, node_id: str) -> TelemetryEntry:
        return self._slots[node_id].entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._slots)

    def __len__(self) -> int:
        return len(self._slots)

    def __contains__(self, node_id: object) -> bool:
        return node_id in self._slots

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TelemetryView):
            return NotImplemented
        if len(self._slots) != len(other._slots):
            return False
        return all(
            (theirs := other._slots.get(k)) is not None and theirs.key == mine.key
            for k, mine in self._slots.items()
        )

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(frozenset((k, s.key) for k, s in self._slots.items()))
        return self._hash

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}@{s.key[0]}.{s.key[1]}" for k, s in self._slots.items())
        return f"TelemetryView({inner})"


# ---- the store -----------------------------------------------------------------------------------


def _positive_seconds(_: object, attribute: attrs.Attribute[float], value: float) -> None:
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{attribute.name} must be > 0 seconds (inf allowed), not {value!r}")


def _at_least_one(_: object, attribute: attrs.Attribute[int], value: int) -> None:
    if value < 1:
        raise ValueError(f"{attribute.name} must be >= 1, not {value!r}")


@attrs.frozen
class TelemetryConfig:
    """Limits of a :class:`TelemetryStore` (seconds are local monotonic time).

    ``ttl``: another node's entry is dropped when not refreshed for longer than this (``inf``:
    never; nodes should publish several times per ``ttl``). ``forget_after``: how long a dropped
    version is remembered to refuse stale copies of it (at least ``ttl``). ``max_nodes``: entries
    held, this node's own included. ``max_forgotten``: dropped versions remembered at once.
    """

    ttl: float = attrs.field(default=30.0, validator=_positive_seconds)
    forget_after: float = attrs.field(default=120.0, validator=_positive_seconds)
    max_nodes: int = attrs.field(default=1024, validator=_at_least_one)
    max_forgotten: int = attrs.field(default=1024, validator=_at_least_one)

    def __attrs_post_init__(self) -> None:
        if self.forget_after < self.ttl:
            raise ValueError(f"forget_after ({self.forget_after}) must be >= ttl ({self.ttl})")


class TelemetryRefusalReason(enum.Enum):
    """Why :meth:`TelemetryStore.apply` refused an entry (stale entries are not refusals)."""

    FULL = "full"
    """The entry is for an unknown node and the store already holds ``max_nodes`` entries."""
    NODE_ID_MISMATCH = "node_id_mismatch"
    """``entry.node_id`` differs from ``entry.readings.node_id``."""
    NEGATIVE_VERSION = "negative_version"
    """``epoch`` or ``seq`` is below zero."""
    NOT_ENCODABLE = "not_encodable"
    """The readings cannot be encoded (never true of a decoded frame)."""


@attrs.frozen
class TelemetryRefusal:
    node_id: str
    reason: TelemetryRefusalReason


@attrs.frozen
class TelemetryApplyOutcome:
    """What :meth:`TelemetryStore.apply` did: ``accepted`` entries (now in the view, in the
    order given; worth forwarding), how many were ``stale`` (not newer than what the store
    holds or remembers dropping), and the ``refused`` ones with their reasons."""

    accepted: tuple[TelemetryEntry, ...]
    stale: int
    refused: tuple[TelemetryRefusal, ...]


@attrs.frozen
class TelemetryStatistics:
    """Counters since the store was made; ``nodes`` and ``forgotten`` are current sizes."""

    nodes: int
    forgotten: int
    published: int
    accepted: int
    stale: int
    refused: int
    expired: int


@attrs.frozen
class _Dropped:
    key: _ShortKey
    at: float


class TelemetryStore:
    """One node's telemetry state: the merged :class:`TelemetryView` and its local bookkeeping.

    Owned by a single actor (not thread-safe, no locking); pure: ``now`` is passed in, in the
    caller's monotonic seconds. ``node_id`` is this node; ``epoch`` comes from
    :func:`next_epoch` at start-up, so this life's versions beat every version of earlier ones.

    The gossip protocol (see :mod:`skulk.wire.telemetry`): send :meth:`digest` to a peer; answer
    a peer's digest with :meth:`delta_for`; feed every received push to :meth:`apply`. Call
    :meth:`own` with each fresh sample (at least a few times per ``ttl``) and :meth:`expire`
    periodically (:meth:`next_expiry` says when it next has work).
    """

    def __init__(self, node_id: str, epoch: int, config: TelemetryConfig | None = None) -> None:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, not {epoch}")
        self._node_id = node_id
        self._config = config if config is not None else TelemetryConfig()
        self._epoch = epoch
        self._seq = 0
        self._slots: dict[str, _Slot] = {}
        self._refreshed: dict[str, float] = {}
        self._dropped: dict[str, _Dropped] = {}
        self._view: TelemetryView | None = TelemetryView()
        self._published = self._accepted = self._stale = self._refused = self._expired = 0

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def config(self) -> TelemetryConfig:
        return self._config

    @property
    def version(self) -> tuple[int, int]:
        """``(epoch, seq)`` of this node's latest published entry (``seq`` 0: none yet)."""
        return self._epoch, self._seq

    @property
    def view(self) -> TelemetryView:
        """The merged view now (an immutable snapshot; later changes make a new one)."""
        if self._view is None:
            self._view = TelemetryView._from_slots(self._slots)
        return self._view

    def refreshed_at(self, node_id: str) -> float | None:
        """When ``node_id``'s entry was last refreshed here (``now`` of that call), or ``None``."""
        return self._refreshed.get(node_id)

    # ---- publishing and merging ----------------------------------------------------------------

    def own(self, readings: NodeReadings, now: float) -> TelemetryEntry:
        """Publish this node's ``readings``: the entry (next ``seq``) now in the view, to push.

        The version is always above every version the store holds for this node id, so it wins
        even over entries another process published under this id (a copied data dir)."""
        if readings.node_id != self._node_id:
            raise ValueError(f"readings of {readings.node_id!r} published as {self._node_id!r}")
        epoch, seq = self._epoch, self._seq + 1
        current = self._slots.get(self._node_id)
        if current is not None and current.key[:2] >= (epoch, seq):
            epoch, seq = current.key[0], current.key[1] + 1
        entry = TelemetryEntry(self._node_id, epoch, seq, readings)
        slot = _slot(entry)
        self._epoch, self._seq = epoch, seq
        self._slots[self._node_id] = slot
        self._refreshed[self._node_id] = now
        self._view = None
        self._published += 1
        return entry

    def apply(self, entries: Iterable[TelemetryEntry], now: float) -> TelemetryApplyOutcome:
        """Merge received ``entries``: each one newer than what the store holds (and than any
        version it remembers dropping) replaces it and refreshes that node at ``now``."""
        accepted: list[TelemetryEntry] = []
        refused: list[TelemetryRefusal] = []
        stale = 0
        for entry in entries:
            slot = _checked_slot(entry)
            if isinstance(slot, TelemetryRefusalReason):
                refused.append(TelemetryRefusal(entry.node_id, slot))
                continue
            node_id = entry.node_id
            current = self._slots.get(node_id)
            dropped = self._dropped.get(node_id)
            if (current is not None and current.key >= slot.key) or (
                dropped is not None and dropped.key >= slot.key[:3]
            ):
                stale += 1
                continue
            if current is None and node_id != self._node_id and self._others() >= self._room():
                refused.append(TelemetryRefusal(node_id, TelemetryRefusalReason.FULL))
                continue
            self._slots[node_id] = slot
            self._refreshed[node_id] = now
            self._dropped.pop(node_id, None)
            accepted.append(entry)
        if accepted:
            self._view = None
        self._accepted += len(accepted)
        self._stale += stale
        self._refused += len(refused)
        return TelemetryApplyOutcome(tuple(accepted), stale, tuple(refused))

    def _others(self) -> int:
        return len(self._slots) - (self._node_id in self._slots)

    def _room(self) -> int:
        return self._config.max_nodes - 1  # one slot is always kept for this node

    # ---- anti-entropy --------------------------------------------------------------------------

    def digest(self) -> TelemetryDigest:
        """What this store holds and remembers dropping, to send to a peer."""
        versions = tuple(slot.version for _, slot in sorted(self._slots.items()))
        forgotten = tuple(
            TelemetryVersion(node_id, *d.key) for node_id, d in sorted(self._dropped.items())
        )
        return TelemetryDigest(versions, forgotten)

    def delta_for(self, digest: TelemetryDigest) -> TelemetryPush:
        """The entries a peer whose digest is ``digest`` lacks: every entry newer than the
        version it names for that node (held or forgotten), or for a node it does not name.
        Ordered by node id."""
        known = _known(digest)
        return TelemetryPush(
            tuple(
                slot.entry
                for node_id, slot in sorted(self._slots.items())
                if (theirs := known.get(node_id)) is None or slot.key[:3] > theirs
            )
        )

    def needs(self, digest: TelemetryDigest) -> bool:
        """Whether ``digest`` names an entry newer than this store's (one :meth:`apply` would
        take): worth sending our own digest back at once."""
        full = self._others() >= self._room()
        for version in digest.versions:
            key = (version.epoch, version.seq, version.fingerprint)
            current = self._slots.get(version.node_id)
            dropped = self._dropped.get(version.node_id)
            if current is None and full and version.node_id != self._node_id:
                continue
            if (current is None or current.key[:3] < key) and (
                dropped is None or dropped.key < key
            ):
                return True
        return False

    # ---- expiry --------------------------------------------------------------------------------

    def expire(self, now: float) -> tuple[str, ...]:
        """Drop other nodes' entries not refreshed for more than ``ttl`` (remembering their
        versions), and forget dropped versions older than ``forget_after``. Returns the ids of
        the nodes dropped, sorted."""
        ttl = self._config.ttl
        gone = sorted(
            node_id
            for node_id, at in self._refreshed.items()
            if node_id != self._node_id and now - at > ttl
        )
        for node_id in gone:
            slot = self._slots.pop(node_id)
            del self._refreshed[node_id]
            self._dropped[node_id] = _Dropped(slot.key[:3], now)
        if gone:
            self._view = None
            self._expired += len(gone)
        forget_after = self._config.forget_after
        for node_id in [n for n, d in self._dropped.items() if now - d.at > forget_after]:
            del self._dropped[node_id]
        excess = len(self._dropped) - self._config.max_forgotten
        if excess > 0:
            oldest = sorted(self._dropped.items(), key=lambda item: (item[1].at, item[0]))
            for node_id, _ in oldest[:excess]:
                del self._dropped[node_id]
        return tuple(gone)

    def next_expiry(self) -> float | None:
        """The earliest ``now`` at which :meth:`expire` would drop an entry or forget a dropped
        version (``None`` if it never will, as things stand)."""
        times = [
            at + self._config.ttl for n, at in self._refreshed.items() if n != self._node_id
        ] + [d.at + self._config.forget_after for d in self._dropped.values()]
        finite = [t for t in times if math.isfinite(t)]
        return min(finite) if finite else None

    def statistics(self) -> TelemetryStatistics:
        return TelemetryStatistics(
            nodes=len(self._slots),
            forgotten=len(self._dropped),
            published=self._published,
            accepted=self._accepted,
            stale=self._stale,
            refused=self._refused,
            expired=self._expired,
        )


def _checked_slot(entry: TelemetryEntry) -> _Slot | TelemetryRefusalReason:
    if entry.node_id != entry.readings.node_id:
        return TelemetryRefusalReason.NODE_ID_MISMATCH
    if entry.epoch < 0 or entry.seq < 0:
        return TelemetryRefusalReason.NEGATIVE_VERSION
    try:
        return _slot(entry)
    except EncodeError:
        return TelemetryRefusalReason.NOT_ENCODABLE


def _known(digest: TelemetryDigest) -> dict[str, _ShortKey]:
    known: dict[str, _ShortKey] = {}
    for version in (*digest.versions, *digest.forgotten):
        key = (version.epoch, version.seq, version.fingerprint)
        if (current := known.get(version.node_id)) is None or current < key:
            known[version.node_id] = key
    return known


# ---- epochs --------------------------------------------------------------------------------------


class EpochFileCorrupt(Exception):
    """The epoch file in the data dir does not hold a decimal epoch; Skulk does not guess one
    (a guess lower than the last epoch would make this node's fresh readings lose)."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"{path}: {detail}; delete it only if no other node state is kept there")
        self.path = path
        self.detail = detail


_MAX_EPOCH = 2**64 - 1


def next_epoch(home: Path) -> int:
    """Bump and return this node's telemetry epoch, kept in ``home / "telemetry-epoch"``.

    Call once per start-up, before publishing: the first call returns 1. The new value is on
    disk (temp file, fsync, rename, directory fsync) before it is returned, so a crash never
    reuses an epoch. Raises :class:`EpochFileCorrupt` for a file that is not a decimal number,
    and ``OSError`` when the data dir cannot be written.
    """
    home.mkdir(parents=True, exist_ok=True)
    path = home / EPOCH_FILE_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        previous = 0
    else:
        text = raw.decode("ascii", errors="replace").strip()
        if not text.isdigit() or not text.isascii() or len(text) > 20:
            raise EpochFileCorrupt(path, f"expected a decimal epoch, found {raw[:40]!r}")
        previous = int(text)
        if previous >= _MAX_EPOCH:
            raise EpochFileCorrupt(path, f"epoch {previous} is at the limit")
    epoch = previous + 1
    fd, tmp = tempfile.mkstemp(prefix=f".{EPOCH_FILE_NAME}.", dir=home)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(f"{epoch}\n".encode("ascii"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(home, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return epoch
