"""This node's weight fetches in progress, published in its telemetry readings.

The worker reports each rank's fetch here; each telemetry sample lists them
(:attr:`~skulk.wire.telemetry.NodeReadings.fetches`), so any node's ``GET /v1/instances``
shows ``bytes_done`` / ``bytes_total`` for a runner in phase ``fetching``::

    board = FetchBoard()
    board.set(instance, rank, done, total)   # as bytes arrive (cheap: no I/O, never blocks)
    board.clear(instance, rank)              # fetched, failed or stopped
    board.snapshot()                         # what the next telemetry sample publishes

It also keeps the recent failed fetches for node health (``fetch_failed``)::

    board.failed(instance, rank, model, reason, message, at=wall())
    board.fetched(model)                     # a fetch of model succeeded: its failures clear
    board.failures(now=wall())          # the newest MAX_FETCH_FAILURES, none too old

:meth:`FetchBoard.follow` does all of it around one fetch.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

import attrs

from skulk.clock import wall
from skulk.wire.telemetry import (
    MAX_FAILURE_MESSAGE,
    MAX_FETCH_FAILURES,
    MAX_FETCHES,
    FetchFailure,
    FetchProgress,
)

T = TypeVar("T")

#: How long a failed fetch is published (seconds): a one-off failure stops warning by itself.
FETCH_FAILURE_KEPT = 600.0


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
        self._failures: deque[FetchFailure] = deque(maxlen=MAX_FETCH_FAILURES)

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

    async def follow(
        self,
        instance: str,
        rank: int,
        model: str,
        fetch: Callable[[Callable[[int, int], None]], Awaitable[T]],
    ) -> T:
        """Run ``fetch(progress)`` for rank ``rank`` of ``instance``: its progress is listed
        while it runs; if it raises, the failure is kept (its ``reason`` attribute, else
        ``fetch_failed``) and the exception goes on; if it succeeds, ``model``'s failures
        clear. A cancelled fetch is not a failure."""

        def progress(done: int, total: int) -> None:
            self.set(instance, rank, done, total)

        try:
            result = await fetch(progress)
        except Exception as exc:
            reason = getattr(exc, "reason", None)
            why = reason if isinstance(reason, str) and reason else "fetch_failed"
            self.failed(instance, rank, model, why, str(exc), at=wall())
            raise
        finally:
            self.clear(instance, rank)
        self.fetched(model)
        return result

    def failed(
        self, instance: str, rank: int, model: str, reason: str, message: str, *, at: float
    ) -> None:
        """The fetch of rank ``rank`` of ``instance`` (of ``model``) failed at wall-clock time
        ``at`` for ``reason`` (the oldest failure is dropped beyond :data:`MAX_FETCH_FAILURES`)."""
        self._failures.append(
            FetchFailure(instance, rank, model, reason, message[:MAX_FAILURE_MESSAGE], at)
        )

    def fetched(self, model: str) -> None:
        """A fetch of ``model`` succeeded: its earlier failures no longer say anything."""
        kept = [f for f in self._failures if f.model != model]
        self._failures.clear()
        self._failures.extend(kept)

    def failures(self, *, now: float) -> tuple[FetchFailure, ...]:
        """The failures of the last :data:`FETCH_FAILURE_KEPT` seconds before wall-clock
        ``now``, oldest first."""
        return tuple(f for f in self._failures if now - f.at <= FETCH_FAILURE_KEPT)

    def statistics(self) -> FetchBoardStatistics:
        return FetchBoardStatistics(len(self._fetches), self._refused)
