"""A runner process's stdout and stderr: copied into the node's log, with a short tail kept.

Both pipes must be read for as long as the process lives (a pipe nobody reads blocks the writer
once ~64 KiB are buffered). Each line goes to the ``skulk.runner`` log as
``runner MODEL#INCARNATION[PID]: LINE``; the last :data:`TAIL_LINES` lines are kept for the
failure reports (:attr:`RunnerError.tail <skulk.runner.RunnerError>`).
"""

from __future__ import annotations

import logging
from collections import deque

import trio

log = logging.getLogger("skulk.runner")

#: Lines of output kept for failure reports.
TAIL_LINES = 64
#: A line longer than this many bytes is logged in pieces (a runner may write without newlines).
LONGEST_PENDING = 8192
#: Characters of one line kept in the log and the tail.
LONGEST_LINE = 2000


class RunnerOutput:
    """The output of one runner incarnation, ``who`` (``runner MODEL#INCARNATION``) in the log."""

    def __init__(self, who: str) -> None:
        self._who = who
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)

    @property
    def tail(self) -> tuple[str, ...]:
        """The last lines the runner wrote to stdout/stderr."""
        return tuple(self._tail)

    async def drain(self, pipe: trio.abc.ReceiveStream, pid: int) -> None:
        """Copy ``pipe`` (process ``pid``'s stdout or stderr) into the log until it ends."""
        pending = b""
        async for data in pipe:
            pending += data
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                self._line(raw, pid)
            if len(pending) > LONGEST_PENDING:
                self._line(pending, pid)
                pending = b""
        if pending:
            self._line(pending, pid)

    def _line(self, raw: bytes, pid: int) -> None:
        line = raw.decode("utf-8", "replace").rstrip()[:LONGEST_LINE]
        self._tail.append(line)
        log.info("%s[%s]: %s", self._who, pid, line)
