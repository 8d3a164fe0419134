"""The pause deadline of a rank of a sharded instance: :class:`RunnerPaused`.

A rank whose process is stopped (SIGSTOP, a debugger's stop, a job-control stop) stalls its
whole compute group. Its peers notice only at their collective deadline, and then only as
*victims*: they know a step did not complete, not which rank is to blame. The rank's own node
would notice at its progress deadline, later still. So the leader would re-place the instance
without knowing which node to avoid.

The process state is a signal that does not depend on the runner's main loop: the operating
system says whether a process is stopped. :class:`PauseWatch` polls it (with ``psutil``, which
reads the state the same way on Linux and macOS) and fails the rank with :class:`RunnerPaused`
once its process has been stopped for the pause deadline. The deadline is kept under half the
collective deadline, so the culprit's own report reaches the leader before its peers' victim
reports (see ``skulk.cluster``'s culprit rules). A single runner is not watched this way: a
pause there stalls nobody else, and its progress deadline covers it.
"""

from __future__ import annotations

import logging

import psutil
import trio

from skulk.runner._errors import RunnerPaused
from skulk.runner._recorder import FlightRecorder, deadline_fired

log = logging.getLogger("skulk.runner")

#: How often the process state is read (seconds).
POLL_S = 0.25


def pause_deadline(rank_pause_timeout: float, collective_timeout: float) -> float:
    """The pause deadline of a rank (seconds; ``0``: not watched): ``rank_pause_timeout``, kept
    under half of ``collective_timeout`` when that is set, so the paused rank is blamed before
    its peers' collective deadlines fire."""
    if rank_pause_timeout <= 0:
        return 0.0
    if collective_timeout > 0:
        return min(rank_pause_timeout, collective_timeout / 2)
    return rank_pause_timeout


def is_stopped(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal now (``False`` once it is gone: its exit
    is the runner link's to notice)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.Error:
        return False


class PauseWatch:
    """Raise :class:`RunnerPaused` once process ``pid`` (of runner ``who``) has been stopped
    for ``deadline`` seconds on end; a process that resumes before restarts the count."""

    def __init__(self, who: str, pid: int, deadline: float, recorder: FlightRecorder) -> None:
        self._who = who
        self._pid = pid
        self._deadline = deadline
        self._recorder = recorder

    async def watch(self) -> None:
        stopped_since: float | None = None
        while True:
            stopped = await trio.to_thread.run_sync(is_stopped, self._pid)
            now = trio.current_time()
            if not stopped:
                stopped_since = None
            elif stopped_since is None:
                stopped_since = now
                self._recorder.record("stopped", f"the runner process (pid {self._pid}) is stopped")
            elif now - stopped_since >= self._deadline:
                deadline_fired(self._recorder, self._who, "rank_pause_timeout", self._deadline)
                raise RunnerPaused(
                    f"the rank's process (pid {self._pid}) has been stopped for "
                    f"{now - stopped_since:.1f}s (deadline {self._deadline:g}s)"
                )
            await trio.sleep(POLL_S)
