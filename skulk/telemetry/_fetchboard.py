"""This node's weight fetches in progress, published in its telemetry readings.

The worker reports each rank's fetch here; each telemetry sample lists them
(:attr:`~skulk.wire.telemetry.NodeReadings.fetches`), so any node's ``GET /v1/instances``
shows ``bytes_done`` / ``bytes_total`` for a runner in phase ``fetching``::

    board = FetchBoard()
    board.set(instance, rank, done, total)   # as bytes arrive (cheap: no I/O, never blocks)
    board.clear(instance, rank)              # fetched, failed or stopped
    board.snapshot()                         # what the next telemetry sample publishes
"""

from __future__ import annotations

import attrs

from skulk.wire.telemetry import MAX_FETCHES, FetchProgress


@attrs.frozen
class FetchBoardStatistics:
    fetches: int
    """Fetches listed now."""
    refused: int
    """:meth:`FetchBoard.set` calls for a new fetch while :data:`MAX_FETCHES` were listed."""


class FetchBoard:
    """Fetch progress per (instance, rank), at most :data:`MAX_FETCHES` at once (a new one
    beyond that is not listed: the readings stay small). Single-threaded (the node's Trio
    loop); no method blocks or raises for well-formed values."""

    def __init__(self) -> None:
        self._fetches: dict[tuple[str, int], FetchProgress] = {}
        self._refused = 0

    def set(self, instance: str, rank: int, done: int, total: int) -> None:
        """Rank ``rank`` of ``instance`` has ``done`` of ``total`` bytes here (clamped to
        ``0 <= done <= total``)."""
        key = (instance, rank)
        if key not in self._fetches and len(self._fetches) >= MAX_FETCHES:
            self._refused += 1
            return
        total = max(0, total)
        self._fetches[key] = FetchProgress(instance, rank, min(max(0, done), total), total)

    def clear(self, instance: str, rank: int) -> None:
        """The fetch of rank ``rank`` of ``instance`` is over (or never started)."""
        self._fetches.pop((instance, rank), None)

    def snapshot(self) -> tuple[FetchProgress, ...]:
        """Every fetch listed now, ordered by (instance, rank)."""
        return tuple(self._fetches[k] for k in sorted(self._fetches))

    def statistics(self) -> FetchBoardStatistics:
        return FetchBoardStatistics(len(self._fetches), self._refused)
