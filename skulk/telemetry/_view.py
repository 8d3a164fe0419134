"""The telemetry plane's lattice: an immutable last-writer-wins view of node readings.

:class:`TelemetryView` is an immutable map ``node_id -> TelemetryEntry``.
:meth:`TelemetryView.merge` keeps, per node, the entry with the greatest version key
``(epoch, seq, fingerprint, canonical readings)``; that is a total order on entries of one node,
so merge is a join: commutative, associative and idempotent, whatever order and however often
views are exchanged (``tests/property/test_telemetry_merge.py``). It is kept apart from the
store's local bookkeeping (:mod:`skulk.telemetry._store`) so the merge laws stay provable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping

import attrs
import cbor2

from skulk.wire import TAG_KEY, Codec, EncodeError
from skulk.wire.telemetry import NodeReadings, TelemetryEntry, TelemetryVersion

FINGERPRINT_SIZE = 16
"""Bytes of BLAKE2b digest in a version's fingerprint."""

_READINGS_CODEC: Codec[NodeReadings] = Codec(NodeReadings)

# (epoch, seq, fingerprint, canonical CBOR of the readings): the total order of one node's
# entries. The canonical bytes only matter if two fingerprints collide. "Canonical" is cbor2's
# canonical mode: RFC 8949 §4.2.3 length-first map key order, shortest ints and floats that keep
# the value, definite lengths (specs/wire.cddl states it for other implementations).
Key = tuple[int, int, bytes, bytes]
# What a digest can say about a node: (epoch, seq, fingerprint).
ShortKey = tuple[int, int, bytes]


@attrs.frozen
class Slot:
    key: Key
    entry: TelemetryEntry

    @property
    def version(self) -> TelemetryVersion:
        return TelemetryVersion(self.entry.node_id, self.key[0], self.key[1], self.key[2])


def make_slot(entry: TelemetryEntry) -> Slot:
    """``entry`` with its version key; raises :class:`EncodeError` if its readings cannot be
    encoded (a NaN load, a string with lone surrogates), which no decoded frame can hold."""
    plain = dict(_READINGS_CODEC.unstructure(entry.readings))
    plain.pop(TAG_KEY, None)  # hash the map as it sits in a TelemetryEntry: untagged
    try:
        canonical = cbor2.dumps(plain, canonical=True)
    except Exception as exc:
        raise EncodeError("$", f"not encodable as CBOR ({type(exc).__name__})") from None
    fingerprint = hashlib.blake2b(canonical, digest_size=FINGERPRINT_SIZE).digest()
    return Slot((entry.epoch, entry.seq, fingerprint, canonical), entry)


def telemetry_version(entry: TelemetryEntry) -> TelemetryVersion:
    """The version a digest gives for ``entry`` (its fingerprint computed here).

    Raises :class:`~skulk.wire.EncodeError` if the readings cannot be encoded."""
    return make_slot(entry).version


def _join(slots: dict[str, Slot], slot: Slot) -> bool:
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
        slots: dict[str, Slot] = {}
        for entry in entries:
            _join(slots, make_slot(entry))
        self._slots = {k: slots[k] for k in sorted(slots)}
        self._hash: int | None = None

    @classmethod
    def _from_slots(cls, slots: Mapping[str, Slot]) -> TelemetryView:
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
