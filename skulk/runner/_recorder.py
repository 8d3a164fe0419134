"""A runner's flight recorder: its last N events, kept by the node for diagnostics."""

from __future__ import annotations

import logging
import time
from collections import deque

import attrs

from skulk.clock import wall

DEFAULT_CAPACITY = 256

log = logging.getLogger("skulk.runner")


@attrs.frozen
class FlightEvent:
    """One thing that happened to a runner.

    ``kind`` is one of ``phase``, ``progress``, ``request.start``, ``request.admitted_kv``
    (the runner admitted it to its KV budget: the queue wait ends, prefill starts),
    ``request.prefill`` (one prefill chunk done), ``request.first_token``,
    ``request.finish``, ``request.fail``, ``request.cancel``, ``heartbeat``, ``deadline``,
    ``paused`` (the node's own watchdog woke late: the node was paused, so its deadlines
    restarted instead of firing), ``stopped`` (a rank's process was seen stopped by a signal,
    see :mod:`skulk.runner._pause`), ``signal``, ``exit``, and for a rank of a sharded instance
    ``group`` (joining, joined) and ``collective`` (one compute-group operation the runner
    reported, at the runner's own wall-clock time when it completed, its duration in the
    detail: the cluster timeline merges the recorders of all ranks by ``at``); ``at`` is
    wall-clock time, ``since_spawn`` seconds since the spawn.
    """

    at: float
    since_spawn: float
    kind: str
    detail: str
    request_id: str | None = None


class FlightRecorder:
    """The last ``capacity`` events (older ones are dropped) of one runner incarnation."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._events: deque[FlightEvent] = deque(maxlen=capacity)
        self._start = time.monotonic()
        self._start_wall = wall()
        self.dropped = 0

    def record(
        self,
        kind: str,
        detail: str = "",
        request_id: str | None = None,
        *,
        at: float | None = None,
    ) -> None:
        """Record an event that happened now, or at wall-clock time ``at`` (an event another
        process reported: its ``since_spawn`` is derived from ``at``)."""
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
        if at is None:
            at, since = wall(), time.monotonic() - self._start
        else:
            since = at - self._start_wall
        self._events.append(FlightEvent(at, since, kind, detail, request_id))

    def events(self) -> tuple[FlightEvent, ...]:
        return tuple(self._events)

    def dump(self, logger: logging.Logger, title: str) -> None:
        """Write the whole timeline to ``logger`` (done when a deadline fires), in wall-clock
        order (events a runner reported arrive after they happened)."""
        logger.error(
            "%s — flight recorder (%d events, %d dropped):", title, len(self._events), self.dropped
        )
        for e in sorted(self._events, key=lambda e: e.at):
            rid = f" [{e.request_id}]" if e.request_id else ""
            logger.error("  %+9.3fs %-20s %s%s", e.since_spawn, e.kind, e.detail, rid)


def deadline_fired(recorder: FlightRecorder, who: str, name: str, seconds: float) -> None:
    """Record that the deadline ``name`` (of ``seconds``) fired on runner ``who`` (``runner
    MODEL#INCARNATION``), and write the whole timeline to the log."""
    recorder.record("deadline", f"{name} ({seconds:g}s)")
    recorder.dump(log, f"{who}: {name} fired")
