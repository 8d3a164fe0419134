"""The frame pump of a serving runner: every frame from the runner, to where it belongs.

A request's frames (tokens, its end, a count, embeddings, its failure) go to its consumer
through the :class:`RequestTable`, which never waits. *Background* frames may come at any
time, also while the runner starts (:meth:`FramePump.background`): heartbeats (the runner's
memory), engine counters, the compute group's collective trace (into the flight recorder, at
the runner's own wall-clock times), and the failures a runner reports about itself —
``RunnerFailed`` (after which it exits) and, for a rank of a sharded instance,
``CollectiveTimeout``. Any frame at all is progress for the :class:`Watchdog`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import trio

from skulk.runner._errors import (
    GROUP_FAILURES,
    CollectiveTimedOut,
    ProtocolError,
    RunnerCrashed,
    RunnerError,
)
from skulk.runner._lifecycle import Lifecycle
from skulk.runner._output import RunnerOutput
from skulk.runner._recorder import FlightRecorder, deadline_fired
from skulk.runner._request_table import RequestTable
from skulk.runner._watchdog import Watchdog
from skulk.wire.runner import (
    CollectiveEntry,
    CollectiveTimeout,
    CollectiveTrace,
    Embedded,
    EngineStats,
    Finished,
    FromRunner,
    Heartbeat,
    PrefillProgress,
    RequestFailed,
    RunnerFailed,
    TokenChunk,
    Tokenized,
)


class FramePump:
    """Dispatches the frames of runner ``who`` (``runner MODEL#INCARNATION``); ``cancel``
    sends a Cancel for a request whose consumer fell behind."""

    def __init__(
        self,
        who: str,
        lifecycle: Lifecycle,
        requests: RequestTable,
        watchdog: Watchdog,
        recorder: FlightRecorder,
        output: RunnerOutput,
        cancel: Callable[[str], Awaitable[None]],
    ) -> None:
        self._who = who
        self._lifecycle = lifecycle
        self._requests = requests
        self._watchdog = watchdog
        self._recorder = recorder
        self._output = output
        self._cancel = cancel
        #: (rss_bytes, mlx_active_bytes) from the last heartbeat.
        self.memory: tuple[int, int] | None = None
        #: The runner's latest engine counters, as it last sent them.
        self.engine_stats: EngineStats | None = None
        #: The runner reported its own failure (``RunnerFailed``): it exits by itself.
        self.leaving = False

    async def serve(self, frames: AsyncIterator[FromRunner], nursery: trio.Nursery) -> None:
        """Dispatch ``frames`` until the runner fails; Cancels go out from tasks in
        ``nursery`` (the pump never waits). Raises the runner's typed failure, or
        :class:`RunnerCrashed` when it closes its socket."""
        async for frame in frames:
            self._watchdog.heard()
            if isinstance(frame, (TokenChunk, Finished, Tokenized, Embedded, RequestFailed)):
                delivery = self._requests.deliver(frame)
                if delivery.idle:
                    self._lifecycle.move("ready")
                if delivery.cancel is not None:
                    nursery.start_soon(self._cancel, delivery.cancel)
            elif isinstance(frame, PrefillProgress):
                self._requests.prefilled(frame)
            elif not self.background(frame, _crashed):
                raise ProtocolError(f"unexpected {type(frame).__name__} while serving")
            self._watchdog.rearm()
        raise RunnerCrashed("runner closed its socket", tail=self._output.tail)

    def background(self, frame: FromRunner, failed: Callable[[str, str], RunnerError]) -> bool:
        """Handle a frame that may come at any time (heartbeat, engine stats, collective
        trace) and return True, or raise the failure a frame reports (``failed`` makes one for a
        ``RunnerFailed`` that is not a compute-group failure); False for any other frame."""
        if isinstance(frame, Heartbeat):
            self._heartbeat(frame)
        elif isinstance(frame, EngineStats):
            self.engine_stats = frame
        elif isinstance(frame, CollectiveTrace):
            self._trace(frame.entries, frame.dropped)
        elif isinstance(frame, CollectiveTimeout):
            self._trace(frame.recent, 0)
            deadline_fired(self._recorder, self._who, "collective_timeout", frame.seconds)
            raise CollectiveTimedOut(
                f"{frame.collective} at step {frame.step} took > {frame.seconds:g}s",
                tail=self._output.tail,
            )
        elif isinstance(frame, RunnerFailed):
            self.leaving = True
            group_failure = GROUP_FAILURES.get(frame.reason)
            if group_failure is not None:
                raise group_failure(frame.message, tail=self._output.tail)
            failure = failed(frame.reason, frame.message)
            failure.tail = self._output.tail
            raise failure
        else:
            return False
        return True

    def _heartbeat(self, beat: Heartbeat) -> None:
        self.memory = (beat.rss_bytes, beat.mlx_active_bytes)
        if self._requests.inflight:  # idle heartbeats would crowd the recorder out
            self._recorder.record(
                "heartbeat",
                f"#{beat.seq} rss {beat.rss_bytes >> 20} MiB, "
                f"mlx {beat.mlx_active_bytes >> 20} MiB",
            )

    def _trace(self, entries: tuple[CollectiveEntry, ...], dropped: int) -> None:
        if dropped:
            self._recorder.record("collective", f"({dropped} routine entries left out)")
        for e in entries:  # recorded when they completed: a wait shows up after its cause
            detail = f"{e.collective} step {e.step} took {e.seconds * 1e3:.1f} ms"
            self._recorder.record(
                "collective", f"{detail} {e.detail}".rstrip(), at=e.at + e.seconds
            )


def _crashed(reason: str, message: str) -> RunnerError:
    return RunnerCrashed(f"{reason}: {message}")
