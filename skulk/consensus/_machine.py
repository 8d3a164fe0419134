"""The replicated state machine interface, and exactly-once client sessions on top of it.

A :class:`StateMachine` is four pure functions over an immutable state ``S``::

    class Counter:
        def initial(self) -> int: return 0
        def apply(self, state: int, entry: Entry) -> tuple[int, bytes]:
            if entry.kind is not EntryKind.COMMAND:
                return state, b""
            return state + 1, str(state + 1).encode()
        def snapshot(self, state: int) -> bytes: return pack(state)
        def restore(self, data: bytes) -> int: return unpack_as(data, int)

``apply`` must be deterministic: no clock, no randomness, no iteration-order dependence (a
leader puts timestamps inside the command). It sees every committed entry, no-ops and
membership changes included, in log order; it returns the new state and the command's result
bytes (what :meth:`RaftDriver.submit` returns). ``snapshot``/``restore`` round-trip a state;
:func:`skulk.wire.pack` / :func:`skulk.wire.unpack` give them canonical CBOR compressed with
zstd, with a size cap on the way in.

:class:`Sessions` wraps a machine so that commands carrying ``(client_id, seq)`` apply exactly
once: a command whose ``seq`` is at or below the last one applied for its client is not applied
again; it returns the cached result of that last command. Clients therefore number their
commands upwards and have at most one in flight (retries reuse the seq). Sessions are kept for
the ``max_sessions`` most recently active clients (by log index, so every replica evicts the
same ones); a retry from an evicted client would apply again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Generic, Protocol, TypeVar

import attrs

from ..wire import SnapshotCorrupt, pack, unpack_as
from ._types import Entry, EntryKind

S = TypeVar("S")


class StateMachine(Protocol[S]):
    """What the Raft driver applies committed entries to (see the module doc)."""

    def initial(self) -> S:
        """The state before any entry."""
        ...

    def apply(self, state: S, entry: Entry) -> tuple[S, bytes]:
        """The state after ``entry`` and the result for its submitter (pure)."""
        ...

    def snapshot(self, state: S) -> bytes:
        """An image of ``state`` that :meth:`restore` turns back into an equal state."""
        ...

    def restore(self, data: bytes) -> S:
        """The state an image stands for; :class:`SnapshotCorrupt` if it is not one."""
        ...


@attrs.frozen
class Session:
    """The last command applied for one client: its ``seq``, its ``result`` and where it sat
    in the log (``index``, which orders eviction)."""

    seq: int
    result: bytes
    index: int


@attrs.frozen
class SessionState(Generic[S]):
    """The wrapped machine's ``state`` and the clients' sessions (never mutated in place)."""

    state: S
    sessions: Mapping[str, Session] = attrs.field(factory=dict)


class Sessions(Generic[S]):
    """A :class:`StateMachine` over :class:`SessionState` that applies each client command
    once (see the module doc). Entries without a ``client_id`` (no-ops, membership changes,
    anonymous commands) go straight to the wrapped machine."""

    def __init__(self, machine: StateMachine[S], *, max_sessions: int = 4096) -> None:
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, not {max_sessions}")
        self.machine = machine
        self.max_sessions = max_sessions

    def initial(self) -> SessionState[S]:
        return SessionState(self.machine.initial())

    def apply(self, state: SessionState[S], entry: Entry) -> tuple[SessionState[S], bytes]:
        new, results = self.apply_all(state, (entry,))
        return new, results[0]

    def apply_all(
        self, state: SessionState[S], entries: Sequence[Entry]
    ) -> tuple[SessionState[S], list[bytes]]:
        """:meth:`apply` of each entry in turn (the sessions are copied once, not per entry);
        the results in entry order."""
        inner, sessions, results = state.state, state.sessions, []
        copied: dict[str, Session] | None = None
        for entry in entries:
            if entry.kind is not EntryKind.COMMAND or not entry.client_id:
                inner, result = self.machine.apply(inner, entry)
                results.append(result)
                continue
            last = sessions.get(entry.client_id)
            if last is not None and entry.seq <= last.seq:
                results.append(last.result)  # a retry: answer it, do not apply it again
                continue
            inner, result = self.machine.apply(inner, entry)
            results.append(result)
            if copied is None:
                sessions = copied = dict(sessions)
            copied[entry.client_id] = Session(entry.seq, result, entry.index)
            if len(copied) > self.max_sessions:
                del copied[min(copied, key=lambda c: copied[c].index)]
        if inner is state.state and sessions is state.sessions:
            return state, results
        return SessionState(inner, sessions), results

    def last_seq(self, state: SessionState[S], client_id: str) -> int | None:
        """The last seq applied for ``client_id`` (``None``: no session)."""
        session = state.sessions.get(client_id)
        return None if session is None else session.seq

    def snapshot(self, state: SessionState[S]) -> bytes:
        rows = [[c, s.seq, s.result, s.index] for c, s in sorted(state.sessions.items())]
        return pack({"state": self.machine.snapshot(state.state), "sessions": rows})

    def restore(self, data: bytes) -> SessionState[S]:
        image = unpack_as(data, dict)
        inner, rows = image.get("state"), image.get("sessions")
        if set(image) != {"state", "sessions"} or not isinstance(inner, bytes):
            raise SnapshotCorrupt("a sessions image is {state: bytes, sessions: [...]}")
        if not isinstance(rows, list):
            raise SnapshotCorrupt("sessions must be a list")
        sessions: dict[str, Session] = {}
        for row in rows:
            if not (
                isinstance(row, list)
                and len(row) == 4
                and isinstance(row[0], str)
                and all(isinstance(v, int) and not isinstance(v, bool) for v in (row[1], row[3]))
                and isinstance(row[2], bytes)
            ):
                raise SnapshotCorrupt(f"bad session row {row!r:.80}")
            sessions[row[0]] = Session(row[1], row[2], row[3])
        return SessionState(self.machine.restore(inner), sessions)


class Counter:
    """The smallest useful machine: the state counts the commands applied, a command's result
    is the new count. The raft benchmark replicates it; tests use it."""

    def initial(self) -> int:
        return 0

    def apply(self, state: int, entry: Entry) -> tuple[int, bytes]:
        if entry.kind is not EntryKind.COMMAND:
            return state, b""
        return state + 1, str(state + 1).encode()

    def snapshot(self, state: int) -> bytes:
        return pack(state)

    def restore(self, data: bytes) -> int:
        return unpack_as(data, int)
