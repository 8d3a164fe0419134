"""Download progress: per file and in all, with a rate over the last seconds and an ETA."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable

import attrs


@attrs.frozen
class DownloadProgress:
    """Where a download stands. ``file`` is the file being fetched (``file_done`` of
    ``file_total`` bytes); ``done`` of ``total`` bytes over all files (bytes found already
    in staging count as done). ``rate_bps``: bytes per second received over the last few
    seconds; ``eta_s``: seconds left at that rate (``None`` until bytes move)."""

    repo: str
    file: str
    file_done: int
    file_total: int
    done: int
    total: int
    rate_bps: float
    eta_s: float | None


ProgressCallback = Callable[[DownloadProgress], None]

#: How often a report goes out while bytes move (the contract is "at least every ~0.5 s").
REPORT_INTERVAL_S = 0.25
_RATE_WINDOW_S = 3.0


class Meter:
    """Counts bytes and calls ``callback`` at most every ``interval`` seconds (always at a
    file's start and end). Used from the one thread that downloads."""

    def __init__(
        self,
        repo: str,
        total: int,
        callback: ProgressCallback | None,
        interval: float = REPORT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._repo = repo
        self._total = total
        self._callback = callback
        self._interval = interval
        self._clock = clock
        self._finished = 0  # bytes of the files done
        self._file = ""
        self._file_total = 0
        self._file_done = 0
        self._moved = 0  # bytes received in this call (what the rate measures)
        self._samples: collections.deque[tuple[float, int]] = collections.deque()
        self._last_report = -float("inf")

    def start_file(self, name: str, size: int, already: int) -> None:
        self._file, self._file_total, self._file_done = name, size, already
        self._report(force=True)

    def add(self, n: int) -> None:
        self._file_done += n
        self._moved += n
        self._report(force=False)

    def set_file_done(self, n: int) -> None:
        """The file's bytes on disk changed other than by appending (a restart from 0)."""
        self._file_done = n
        self._report(force=True)

    def finish_file(self) -> None:
        self._file_done = self._file_total
        self._report(force=True)
        self._finished += self._file_total
        self._file, self._file_total, self._file_done = "", 0, 0

    def snapshot(self) -> DownloadProgress:
        now = self._clock()
        self._samples.append((now, self._moved))
        while len(self._samples) > 2 and now - self._samples[1][0] >= _RATE_WINDOW_S:
            self._samples.popleft()
        t0, m0 = self._samples[0]
        rate = (self._moved - m0) / (now - t0) if now > t0 else 0.0
        done = min(self._total, self._finished + self._file_done)
        eta = (self._total - done) / rate if rate > 0 else None
        return DownloadProgress(
            self._repo, self._file, self._file_done, self._file_total, done, self._total, rate, eta
        )

    def _report(self, force: bool) -> None:
        now = self._clock()
        if self._callback is None or (not force and now - self._last_report < self._interval):
            return
        self._last_report = now
        self._callback(self.snapshot())
