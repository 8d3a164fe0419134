"""The simulator's replicated state machine: the real cluster State, behind the real client
sessions, with a hash chain over the commands that took effect.

:class:`SmState` is what every simulated node holds:

* ``machine``: the real thing -- :class:`skulk.consensus.Sessions` around
  :class:`skulk.cluster.ClusterMachine`, as a node runs it: the cluster :class:`State`
  (nodes, models, instances, runners) plus each client's last ``(seq, result, index)``;
* ``digest`` / ``count``: bookkeeping only the simulator keeps, a hash chain over every
  *effective* command (one the sessions let through to the cluster machine). Applying commands
  in another order, skipping one or applying one twice changes it even where the cluster State
  happens to come out equal (two rejected commands, two identical reports), so the invariant
  checker sees every ordering or duplication mistake.

Contract (the one every Skulk state machine follows): :func:`apply_entry` is *pure* -- the
result depends only on the previous state and the entry. ``salt`` is the deliberately broken
variant the ``impure-apply`` scenario uses (it mixes the node's id into the digest) to show
that the harness notices nodes disagreeing at the same applied index; the cluster mutants
(``place-on-down-node``, ``impure-cluster-apply``...) break the cluster machine or the
sessions instead (:mod:`skulk.sim._mutants`).

Client sessions give exactly-once semantics: every command carries ``(client_id, seq)``; a
client has one command outstanding at a time, so a command whose ``seq`` is at or below the
last applied ``seq`` of its client is a retry: :class:`~skulk.consensus.Sessions` answers it
with the cached result and does not apply it again (it still advances ``applied``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import attrs

from skulk.cluster import ClusterMachine, State
from skulk.cluster import state_hash as cluster_state_hash
from skulk.consensus import Entry, EntryKind, Sessions, SessionState, StateMachine
from skulk.wire import SnapshotCorrupt, pack, unpack_as

GENESIS_DIGEST = b"\x00" * 32

Machine = Sessions[State]
"""A node's state machine: sessions around a cluster machine."""

MakeMachine = Callable[[str], StateMachine[State]]
"""Builds the cluster machine of one node (by id): :class:`ClusterMachine` except in mutants."""


def real_machine(node_id: str = "") -> Machine:
    """What a Skulk node runs: ``Sessions(ClusterMachine())``."""
    return Sessions(ClusterMachine())


MACHINE = real_machine()


def _initial_machine() -> SessionState[State]:
    return SessionState(State())


@attrs.frozen
class SmState:
    """The state machine's image at ``applied``.

    ``machine`` is the sessions' state (the cluster :class:`State` inside); ``digest`` chains
    every *effective* command; ``count`` is the number of effective commands.
    """

    applied: int = 0
    digest: bytes = GENESIS_DIGEST
    count: int = 0
    machine: SessionState[State] = attrs.field(factory=_initial_machine)

    @property
    def cluster(self) -> State:
        """The replicated cluster State."""
        return self.machine.state

    def last_seq(self, client_id: str) -> int:
        """The last applied ``seq`` of ``client_id`` (0 if none)."""
        session = self.machine.sessions.get(client_id)
        return session.seq if session is not None else 0

    def sessions(self) -> tuple[tuple[str, int], ...]:
        """``(client_id, last_seq)`` sorted by client."""
        return tuple(sorted((c, s.seq) for c, s in self.machine.sessions.items()))


INITIAL = SmState()


def state_hash(state: SmState) -> bytes:
    """A digest of the whole state (the cluster State by its own
    :func:`skulk.cluster.state_hash`); equal states have equal hashes and (barring collisions)
    only equal states do."""
    h = hashlib.sha256()
    h.update(state.applied.to_bytes(8, "big"))
    h.update(state.digest)
    h.update(state.count.to_bytes(8, "big"))
    for cid, session in sorted(state.machine.sessions.items()):
        h.update(cid.encode())
        h.update(b"\x00")
        h.update(session.seq.to_bytes(8, "big"))
        h.update(session.index.to_bytes(8, "big"))
        h.update(hashlib.sha256(session.result).digest())
    h.update(bytes.fromhex(cluster_state_hash(state.cluster)))
    return h.digest()


def _command_digest(prev: bytes, entry: Entry, salt: bytes = b"") -> bytes:
    h = hashlib.sha256(prev)
    h.update(entry.client_id.encode())
    h.update(b"\x00")
    h.update(entry.seq.to_bytes(8, "big"))
    h.update(entry.data)
    h.update(salt)
    return h.digest()


def apply_entry(
    state: SmState, entry: Entry, *, machine: Machine = MACHINE, salt: bytes = b""
) -> tuple[SmState, bool, bytes]:
    """Apply ``entry`` (which must be at ``state.applied + 1``; the caller checks): the new
    state, whether the entry took effect, and its result bytes (what the submitter is told).

    Every entry goes through ``machine`` (no-ops and membership changes leave the cluster State
    as it is). A COMMAND *took effect* when the sessions applied it to the cluster machine --
    not a retry of an already applied ``(client_id, seq)``, which is answered from the cache.
    ``salt`` must be empty except in the impure variant."""
    inner, result = machine.apply(state.machine, entry)
    effective = entry.kind is EntryKind.COMMAND and (
        not entry.client_id
        or (
            (session := inner.sessions.get(entry.client_id)) is not None
            and session.index == entry.index
        )
    )
    if not effective:
        return attrs.evolve(state, applied=entry.index, machine=inner), False, result
    return (
        SmState(
            applied=entry.index,
            digest=_command_digest(state.digest, entry, salt),
            count=state.count + 1,
            machine=inner,
        ),
        True,
        result,
    )


def apply_entry_impure(
    state: SmState, entry: Entry, node_id: str, *, machine: Machine = MACHINE
) -> tuple[SmState, bool, bytes]:
    """The broken variant: mixes the applying node's id into the digest, as an ``apply`` that
    read the clock or the host name would. Nodes then disagree at equal applied indices."""
    return apply_entry(state, entry, machine=machine, salt=node_id.encode())


def encode_state(state: SmState, *, machine: Machine = MACHINE) -> bytes:
    """Snapshot bytes for ``state``: canonical CBOR (zstd) holding the sessions' own image
    (:meth:`Sessions.snapshot`, the cluster State's snapshot inside), so equal states give
    equal bytes."""
    return pack(
        {
            "applied": state.applied,
            "digest": state.digest,
            "count": state.count,
            "machine": machine.snapshot(state.machine),
        }
    )


class BadSnapshotData(ValueError):
    """Snapshot bytes that :func:`decode_state` cannot read."""


def decode_state(data: bytes, *, machine: Machine = MACHINE) -> SmState:
    """The inverse of :func:`encode_state`; raises :class:`BadSnapshotData`."""
    try:
        raw = unpack_as(data, dict)
        applied, digest, count, image = (raw[k] for k in ("applied", "digest", "count", "machine"))
        if not (
            isinstance(applied, int)
            and isinstance(count, int)
            and isinstance(digest, bytes)
            and isinstance(image, bytes)
        ):
            raise TypeError(f"bad field types in {sorted(raw)}")
        return SmState(applied, digest, count, machine.restore(image))
    except (SnapshotCorrupt, KeyError, TypeError) as exc:
        raise BadSnapshotData(f"cannot decode state machine snapshot: {exc}") from exc


def replay(
    entries: list[Entry], start: SmState = INITIAL, *, machine: Machine = MACHINE
) -> list[tuple[SmState, bool, bytes]]:
    """Apply ``entries`` in order from ``start``: the state, effect and result after each."""
    out: list[tuple[SmState, bool, bytes]] = []
    state = start
    for entry in entries:
        state, effective, result = apply_entry(state, entry, machine=machine)
        out.append((state, effective, result))
    return out
