"""The telemetry plane's keeper: one node's merged view and its local bookkeeping (pure).

:class:`TelemetryStore` is what one node's telemetry actor owns: the view
(:class:`~skulk.telemetry.TelemetryView`, the lattice) plus local bookkeeping the lattice knows
nothing about: when each entry was last *refreshed* (the local monotonic time at which a newer
version arrived), the versions it dropped on expiry, a cap on nodes, and this node's own
``(epoch, seq)`` counter. No clock is read here: every method that needs the time takes ``now``.

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
import math
from collections.abc import Iterable

import attrs

from skulk.wire import EncodeError
from skulk.wire.telemetry import (
    NodeReadings,
    TelemetryDigest,
    TelemetryEntry,
    TelemetryPush,
    TelemetryVersion,
)

from ._view import ShortKey, Slot, TelemetryView, make_slot


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
    key: ShortKey
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
        self._slots: dict[str, Slot] = {}
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
        slot = make_slot(entry)
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


def _checked_slot(entry: TelemetryEntry) -> Slot | TelemetryRefusalReason:
    if entry.node_id != entry.readings.node_id:
        return TelemetryRefusalReason.NODE_ID_MISMATCH
    if entry.epoch < 0 or entry.seq < 0:
        return TelemetryRefusalReason.NEGATIVE_VERSION
    try:
        return make_slot(entry)
    except EncodeError:
        return TelemetryRefusalReason.NOT_ENCODABLE


def _known(digest: TelemetryDigest) -> dict[str, ShortKey]:
    known: dict[str, ShortKey] = {}
    for version in (*digest.versions, *digest.forgotten):
        key = (version.epoch, version.seq, version.fingerprint)
        if (current := known.get(version.node_id)) is None or current < key:
            known[version.node_id] = key
    return known
