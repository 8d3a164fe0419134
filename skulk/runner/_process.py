"""Parent side of a runner: owns one ``python -m skulk.engine`` subprocess and its deadlines.

:meth:`Runner.run` spawns the process in its own process group and drives its lifecycle::

    spawning → [connecting →] loading(n/total) → warming → ready ⇄ busy → stopping → stopped
    failed(reason) from any state

Every wait on the runner has a deadline, each a typed :class:`~skulk.runner.RunnerError`:
``hello_timeout`` (spawn → Hello), ``load_timeout``, ``warmup_timeout``, ``progress_timeout``
(while a request is active, some frame — a token or a heartbeat — must arrive within it, else the
runner is *wedged*) and ``cancel_timeout`` (a Cancel must be acknowledged). However ``run`` ends —
failure, shutdown or cancellation from outside — every open request's channel is closed at once
(so no caller waits for a client-side timeout), and the whole process group is terminated
(SIGTERM, ``shutdown_grace``, SIGKILL) and reaped. Each runner keeps a
:class:`~skulk.runner.FlightRecorder`, written to the log when a deadline fires.

**A rank of a sharded instance** (``shard`` given) first forms its compute group
(``connecting``): within ``shard.connect_timeout`` of ``Load`` the runner must announce
``GroupJoining`` and then ``GroupJoined`` — else :class:`GroupNotJoined` (it never started
joining) or :class:`GroupConnectTimeout` (it started, the group did not form). Once serving,
its compute-group failures are typed: :class:`CollectiveTimedOut` (its watchdog fired: a peer is
stopped or wedged), :class:`CollectiveFailed` (a peer's connection was lost),
:class:`GroupStopped` (rank 0 ended the group); the runner's ``CollectiveTrace`` entries go into
the flight recorder with the runner's wall-clock times. None of these is retryable: a rank is
never relaunched on its own. Its progress deadline holds whenever it serves, requests or not
(every rank of a sharded instance beats from its loop), and a rank whose process is stopped by
a signal fails :class:`RunnerPaused` within ``rank_pause_timeout`` (the process state, read by
:class:`~skulk.runner._pause.PauseWatch`, does not depend on the runner's loop): its node
reports it as the culprit before its peers' collective deadlines fire. Only rank 0 takes
requests: :meth:`Runner.open_request` refuses on any other rank with
``RequestRejected("not_rank_zero")``.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from skulk.runner._config import Phase, RunnerConfig, RunnerStatistics
from skulk.runner._errors import RunnerCrashed, RunnerError, RunnerPaused
from skulk.runner._group import reap, spawn
from skulk.runner._lifecycle import Lifecycle
from skulk.runner._link import RunnerLink
from skulk.runner._output import RunnerOutput
from skulk.runner._pause import PauseWatch, pause_deadline
from skulk.runner._produced import produced_sink
from skulk.runner._pump import FramePump
from skulk.runner._recorder import FlightEvent, FlightRecorder
from skulk.runner._request_table import RequestEvent, RequestTable
from skulk.runner._requests import Requests
from skulk.runner._startup import Startup
from skulk.runner._watchdog import Watchdog
from skulk.wire.runner import (
    Embed,
    Embedded,
    EngineStats,
    Generate,
    Load,
    Prompt,
    RequestFailed,
    SamplingParams,
    ShardSpec,
    Tokenize,
    Tokenized,
)

log = logging.getLogger("skulk.runner")


class Runner:
    """One runner subprocess serving one model, or one rank of a sharded instance of it
    (``shard``). Create it, then ``await nursery.start(r.run)`` (``start`` returns once the
    model is loaded and warm: for a shard, on every rank) and use :meth:`open_request`.

    It coordinates the parts of a runner, each in a module of its own: its phase
    (:class:`Lifecycle`), its process group (:func:`spawn`, :func:`reap`), the socket to it
    (:class:`RunnerLink`), its output (:class:`RunnerOutput`), its start (:class:`Startup`),
    its requests (:class:`Requests` over a :class:`RequestTable`), the frames it sends
    (:class:`FramePump`) and the deadlines while it serves (:class:`Watchdog`)."""

    def __init__(
        self,
        model_id: str,
        model_path: str,
        config: RunnerConfig | None = None,
        *,
        incarnation: int = 1,
        on_phase: Callable[[Runner], None] | None = None,
        shard: ShardSpec | None = None,
    ) -> None:
        self.model_id = model_id
        self.model_path = model_path
        self.config = cfg = config or RunnerConfig()
        self.shard = shard
        self.incarnation = incarnation
        self.failure: RunnerError | None = None
        self.recorder = FlightRecorder()
        self._proc: trio.Process | None = None
        self._exit_code: int | None = None
        self._who = who = f"runner {model_id}#{incarnation}"
        self._lifecycle = Lifecycle(self.recorder, lambda: on_phase(self) if on_phase else None)
        self._output = RunnerOutput(who)
        self._link = RunnerLink()
        self._table = RequestTable(self.recorder, self._produced_sink())
        self._watchdog = Watchdog(
            who, cfg, shard, self._table, self._link, self.recorder, self._output
        )
        self._requests = Requests(
            cfg, shard, self._lifecycle, self._table, self._link, self._watchdog
        )
        self._pump = FramePump(
            who,
            self._lifecycle,
            self._table,
            self._watchdog,
            self.recorder,
            self._output,
            self._requests.cancel,
        )
        load = Load(
            model_path=model_path,
            model_id=model_id,
            shard=shard,
            kv_cache_bytes=cfg.kv_cache_bytes,
            prefix_cache_bytes=cfg.prefix_cache_bytes,
            kv_waiting=cfg.kv_waiting,
            speculative_tokens=cfg.speculative_tokens,
        )
        self._startup = Startup(
            who,
            load,
            cfg,
            self._lifecycle,
            self._link,
            self._pump,
            self._watchdog,
            self.recorder,
            self._output,
        )

    # ---- public ---------------------------------------------------------------------------

    @property
    def phase(self) -> Phase:
        return self._lifecycle.phase

    @property
    def progress(self) -> tuple[int, int]:
        """Loading progress as the runner last reported it: (loaded, total)."""
        return self._lifecycle.progress

    @property
    def world(self) -> int | None:
        """The compute group's size, once joined (a rank of a sharded instance)."""
        return self._startup.world

    @property
    def context_length(self) -> int:
        """The model's context length, once loaded."""
        return self._startup.context_length

    def statistics(self) -> RunnerStatistics:
        memory = self._pump.memory
        return RunnerStatistics(
            incarnation=self.incarnation,
            phase=self.phase,
            pid=self._proc.pid if self._proc else None,
            loaded=self.progress[0],
            total=self.progress[1],
            active_requests=len(self._table.inflight),
            cancels_pending=len(self._table.pending_cancels),
            tokens_out=self._table.tokens_out,
            cancelled=self._table.cancelled,
            rss_bytes=memory[0] if memory else None,
            mlx_active_bytes=memory[1] if memory else None,
            exit_code=self._exit_code,
            failure=str(self.failure) if self.failure else None,
        )

    def engine_statistics(self) -> EngineStats | None:
        """The runner's latest engine counters (speculation, prefix cache, KV budget), as it
        last sent them; ``None`` until it sends one (a sharded rank, an older runner never)."""
        return self._pump.engine_stats

    def recent_ttfts(self) -> tuple[float, ...]:
        """Seconds from send to first token of this runner's most recent requests (at most
        :data:`~skulk.runner._request_table.RECENT_TTFTS`), oldest first."""
        return tuple(self._table.ttfts)

    def flight_events(self) -> tuple[FlightEvent, ...]:
        return self.recorder.events()

    @property
    def output_tail(self) -> tuple[str, ...]:
        """The last lines the runner wrote to stdout/stderr."""
        return self._output.tail

    @asynccontextmanager
    async def open_request(
        self, request_id: str, prompt: Prompt, params: SamplingParams
    ) -> AsyncIterator[trio.MemoryReceiveChannel[RequestEvent]]:
        """Start a generation; yields the channel of its events.

        The channel ends after a ``Finished`` or ``RequestFailed``; if it ends without one, the
        runner went away (see :attr:`failure`). Leaving the block before the request finished
        (client gone, cancellation) sends ``Cancel``, which the runner must acknowledge within
        ``cancel_timeout``.

        Raises, before anything is sent: :class:`RunnerCrashed` when the runner is not serving,
        :class:`RequestRejected` for a request the link cannot carry (a lone surrogate in a
        string, a non-finite number, a frame over the size limit) — that request alone fails —
        and ``ValueError`` for a request id still in use (active, or its Cancel unanswered).
        On a rank other than 0 of a sharded instance every request is refused with
        :class:`RequestRejected` (``not_rank_zero``): rank 0 serves for the whole group.
        """
        frame = Generate(request_id=request_id, prompt=prompt, params=params)
        async with self._requests.open(frame) as events:
            yield events

    async def ask(self, frame: Tokenize | Embed) -> Tokenized | Embedded | RequestFailed | None:
        """Send a one-answer request (count a prompt's tokens, embed inputs) and return its
        answer: ``Tokenized`` / ``Embedded``, ``RequestFailed``, or ``None`` when the runner
        went away (see :attr:`failure`). Raises as :meth:`open_request` does (a sharded
        instance's rank 0 answers both). Cancelled while
        waiting, it cancels the request on the runner."""
        return await self._requests.ask(frame)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Spawn, load, warm up, then serve until the process fails or we are cancelled."""
        parent_sock, child_sock = socket.socketpair()
        try:
            proc = await spawn(self.config, self.incarnation, child_sock)
        except OSError as exc:
            parent_sock.close()
            failure = RunnerCrashed(f"could not start the runner process: {exc}")
            self._fail(failure)
            raise failure from exc
        finally:
            child_sock.close()
        self._proc = proc
        self._link.attach(parent_sock)
        self.recorder.record("phase", f"spawning pid {proc.pid}")
        log.info("runner %s#%d: started pid %d", self.model_id, self.incarnation, proc.pid)
        try:
            try:
                async with trio.open_nursery() as nursery:
                    assert proc.stdout is not None and proc.stderr is not None
                    nursery.start_soon(self._output.drain, proc.stdout, proc.pid)
                    nursery.start_soon(self._output.drain, proc.stderr, proc.pid)
                    if self.shard is not None and (
                        paused := pause_deadline(
                            self.config.rank_pause_timeout, self.shard.collective_timeout
                        )
                    ):
                        watch = PauseWatch(self._who, proc.pid, paused, self.recorder)
                        nursery.start_soon(watch.watch)
                    frames = self._link.frames()
                    await self._startup.run(frames, proc)
                    nursery.start_soon(self._watchdog.watch)
                    task_status.started()
                    await self._pump.serve(frames, nursery)
            except BaseExceptionGroup as group:
                # Our own nursery only wraps; callers want the typed failure itself.
                if len(group.exceptions) == 1 and isinstance(group.exceptions[0], RunnerError):
                    raise group.exceptions[0] from None
                raise
        except RunnerError as exc:
            self._fail(exc)
            raise
        finally:
            await self._stop(proc)

    def _produced_sink(self) -> Callable[[str, str], None] | None:
        """Where the text this runner sends is written down (chaos runs only: see
        :mod:`skulk.runner._produced`), tagged with its pid."""
        sink = produced_sink()
        if sink is None:
            return None
        return lambda request_id, text: sink(
            request_id, self._proc.pid if self._proc is not None else 0, text
        )

    # ---- lifecycle ------------------------------------------------------------------------

    def _fail(self, exc: RunnerError) -> None:
        if not exc.tail:
            exc.tail = self.output_tail
        self.failure = exc
        if self.phase != "failed":
            self._lifecycle.move("failed", str(exc))
        log.error("runner %s#%d failed: %s", self.model_id, self.incarnation, exc)

    async def _stop(self, proc: trio.Process) -> None:
        """Fail open requests at once, then terminate the process group and reap it.

        A serving rank of a sharded instance is first asked to ``Shutdown`` and given
        ``shutdown_grace`` to exit by itself: rank 0 then ends the whole compute group cleanly
        (the other ranks report ``group_stopped`` instead of a lost peer). A runner that
        reported its own failure (``RunnerFailed``: ``group_stopped`` among them) exits right
        after it, so it too is given ``shutdown_grace`` before any signal."""
        graceful = self.shard is not None and self._lifecycle.serving
        if self.phase != "failed":
            self._lifecycle.move("stopping")
        leaving = self._pump.leaving
        # A stopped process acts on no signal but SIGKILL: no grace to give it.
        grace = 0.0 if isinstance(self.failure, RunnerPaused) else self.config.shutdown_grace
        bound = (3 if graceful or leaving else 2) * grace + 1
        with trio.move_on_after(bound, shield=True):
            self._table.end_all(self.failure.reason if self.failure else "runner_stopped")
            await reap(
                proc,
                self._link,
                grace,
                shutdown=graceful,
                exiting=leaving,
                on_signal=lambda sig: self.recorder.record(
                    "signal", f"{sig.name} to group {proc.pid}"
                ),
            )
        self._exit_code = proc.returncode
        self.recorder.record("exit", f"code {proc.returncode}")
        if self.phase != "failed":
            self._lifecycle.move("stopped")
        log.info("runner %s#%d: exited with %s", self.model_id, self.incarnation, proc.returncode)
