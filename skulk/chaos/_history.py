"""The history of a chaos run: every client operation and every fault, as values.

Load threads append :class:`Op` records as their operations end; the fault driver appends
:class:`FaultRecord` s. Times are ``time.monotonic()`` seconds. The checkers
(:mod:`skulk.chaos._checks`) read only this and the final observations, so they are pure and
tested on hand-made histories.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from typing import Literal

import attrs

OpKind = Literal["chat", "stream", "place", "delete"]
#: How an operation ended:
#: ``ok`` — success; ``error`` — a typed error (an HTTP status with an error body, or a
#: stream's error event); ``unreachable`` — its entry node refused or reset the connection
#: (it was killed); ``timeout`` — the client gave up waiting (a hang); ``truncated`` — a stream
#: that ended with neither a finish nor an error event.
Outcome = Literal["ok", "error", "unreachable", "timeout", "truncated"]
OUTCOMES: tuple[Outcome, ...] = ("ok", "error", "unreachable", "timeout", "truncated")


@attrs.frozen
class Op:
    """One client operation through node ``node`` (1-based)."""

    kind: OpKind
    node: int
    start: float
    end: float
    outcome: Outcome
    #: The HTTP status (None when there was no response).
    status: int | None = None
    #: The error's ``code`` (or the exception's class name when there was no response).
    code: str | None = None
    detail: str = ""
    #: chat/stream: the prompt's index, the tokens asked for, and the text received (partial if
    #: it failed).
    prompt: int = 0
    text: str = ""
    max_tokens: int = 0
    #: place: the instance id the API acknowledged; delete: the instance asked for.
    instance: str | None = None
    #: chat/stream: the ``x-request-id`` it was sent with (the id runners record its text by).
    request_id: str | None = None

    @property
    def took(self) -> float:
        return self.end - self.start

    @property
    def definite_failure(self) -> bool:
        """A control command the API definitely did not apply: refused with a 4xx (a 5xx,
        a timeout or a lost connection leaves it unknown — the leader may have committed
        it)."""
        return self.outcome == "error" and self.status is not None and 400 <= self.status < 500


@attrs.frozen
class FaultRecord:
    """A fault as injected: ``kind`` on ``node`` from ``start`` until ``end`` (None while it
    lasts), and what went wrong injecting or healing it."""

    kind: str
    node: int
    start: float
    end: float | None
    problem: str = ""


class History:
    """Thread-safe append-only lists of ops and faults."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        self._faults: list[FaultRecord] = []

    def add(self, op: Op) -> None:
        with self._lock:
            self._ops.append(op)

    def fault(self, record: FaultRecord) -> int:
        with self._lock:
            self._faults.append(record)
            return len(self._faults) - 1

    def heal(self, index: int, end: float, problem: str = "") -> None:
        with self._lock:
            old = self._faults[index]
            self._faults[index] = attrs.evolve(old, end=end, problem=old.problem or problem)

    def ops(self) -> list[Op]:
        with self._lock:
            return list(self._ops)

    def faults(self) -> list[FaultRecord]:
        with self._lock:
            return list(self._faults)


def history_json(ops: Iterable[Op], faults: Iterable[FaultRecord]) -> str:
    """A run's operations and faults as one JSON document (``{"ops": [...], "faults": [...]}``,
    each record's fields by name)."""
    return json.dumps(
        {"ops": [attrs.asdict(op) for op in ops], "faults": [attrs.asdict(f) for f in faults]},
        indent=None,
    )
