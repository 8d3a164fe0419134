"""The deadlines on a serving runner, watched by one cancel scope whose deadline is moved as
frames arrive: :class:`RunnerWedged` and :class:`CancelTimeout`.

* **Progress** (``progress_timeout``): while a request is active — and always on a rank of a
  sharded instance, every rank of which beats from its loop — some frame, a token or a
  heartbeat, must arrive within the deadline, else the runner is *wedged*. ``0`` disables it.
* **Cancel acknowledgement** (``cancel_timeout``): every Cancel must be answered in time.

**The node's own pauses are not the runner's fault** (:data:`PAUSE_SLACK`): a silence the
watchdog wakes to late, or with the runner's bytes still unread, restarts the deadlines once
(recorded as ``paused``) instead of failing the runner.
"""

from __future__ import annotations

import logging
import math

import trio

from skulk.runner._config import RunnerConfig
from skulk.runner._errors import CancelTimeout, RunnerWedged
from skulk.runner._link import RunnerLink
from skulk.runner._output import RunnerOutput
from skulk.runner._recorder import FlightRecorder, deadline_fired
from skulk.runner._request_table import RequestTable
from skulk.wire.runner import ShardSpec

log = logging.getLogger("skulk.runner")

#: A watchdog that wakes this much later than its deadline was not running itself: its node was
#: paused (SIGSTOP, a suspended machine) or its event loop starved. The silence is then the
#: node's, not the runner's (what the runner sent meanwhile is still unread in the socket, or
#: the runner was paused too): the deadlines restart from now instead of firing. So they do
#: when the runner's socket holds bytes not read yet, however late the watchdog is. Once per
#: silence: a runner still silent a full deadline later is wedged, however late the node is
#: again.
PAUSE_SLACK = 1.0


class Watchdog:
    """The progress and cancel-acknowledgement deadlines of runner ``who`` (``runner
    MODEL#INCARNATION``). Run :meth:`watch` while the runner serves; call :meth:`heard` when a
    frame arrives and :meth:`rearm` whenever a deadline may have moved."""

    def __init__(
        self,
        who: str,
        config: RunnerConfig,
        shard: ShardSpec | None,
        requests: RequestTable,
        link: RunnerLink,
        recorder: FlightRecorder,
        output: RunnerOutput,
    ) -> None:
        self._who = who
        self._config = config
        self._shard = shard
        self._requests = requests
        self._link = link
        self._recorder = recorder
        self._output = output
        #: When the runner was last heard from (trio clock), or the progress window restarted.
        self.last_progress = 0.0
        self._excused: float | None = None  # last_progress as restarted after a node pause
        self._scope: trio.CancelScope | None = None

    def heard(self) -> None:
        """The runner was heard from now (or its progress window starts now)."""
        self.last_progress = trio.current_time()

    def rearm(self) -> None:
        """Point the watchdog at the earliest deadline now pending (progress, cancel acks)."""
        if self._scope is None:
            return
        deadline = math.inf
        if self._expects_progress() and self._config.progress_timeout > 0:
            deadline = self.last_progress + self._config.progress_timeout
        if self._requests.pending_cancels:
            deadline = min(deadline, *self._requests.pending_cancels.values())
        self._scope.deadline = deadline

    async def watch(self) -> None:
        """Raise :class:`RunnerWedged` / :class:`CancelTimeout` when their deadline passes."""
        while True:
            with trio.CancelScope() as scope:
                self._scope = scope
                self.rearm()
                await trio.sleep_forever()
            self._scope = None
            now = trio.current_time()
            if self._excused != self.last_progress and (why := self._paused(now - scope.deadline)):
                self._excuse_pause(now, why)
                continue
            late = self._requests.late_cancels(now)
            if late:
                timeout = self._config.cancel_timeout
                deadline_fired(self._recorder, self._who, "cancel_timeout", timeout)
                raise CancelTimeout(
                    f"cancel of {late[0]} not acknowledged within {timeout:g}s",
                    tail=self._output.tail,
                )
            timeout = self._config.progress_timeout
            if self._expects_progress() and timeout > 0 and now >= self.last_progress + timeout:
                deadline_fired(self._recorder, self._who, "progress_timeout", timeout)
                active = len(self._requests.inflight)
                what = (
                    f"{active} request(s) active"
                    if active
                    else f"rank {self._shard.rank if self._shard else 0} of a sharded instance"
                )
                raise RunnerWedged(
                    f"{what} and nothing from the runner for {timeout:g}s",
                    tail=self._output.tail,
                )
            # The deadline moved after it passed: re-arm and keep watching.

    def _paused(self, overslept: float) -> str:
        """Why the silence the watchdog woke to (``overslept`` seconds after its deadline) is
        this node's own, or ``""`` (see :data:`PAUSE_SLACK`)."""
        if unread := self._link.unread():
            return f"{unread} bytes from the runner not read yet"
        if overslept > PAUSE_SLACK:
            return f"the watchdog woke {overslept:.1f}s after its deadline"
        return ""

    def _excuse_pause(self, now: float, why: str) -> None:
        """This node was not running on time (``why``): restart the progress window and the
        cancel deadlines from now instead of failing the runner."""
        self._recorder.record("paused", f"this node was paused: {why}; its deadlines restart")
        log.warning(
            "%s: this node was paused or starved (%s): not blaming the runner", self._who, why
        )
        self.last_progress = self._excused = now
        for request_id in self._requests.pending_cancels:
            self._requests.pending_cancels[request_id] = now + self._config.cancel_timeout

    def _expects_progress(self) -> bool:
        """Whether the runner must be heard from within the progress deadline: while it works
        on requests, and always for a rank of a sharded instance (its loop never stops)."""
        return bool(self._requests.inflight) or self._shard is not None
