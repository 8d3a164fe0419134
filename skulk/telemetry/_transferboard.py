"""Whole models coming onto this node (Hub downloads, spreads from peers), for its readings.

The node's model duties report each transfer here; each telemetry sample lists them
(:attr:`~skulk.wire.telemetry.NodeReadings.transfers`), so any node's ``GET /v1/downloads``
shows bytes, rate and ETA per node and file::

    board = TransferBoard()
    board.start(model, "hub", total)                  # before the first byte
    board.update(model, done, total, file, file_done, file_total)   # as bytes land
    board.finish(model)                               # done, failed or cancelled
    board.snapshot()                                  # what the next sample publishes

The rate is measured here, over the last :data:`RATE_WINDOW_S` seconds of updates (so every
source reports the same way). Single-threaded (the node's Trio loop): a worker thread hands
its progress over with ``trio.from_thread``; nothing here blocks.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import attrs

from skulk.clock import wall
from skulk.wire.telemetry import MAX_TRANSFERS, ModelTransfer

#: The window the rate is measured over (seconds).
RATE_WINDOW_S = 3.0


@attrs.define
class _Transfer:
    record: ModelTransfer
    samples: deque[tuple[float, int]]


class TransferBoard:
    """Transfers by model, at most :data:`MAX_TRANSFERS` at once (a new one beyond that is
    not listed). ``clock`` (monotonic seconds) and ``wall`` (display time) are for tests."""

    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = wall,
    ) -> None:
        self._clock = clock
        self._wall = wall
        self._transfers: dict[str, _Transfer] = {}

    def start(self, model: str, source: str, total: int) -> None:
        """``model`` starts coming from ``source`` (``"hub"`` or ``"peers"``), ``total``
        bytes in all (0 when not known yet)."""
        if model not in self._transfers and len(self._transfers) >= MAX_TRANSFERS:
            return
        record = ModelTransfer(model, source, 0, max(0, total), "", 0, 0, 0.0, None, self._wall())
        self._transfers[model] = _Transfer(record, deque([(self._clock(), 0)]))

    def update(
        self, model: str, done: int, total: int, file: str = "", file_done: int = 0,
        file_total: int = 0,
    ) -> None:  # fmt: skip
        """``done`` of ``total`` bytes of ``model`` are here; ``file`` is in flight."""
        entry = self._transfers.get(model)
        if entry is None:
            return
        now = self._clock()
        total = max(0, total)
        done = min(max(0, done), total) if total else max(0, done)
        entry.samples.append((now, done))
        while len(entry.samples) > 2 and now - entry.samples[1][0] >= RATE_WINDOW_S:
            entry.samples.popleft()
        first_at, first_done = entry.samples[0]
        elapsed = now - first_at
        rate = (done - first_done) / elapsed if elapsed > 0 and done > first_done else 0.0
        eta = (total - done) / rate if rate > 0 and total >= done else None
        entry.record = attrs.evolve(
            entry.record,
            bytes_done=done,
            bytes_total=total,
            file=file,
            file_done=max(0, file_done),
            file_total=max(0, file_total),
            rate_bps=round(rate, 1),
            eta_s=None if eta is None else round(eta, 1),
        )

    def finish(self, model: str) -> None:
        """The transfer of ``model`` is over (or never started)."""
        self._transfers.pop(model, None)

    def get(self, model: str) -> ModelTransfer | None:
        entry = self._transfers.get(model)
        return None if entry is None else entry.record

    def snapshot(self) -> tuple[ModelTransfer, ...]:
        """Every transfer listed now, ordered by model."""
        return tuple(self._transfers[m].record for m in sorted(self._transfers))
