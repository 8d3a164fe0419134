"""A runner's flight recorder: its last N events, kept by the node for diagnostics."""

from __future__ import annotations

import logging
import time
from collections import deque

import attrs

DEFAULT_CAPACITY = 256


@attrs.frozen
class FlightEvent:
    """One thing that happened to a runner.

    ``kind`` is one of ``phase``, ``request.start``, ``request.first_token``,
    ``request.finish``, ``request.fail``, ``request.cancel``, ``heartbeat``, ``deadline``,
    ``signal``, ``exit``; ``at`` is wall-clock time, ``since_spawn`` seconds since the spawn.
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
        self.dropped = 0

    def record(self, kind: str, detail: str = "", request_id: str | None = None) -> None:
        if len(self._events) == self._events.maxlen:
            self.dropped += 1
        now = time.monotonic()
        self._events.append(FlightEvent(time.time(), now - self._start, kind, detail, request_id))

    def events(self) -> tuple[FlightEvent, ...]:
        return tuple(self._events)

    def dump(self, logger: logging.Logger, title: str) -> None:
        """Write the whole timeline to ``logger`` (done when a deadline fires)."""
        logger.error(
            "%s — flight recorder (%d events, %d dropped):", title, len(self._events), self.dropped
        )
        for e in self._events:
            rid = f" [{e.request_id}]" if e.request_id else ""
            logger.error("  %+9.3fs %-20s %s%s", e.since_spawn, e.kind, e.detail, rid)
