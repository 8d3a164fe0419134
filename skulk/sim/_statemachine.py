"""The simulator's replicated state machine: a hash chain over effective client commands.

The state is deliberately tiny -- a digest, a per-client session table and two counters -- so
that invariants can compare it cheaply, yet rich enough to see every ordering or duplication
mistake: applying commands in a different order, skipping one or applying one twice changes
:func:`state_hash`.

Contract (the one every Skulk state machine follows): :func:`apply_entry` is *pure* -- the
result depends only on the previous state and the entry. :func:`apply_entry_impure` is the
deliberately broken variant the ``impure-apply`` scenario uses to show that the harness notices
nodes disagreeing at the same applied index.

Client sessions give exactly-once semantics: every command carries ``(client_id, seq)``; a
client has one command outstanding at a time, so a command whose ``seq`` is at or below the
last applied ``seq`` of its client is a retry and is skipped (it still advances ``applied``).
"""

from __future__ import annotations

import hashlib
import json

import attrs

from skulk.consensus._types import Entry, EntryKind

GENESIS_DIGEST = b"\x00" * 32


@attrs.frozen
class SmState:
    """The state machine's image at ``applied``.

    ``digest`` chains every *effective* command; ``sessions`` is ``(client_id, last_seq)``
    sorted by client; ``count`` is the number of effective commands.
    """

    applied: int = 0
    digest: bytes = GENESIS_DIGEST
    sessions: tuple[tuple[str, int], ...] = ()
    count: int = 0

    def last_seq(self, client_id: str) -> int:
        """The last applied ``seq`` of ``client_id`` (0 if none)."""
        for cid, seq in self.sessions:
            if cid == client_id:
                return seq
        return 0


INITIAL = SmState()


def state_hash(state: SmState) -> bytes:
    """A digest of the whole state; equal states have equal hashes and (barring collisions)
    only equal states do."""
    h = hashlib.sha256()
    h.update(state.applied.to_bytes(8, "big"))
    h.update(state.digest)
    h.update(state.count.to_bytes(8, "big"))
    for cid, seq in state.sessions:
        h.update(cid.encode())
        h.update(b"\x00")
        h.update(seq.to_bytes(8, "big"))
    return h.digest()


def _command_digest(prev: bytes, entry: Entry, salt: bytes = b"") -> bytes:
    h = hashlib.sha256(prev)
    h.update(entry.client_id.encode())
    h.update(b"\x00")
    h.update(entry.seq.to_bytes(8, "big"))
    h.update(entry.data)
    h.update(salt)
    return h.digest()


def _with_session(
    sessions: tuple[tuple[str, int], ...], client_id: str, seq: int
) -> tuple[tuple[str, int], ...]:
    table = dict(sessions)
    table[client_id] = seq
    return tuple(sorted(table.items()))


def apply_entry(state: SmState, entry: Entry, *, salt: bytes = b"") -> tuple[SmState, bool]:
    """Apply ``entry`` (which must be at ``state.applied + 1``; the caller checks) and return
    the new state and whether the entry had an effect on the user state.

    NOOP and CONF entries only advance ``applied``; a COMMAND that is a retry of an already
    applied ``(client_id, seq)`` is skipped. ``salt`` must be empty except in the impure
    variant."""
    if entry.kind is not EntryKind.COMMAND:
        return attrs.evolve(state, applied=entry.index), False
    if entry.client_id and entry.seq <= state.last_seq(entry.client_id):
        return attrs.evolve(state, applied=entry.index), False
    sessions = (
        _with_session(state.sessions, entry.client_id, entry.seq)
        if entry.client_id
        else state.sessions
    )
    return (
        SmState(
            applied=entry.index,
            digest=_command_digest(state.digest, entry, salt),
            sessions=sessions,
            count=state.count + 1,
        ),
        True,
    )


def apply_entry_impure(state: SmState, entry: Entry, node_id: str) -> tuple[SmState, bool]:
    """The broken variant: mixes the applying node's id into the digest, as an ``apply`` that
    read the clock or the host name would. Nodes then disagree at equal applied indices."""
    return apply_entry(state, entry, salt=node_id.encode())


def encode_state(state: SmState) -> bytes:
    """Snapshot bytes for ``state`` (canonical JSON: equal states give equal bytes)."""
    return json.dumps(
        {
            "applied": state.applied,
            "digest": state.digest.hex(),
            "sessions": [[cid, seq] for cid, seq in state.sessions],
            "count": state.count,
        },
        sort_keys=True,
        separators=(",", ":"),
    ).encode()


class BadSnapshotData(ValueError):
    """Snapshot bytes that :func:`decode_state` cannot read."""


def decode_state(data: bytes) -> SmState:
    """The inverse of :func:`encode_state`; raises :class:`BadSnapshotData`."""
    try:
        raw = json.loads(data)
        return SmState(
            applied=int(raw["applied"]),
            digest=bytes.fromhex(raw["digest"]),
            sessions=tuple((str(c), int(s)) for c, s in raw["sessions"]),
            count=int(raw["count"]),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise BadSnapshotData(f"cannot decode state machine snapshot: {exc}") from exc


def replay(entries: list[Entry], start: SmState = INITIAL) -> list[tuple[SmState, bool]]:
    """Apply ``entries`` in order from ``start``; the state (and effect) after each one."""
    out: list[tuple[SmState, bool]] = []
    state = start
    for entry in entries:
        state, effective = apply_entry(state, entry)
        out.append((state, effective))
    return out
