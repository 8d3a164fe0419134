"""The collective watchdog of a sharded runner, and its trace of compute-group operations.

Every evaluation that contains a distributed operation (a collective, a send or a receive) is
entered through :meth:`CollectiveWatchdog.guard` with a name, the lockstep step and a deadline.
A peer that is SIGSTOPped or wedged never answers, and mlx would wait for it forever; the
watchdog thread notices the deadline pass, sends ``CollectiveTimeout`` to the node (under the
link's send lock, waiting at most a second for it) and ends the process with
:data:`COLLECTIVE_TIMEOUT_EXIT_CODE`, so every rank of a broken group exits within its deadline
and its node sees a typed failure. (A peer that *died* is noticed sooner: its sockets close and
the evaluation raises, see :data:`COLLECTIVE_FAILED_EXIT_CODE`.) mlx releases the GIL while it
evaluates, so the thread runs while the main thread waits.

``mx.distributed.init`` does *not* release the GIL while it connects, so no thread can watch it:
:func:`init_alarm` arms a real-time timer whose ``SIGALRM`` (default action) ends the process
without needing the interpreter. The node's own connect deadline normally fires first.

Each guarded operation leaves a :class:`~skulk.wire.runner.CollectiveEntry` (wall-clock start,
duration); :meth:`CollectiveWatchdog.take_trace` hands them to the heartbeat as one
``CollectiveTrace`` frame, so the node's flight recorder has them without a frame per token.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator

import attrs

from skulk.clock import wall
from skulk.wire.runner import CollectiveEntry, CollectiveTimeout, CollectiveTrace, FromRunner

#: Exit code of a rank whose collective outlived its deadline (after ``CollectiveTimeout``).
COLLECTIVE_TIMEOUT_EXIT_CODE = 71
#: Exit code of a rank whose collective failed (after ``RunnerFailed(collective_failed)``).
COLLECTIVE_FAILED_EXIT_CODE = 72
#: Routine entries kept per trace (the latest); entries with a detail are all kept.
TRACE_ROUTINE = 32
TRACE_DETAILED = 128
RECENT = 16
_POLL = 0.05


@attrs.define
class Note:
    """What a guarded operation carried, set inside the block once known (for the trace)."""

    detail: str = ""


@attrs.frozen
class _Active:
    collective: str
    step: int
    seconds: float
    deadline: float


class CollectiveWatchdog:
    """Deadlines for distributed evaluations (one at a time: the main thread's), and their
    trace. ``send(frame, within)`` sends a frame under the link's lock, waiting at most
    ``within`` seconds for the lock; ``exit`` ends the process (``os._exit``)."""

    def __init__(
        self,
        send: Callable[[FromRunner, float], bool],
        exit: Callable[[int], None] = os._exit,
    ) -> None:
        self._send = send
        self._exit = exit
        self._active: _Active | None = None
        self._routine: deque[CollectiveEntry] = deque(maxlen=TRACE_ROUTINE)
        self._detailed: deque[CollectiveEntry] = deque(maxlen=TRACE_DETAILED)
        self._recent: deque[CollectiveEntry] = deque(maxlen=RECENT)
        self._dropped = 0
        self._lock = threading.Lock()
        self.fired = threading.Event()
        threading.Thread(target=self._watch, name="runner-collective-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def guard(self, collective: str, step: int, seconds: float) -> Iterator[Note]:
        """Run the block (an evaluation with a distributed op) within ``seconds``; the
        :class:`Note` it gets may say what the operation carried. A guard inside another
        (rank 0's messages inside a turn of its loop) is covered by the outer one's deadline;
        it leaves its own entry in the trace."""
        start_wall, start = wall(), time.monotonic()
        note = Note()
        outer = self._active is not None  # nested: the enclosing deadline covers it
        if not outer:
            self._active = _Active(collective, step, seconds, start + seconds)
        try:
            yield note
        finally:
            if not outer:
                self._active = None
            took = time.monotonic() - start
            self.record(CollectiveEntry(start_wall, collective, step, took, note.detail))

    def record(self, entry: CollectiveEntry) -> None:
        with self._lock:
            if entry.detail:
                self._detailed.append(entry)
            else:
                if len(self._routine) == self._routine.maxlen:
                    self._dropped += 1
                self._routine.append(entry)
            self._recent.append(entry)

    def take_trace(self) -> CollectiveTrace | None:
        """The entries since the last call, oldest first (``None`` if there are none)."""
        with self._lock:
            entries = sorted((*self._routine, *self._detailed), key=lambda e: e.at)
            dropped, self._dropped = self._dropped, 0
            self._routine.clear()
            self._detailed.clear()
        if not entries and not dropped:
            return None
        return CollectiveTrace(tuple(entries), dropped)

    def recent(self) -> tuple[CollectiveEntry, ...]:
        with self._lock:
            return tuple(self._recent)

    def _watch(self) -> None:
        while True:
            time.sleep(_POLL)
            active = self._active
            if active is None or time.monotonic() < active.deadline:
                continue
            self.fired.set()
            frame = CollectiveTimeout(active.collective, active.step, active.seconds, self.recent())
            try:
                self._send(frame, 1.0)
            except Exception:  # whatever it is, the rank must still exit
                pass  # the node is gone (or the frame failed): exiting is all that is left
            finally:
                self._exit(COLLECTIVE_TIMEOUT_EXIT_CODE)
            return


@contextlib.contextmanager
def init_alarm(seconds: float) -> Iterator[None]:
    """End the process by ``SIGALRM`` unless the block finishes within ``seconds``: for
    ``mx.distributed.init``, which holds the GIL while it connects."""
    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
