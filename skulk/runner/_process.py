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
(every rank of a sharded instance beats from its loop), so a SIGSTOPped rank is reported
wedged by its own node. Only rank 0 takes requests: :meth:`Runner.open_request` refuses on any
other rank with ``RequestRejected("not_rank_zero")``.
"""

from __future__ import annotations

import fcntl
import logging
import math
import os
import signal
import socket
import subprocess
import sys
import termios
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from skulk.engine.faults import ENV as FAULTS_ENV
from skulk.engine.protocol import FROM_RUNNER, TO_RUNNER
from skulk.runner._config import TRANSITIONS, Phase, RunnerConfig, RunnerStatistics
from skulk.runner._errors import (
    GROUP_FAILURES,
    CancelTimeout,
    CollectiveTimedOut,
    GroupConnectTimeout,
    GroupNotJoined,
    HelloTimeout,
    LoadFailed,
    LoadTimeout,
    ProtocolError,
    RequestRejected,
    RunnerCrashed,
    RunnerError,
    RunnerWedged,
    WarmupTimeout,
)
from skulk.runner._group import terminate_group
from skulk.runner._recorder import FlightEvent, FlightRecorder
from skulk.wire import FrameReader, FrameTooLarge, WireError
from skulk.wire.runner import (
    PROTOCOL_VERSION,
    Cancel,
    CollectiveEntry,
    CollectiveTimeout,
    CollectiveTrace,
    Embed,
    Embedded,
    EngineStats,
    Finished,
    FromRunner,
    Generate,
    GroupJoined,
    GroupJoining,
    Heartbeat,
    Hello,
    Load,
    Loaded,
    LoadProgress,
    Prompt,
    RequestFailed,
    RunnerFailed,
    SamplingParams,
    ShardSpec,
    Shutdown,
    TokenChunk,
    Tokenize,
    Tokenized,
    ToRunner,
    WarmedUp,
)

log = logging.getLogger("skulk.runner")

RequestEvent = TokenChunk | Finished | Tokenized | Embedded | RequestFailed
#: Chunks buffered per request; a consumer that falls this far behind is failed with
#: ``client_too_slow`` (the runner's reader never waits for one consumer).
REQUEST_BUFFER = 1024
TAIL_LINES = 64
#: A watchdog that wakes this much later than its deadline was not running itself: its node was
#: paused (SIGSTOP, a suspended machine) or its event loop starved. The silence is then the
#: node's, not the runner's (what the runner sent meanwhile is still unread in the socket, or
#: the runner was paused too): the deadlines restart from now instead of firing. So they do
#: when the runner's socket holds bytes not read yet, however late the watchdog is. Once per
#: silence: a runner still silent a full deadline later is wedged, however late the node is
#: again.
PAUSE_SLACK = 1.0


class Runner:
    """One runner subprocess serving one model, or one rank of a sharded instance of it
    (``shard``). Create it, then ``await nursery.start(r.run)`` (``start`` returns once the
    model is loaded and warm: for a shard, on every rank) and use :meth:`open_request`."""

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
        self.config = config or RunnerConfig()
        self.shard = shard
        self.world: int | None = None  # the compute group's size, once joined
        self.incarnation = incarnation
        self.phase: Phase = "spawning"
        self.failure: RunnerError | None = None
        self.context_length = 0
        self.recorder = FlightRecorder()
        self.progress = (0, 0)
        self._on_phase = on_phase
        self._pid: int | None = None
        self._stream: trio.SocketStream | None = None
        self._send_lock = trio.Lock()
        # Consumers waiting for a request's events, and the requests the runner still works on
        # (a cancelled request stays in _inflight until the runner acknowledges it).
        self._requests: dict[str, trio.MemorySendChannel[RequestEvent]] = {}
        self._inflight: dict[str, bool] = {}  # request id → first token seen
        self._cancel_deadlines: dict[str, float] = {}
        self._last_progress = 0.0
        self._excused: float | None = None  # _last_progress as restarted after a node pause
        self._watchdog: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._tokens_out = 0
        self._cancelled = 0
        self._memory: tuple[int, int] | None = None
        self._engine_stats: EngineStats | None = None
        self._exit_code: int | None = None
        self._leaving = False  # the runner reported its own failure (RunnerFailed): it exits
        self._proc: trio.Process | None = None

    # ---- public ---------------------------------------------------------------------------

    def statistics(self) -> RunnerStatistics:
        return RunnerStatistics(
            incarnation=self.incarnation,
            phase=self.phase,
            pid=self._pid,
            loaded=self.progress[0],
            total=self.progress[1],
            active_requests=len(self._inflight),
            cancels_pending=len(self._cancel_deadlines),
            tokens_out=self._tokens_out,
            cancelled=self._cancelled,
            rss_bytes=self._memory[0] if self._memory else None,
            mlx_active_bytes=self._memory[1] if self._memory else None,
            exit_code=self._exit_code,
            failure=str(self.failure) if self.failure else None,
        )

    def engine_statistics(self) -> EngineStats | None:
        """The runner's latest engine counters (speculation, prefix cache, KV budget), as it
        last sent them; ``None`` until it sends one (a sharded rank, an older runner never)."""
        return self._engine_stats

    def flight_events(self) -> tuple[FlightEvent, ...]:
        return self.recorder.events()

    @property
    def output_tail(self) -> tuple[str, ...]:
        """The last lines the runner wrote to stdout/stderr."""
        return tuple(self._tail)

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
        async with self._open(frame) as events:
            yield events

    async def ask(self, frame: Tokenize | Embed) -> Tokenized | Embedded | RequestFailed | None:
        """Send a one-answer request (count a prompt's tokens, embed inputs) and return its
        answer: ``Tokenized`` / ``Embedded``, ``RequestFailed``, or ``None`` when the runner
        went away (see :attr:`failure`). Raises as :meth:`open_request` does (a sharded
        instance's rank 0 answers both). Cancelled while waiting, it cancels the request on the
        runner."""
        async with self._open(frame) as events:
            async for event in events:
                if isinstance(event, (Tokenized, Embedded, RequestFailed)):
                    return event
        return None

    @asynccontextmanager
    async def _open(
        self, frame: Generate | Tokenize | Embed
    ) -> AsyncIterator[trio.MemoryReceiveChannel[RequestEvent]]:
        request_id = frame.request_id
        if self.shard is not None and self.shard.rank != 0:
            raise RequestRejected(
                "not_rank_zero",
                f"rank {self.shard.rank} of a sharded instance takes no requests; rank 0 does",
            )
        if self.phase not in ("ready", "busy"):
            raise RunnerCrashed(f"runner is {self.phase}")
        if (
            request_id in self._requests
            or request_id in self._inflight
            or request_id in self._cancel_deadlines
        ):
            raise ValueError(f"request id {request_id!r} already active")
        # Encode first: a request that cannot be sent must leave nothing behind — no channel,
        # no in-flight entry, and above all no Cancel for a request the runner never saw.
        data = _encode_generate(frame)
        # One slot more than the chunks it may hold: room for a final client_too_slow.
        send, receive = trio.open_memory_channel[RequestEvent](REQUEST_BUFFER + 1)
        self._requests[request_id] = send
        if not self._inflight:
            self._last_progress = trio.current_time()
            self._transition("busy")
        self._inflight[request_id] = False
        self.recorder.record("request.start", request_id=request_id)
        self._rearm()
        sent = False
        try:
            await self._send_bytes(data)
            sent = True
            async with receive:
                yield receive
        finally:
            # Still registered ⇒ the runner has not finished it: stop the work there.
            if self._requests.pop(request_id, None) is not None:
                send.close()
                if not sent:  # the runner never got it (its socket failed): just forget it
                    self._forget(request_id)
                elif request_id in self._inflight and self.phase == "busy":
                    await self._cancel(request_id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Spawn, load, warm up, then serve until the process fails or we are cancelled."""
        parent_sock, child_sock = socket.socketpair()
        try:
            proc = await self._spawn(child_sock)
        except OSError as exc:
            parent_sock.close()
            failure = RunnerCrashed(f"could not start the runner process: {exc}")
            self._fail(failure)
            raise failure from exc
        finally:
            child_sock.close()
        self._pid = proc.pid
        self._proc = proc
        self._stream = trio.SocketStream(trio.socket.from_stdlib_socket(parent_sock))
        self.recorder.record("phase", f"spawning pid {proc.pid}")
        log.info("runner %s#%d: started pid %d", self.model_id, self.incarnation, proc.pid)
        try:
            try:
                async with trio.open_nursery() as nursery:
                    assert proc.stdout is not None and proc.stderr is not None
                    nursery.start_soon(self._drain, proc.stdout)
                    nursery.start_soon(self._drain, proc.stderr)
                    frames = self._frames(self._stream)
                    await self._handshake(frames)
                    nursery.start_soon(self._watch)
                    self._nursery = nursery
                    task_status.started()
                    await self._dispatch(frames)
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

    # ---- lifecycle ------------------------------------------------------------------------

    async def _spawn(self, child_sock: socket.socket) -> trio.Process:
        return await trio.lowlevel.open_process(
            [
                self.config.python,
                "-m",
                "skulk.engine",
                "--fd",
                str(child_sock.fileno()),
                "--parent-pid",
                str(os.getpid()),
                "--incarnation",
                str(self.incarnation),
                "--heartbeat-interval",
                str(self.config.heartbeat_interval),
                "--load-timeout",
                str(self.config.load_timeout),
            ],
            pass_fds=(child_sock.fileno(),),
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1", FAULTS_ENV: self.config.faults},
        )

    def _transition(self, phase: Phase, detail: str = "") -> None:
        if phase == self.phase:
            return
        if phase not in TRANSITIONS[self.phase]:
            raise AssertionError(f"runner cannot go from {self.phase} to {phase}")
        self.phase = phase
        self.recorder.record("phase", f"{phase}{': ' + detail if detail else ''}")
        if self._on_phase is not None:
            self._on_phase(self)

    def _fail(self, exc: RunnerError) -> None:
        if not exc.tail:
            exc.tail = self.output_tail
        self.failure = exc
        if self.phase != "failed":
            self._transition("failed", str(exc))
        log.error("runner %s#%d failed: %s", self.model_id, self.incarnation, exc)

    async def _handshake(self, frames: AsyncIterator[FromRunner]) -> None:
        cfg = self.config
        hello = await self._within(cfg.hello_timeout, "hello_timeout", HelloTimeout, frames)
        if not isinstance(hello, Hello):
            raise ProtocolError(f"expected Hello, got {type(hello).__name__}")
        if hello.protocol_version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"runner speaks protocol {hello.protocol_version}, node {PROTOCOL_VERSION}"
            )
        load = Load(
            model_path=self.model_path,
            model_id=self.model_id,
            shard=self.shard,
            kv_cache_bytes=self.config.kv_cache_bytes,
            prefix_cache_bytes=self.config.prefix_cache_bytes,
            kv_waiting=self.config.kv_waiting,
            speculative_tokens=self.config.speculative_tokens,
        )
        if self.shard is None:
            self._transition("loading")
            await self._send(load)
        else:
            self._transition("connecting")
            await self._send(load)
            await self._connect(frames, self.shard)
            self._transition("loading")
        with trio.move_on_after(cfg.load_timeout) as load_scope:
            while not isinstance(frame := await _next(frames), Loaded):
                if isinstance(frame, LoadProgress):
                    self.progress = (frame.loaded, frame.total)
                    self.recorder.record("progress", f"loading {frame.loaded}/{frame.total}")
                    if self._on_phase is not None:
                        self._on_phase(self)
                else:
                    self._expect_while("loading", frame)
            self.context_length = frame.context_length
        if load_scope.cancelled_caught:
            self._deadline_fired("load_timeout", cfg.load_timeout)
            raise LoadTimeout(f"model not loaded within {cfg.load_timeout:g}s")
        self._transition("warming")
        warmed = await self._within(cfg.warmup_timeout, "warmup_timeout", WarmupTimeout, frames)
        if not isinstance(warmed, WarmedUp):
            raise ProtocolError(f"expected WarmedUp, got {type(warmed).__name__}")
        self._last_progress = trio.current_time()
        self._transition("ready", f"context {self.context_length}")
        log.info("runner %s#%d: ready", self.model_id, self.incarnation)

    async def _connect(self, frames: AsyncIterator[FromRunner], shard: ShardSpec) -> None:
        """Wait for the runner to join its compute group: ``GroupJoining`` then
        ``GroupJoined``, within ``shard.connect_timeout`` of ``Load``."""
        joining = False
        with trio.move_on_after(shard.connect_timeout):
            while True:
                try:
                    frame = await _next(frames)
                except RunnerCrashed:
                    raise await self._crashed_connecting(joining, shard) from None
                if isinstance(frame, GroupJoining):
                    joining = True
                    self.recorder.record("group", f"joining as rank {shard.rank} of {shard.world}")
                elif isinstance(frame, GroupJoined):
                    self.world = frame.world
                    self.recorder.record("group", f"joined: {frame.world} ranks")
                    return
                else:
                    self._expect_while("connecting", frame)
        self._deadline_fired("connect_timeout", shard.connect_timeout)
        hosts = ", ".join(shard.hosts)
        if joining:
            raise GroupConnectTimeout(
                f"rank {shard.rank}: the compute group ({hosts}) did not form within "
                f"{shard.connect_timeout:g}s",
                tail=self.output_tail,
            )
        raise GroupNotJoined(
            f"rank {shard.rank} did not start joining its compute group within "
            f"{shard.connect_timeout:g}s",
            tail=self.output_tail,
        )

    async def _crashed_connecting(self, joining: bool, shard: ShardSpec) -> RunnerError:
        """The runner exited while connecting: its own alarm (``SIGALRM``: the group did not
        form in time) or a crash."""
        assert self._proc is not None
        with trio.move_on_after(1):
            await self._proc.wait()
        if joining and self._proc.returncode == -signal.SIGALRM:
            return GroupConnectTimeout(
                f"rank {shard.rank}: the compute group did not form within "
                f"{shard.connect_timeout:g}s (the runner's own alarm)",
                tail=self.output_tail,
            )
        return RunnerCrashed("runner exited while joining its compute group", tail=self.output_tail)

    async def _within(
        self,
        seconds: float,
        name: str,
        error: type[RunnerError],
        frames: AsyncIterator[FromRunner],
    ) -> FromRunner:
        """The next frame other than a heartbeat, within ``seconds`` or ``error``."""
        with trio.move_on_after(seconds):
            while True:
                frame = await _next(frames)
                if not self._background(frame, LoadFailed):
                    return frame
        self._deadline_fired(name, seconds)
        raise error(f"nothing within {seconds:g}s ({name})")

    def _expect_while(self, phase: str, frame: FromRunner) -> None:
        if not self._background(frame, LoadFailed):
            raise ProtocolError(f"unexpected {type(frame).__name__} while {phase}")

    def _background(self, frame: FromRunner, failed: Callable[[str, str], RunnerError]) -> bool:
        """Handle a frame that may come at any time (heartbeat, engine stats, collective
        trace) and return True, or raise the failure a frame reports (``failed`` makes one for a
        ``RunnerFailed`` that is not a compute-group failure); False for any other frame."""
        if isinstance(frame, Heartbeat):
            self._heartbeat(frame)
        elif isinstance(frame, EngineStats):
            self._engine_stats = frame
        elif isinstance(frame, CollectiveTrace):
            self._trace(frame.entries, frame.dropped)
        elif isinstance(frame, CollectiveTimeout):
            self._trace(frame.recent, 0)
            self._deadline_fired("collective_timeout", frame.seconds)
            raise CollectiveTimedOut(
                f"{frame.collective} at step {frame.step} took > {frame.seconds:g}s",
                tail=self.output_tail,
            )
        elif isinstance(frame, RunnerFailed):
            self._leaving = True
            group_failure = GROUP_FAILURES.get(frame.reason)
            if group_failure is not None:
                raise group_failure(frame.message, tail=self.output_tail)
            failure = failed(frame.reason, frame.message)
            failure.tail = self.output_tail
            raise failure
        else:
            return False
        return True

    def _trace(self, entries: tuple[CollectiveEntry, ...], dropped: int) -> None:
        if dropped:
            self.recorder.record("collective", f"({dropped} routine entries left out)")
        for e in entries:  # recorded when they completed: a wait shows up after its cause
            detail = f"{e.collective} step {e.step} took {e.seconds * 1e3:.1f} ms"
            self.recorder.record("collective", f"{detail} {e.detail}".rstrip(), at=e.at + e.seconds)

    # ---- serving --------------------------------------------------------------------------

    async def _dispatch(self, frames: AsyncIterator[FromRunner]) -> None:
        async for frame in frames:
            self._last_progress = trio.current_time()
            if isinstance(frame, (TokenChunk, Finished, Tokenized, Embedded, RequestFailed)):
                self._deliver(frame)
            elif not self._background(frame, _crashed):
                raise ProtocolError(f"unexpected {type(frame).__name__} while serving")
            self._rearm()
        raise RunnerCrashed("runner closed its socket", tail=self.output_tail)

    def _deliver(self, frame: RequestEvent) -> None:
        rid = frame.request_id
        if isinstance(frame, Finished) and frame.end.finish_reason == "cancelled":
            # The runner answers every Cancel with exactly one Finished(cancelled): the end of
            # the request, or a bare acknowledgement when the request had already ended (it
            # finished or failed while the Cancel was on its way). Only that answer clears the
            # deadline, so an id is never reused while an answer for it may still arrive.
            self._cancel_deadlines.pop(rid, None)
        if rid not in self._inflight:
            return  # not ours (a late acknowledgement, a duplicate): ignore
        if isinstance(frame, TokenChunk):
            self._tokens_out += len(frame.token_ids)
            if not self._inflight[rid]:
                self._inflight[rid] = True
                self.recorder.record("request.first_token", request_id=rid)
        else:
            del self._inflight[rid]
            if isinstance(frame, Finished):
                if frame.end.finish_reason == "cancelled":
                    self._cancelled += 1
                detail = f"{frame.end.finish_reason}, {frame.end.usage.completion_tokens} tokens"
                self.recorder.record("request.finish", detail, rid)
            elif isinstance(frame, RequestFailed):
                self.recorder.record("request.fail", f"{frame.reason}: {frame.message}", rid)
            else:
                self.recorder.record("request.finish", type(frame).__name__.lower(), rid)
            if not self._inflight:
                self._transition("ready")
        send = self._requests.get(rid)
        if send is None:
            return  # the consumer left; its Cancel is on the way
        terminal = not isinstance(frame, TokenChunk)
        if not terminal and send.statistics().current_buffer_used >= REQUEST_BUFFER:
            # Never wait for one consumer: that would stall every request and the heartbeats.
            # The slot kept free for this says why the request ends.
            self.recorder.record("request.fail", "client_too_slow", rid)
            frame, terminal = _too_slow(rid), True
            if rid in self._inflight:
                self._spawn_cancel(rid)
        if terminal:
            del self._requests[rid]
        try:
            send.send_nowait(frame)
        except (trio.BrokenResourceError, trio.WouldBlock):
            pass  # its consumer left (a full channel here is impossible: one slot is kept)
        if terminal:
            send.close()

    def _forget(self, request_id: str) -> None:
        """Drop a request the runner never received."""
        if self._inflight.pop(request_id, None) is not None:
            self.recorder.record("request.fail", "never sent", request_id)
            if not self._inflight and self.phase == "busy":
                self._transition("ready")
            self._rearm()

    def _spawn_cancel(self, request_id: str) -> None:
        """Cancel from the dispatcher, which must not wait: a task in the run nursery sends it."""
        assert self._nursery is not None
        self._nursery.start_soon(self._cancel, request_id)

    async def _cancel(self, request_id: str) -> None:
        """Ask the runner to drop a request; it must acknowledge within ``cancel_timeout``."""
        self._cancel_deadlines[request_id] = trio.current_time() + self.config.cancel_timeout
        self.recorder.record("request.cancel", request_id=request_id)
        self._rearm()
        with trio.move_on_after(self.config.cancel_timeout, shield=True):
            try:
                await self._send(Cancel(request_id=request_id))
            except RunnerError:
                pass  # the runner is gone; run() reports why

    def _heartbeat(self, beat: Heartbeat) -> None:
        self._memory = (beat.rss_bytes, beat.mlx_active_bytes)
        if self._inflight:  # idle heartbeats would crowd the recorder out
            self.recorder.record(
                "heartbeat",
                f"#{beat.seq} rss {beat.rss_bytes >> 20} MiB, "
                f"mlx {beat.mlx_active_bytes >> 20} MiB",
            )

    # ---- the watchdog ---------------------------------------------------------------------

    def _rearm(self) -> None:
        """Point the watchdog at the earliest deadline now pending (progress, cancel acks)."""
        if self._watchdog is None:
            return
        deadline = math.inf
        if self._expects_progress() and self.config.progress_timeout > 0:
            deadline = self._last_progress + self.config.progress_timeout
        if self._cancel_deadlines:
            deadline = min(deadline, *self._cancel_deadlines.values())
        self._watchdog.deadline = deadline

    async def _watch(self) -> None:
        """Raise :class:`RunnerWedged` / :class:`CancelTimeout` when their deadline passes."""
        while True:
            with trio.CancelScope() as scope:
                self._watchdog = scope
                self._rearm()
                await trio.sleep_forever()
            self._watchdog = None
            now = trio.current_time()
            if self._excused != self._last_progress and (why := self._paused(now - scope.deadline)):
                self._excuse_pause(now, why)
                continue
            late = sorted(r for r, d in self._cancel_deadlines.items() if d <= now)
            if late:
                self._deadline_fired("cancel_timeout", self.config.cancel_timeout)
                raise CancelTimeout(
                    f"cancel of {late[0]} not acknowledged within {self.config.cancel_timeout:g}s",
                    tail=self.output_tail,
                )
            timeout = self.config.progress_timeout
            if self._expects_progress() and timeout > 0 and now >= self._last_progress + timeout:
                self._deadline_fired("progress_timeout", timeout)
                what = (
                    f"{len(self._inflight)} request(s) active"
                    if self._inflight
                    else f"rank {self.shard.rank if self.shard else 0} of a sharded instance"
                )
                raise RunnerWedged(
                    f"{what} and nothing from the runner for {timeout:g}s",
                    tail=self.output_tail,
                )
            # The deadline moved after it passed: re-arm and keep watching.

    def _paused(self, overslept: float) -> str:
        """Why the silence the watchdog woke to (``overslept`` seconds after its deadline) is
        this node's own, or ``""`` (see :data:`PAUSE_SLACK`)."""
        unread = 0
        if self._stream is not None:
            try:
                raw = fcntl.ioctl(self._stream.socket.fileno(), termios.FIONREAD, b"\0" * 4)
                unread = int.from_bytes(raw, sys.byteorder)
            except OSError:
                pass
        if unread:
            return f"{unread} bytes from the runner not read yet"
        if overslept > PAUSE_SLACK:
            return f"the watchdog woke {overslept:.1f}s after its deadline"
        return ""

    def _excuse_pause(self, now: float, why: str) -> None:
        """This node was not running on time (``why``): restart the progress window and the
        cancel deadlines from now instead of failing the runner."""
        self.recorder.record("paused", f"this node was paused: {why}; its deadlines restart")
        log.warning(
            "runner %s#%d: this node was paused or starved (%s): not blaming the runner",
            self.model_id,
            self.incarnation,
            why,
        )
        self._last_progress = self._excused = now
        for request_id in self._cancel_deadlines:
            self._cancel_deadlines[request_id] = now + self.config.cancel_timeout

    def _expects_progress(self) -> bool:
        """Whether the runner must be heard from within the progress deadline: while it works
        on requests, and always for a rank of a sharded instance (its loop never stops)."""
        return bool(self._inflight) or self.shard is not None

    def _deadline_fired(self, name: str, seconds: float) -> None:
        self.recorder.record("deadline", f"{name} ({seconds:g}s)")
        self.recorder.dump(log, f"runner {self.model_id}#{self.incarnation}: {name} fired")

    # ---- I/O ------------------------------------------------------------------------------

    async def _frames(self, stream: trio.SocketStream) -> AsyncIterator[FromRunner]:
        reader = FrameReader(FROM_RUNNER)
        while True:
            try:
                data = await stream.receive_some(1 << 16)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                return
            try:
                batch = reader.feed(data)
            except WireError as exc:
                raise ProtocolError(f"bad frame from runner: {exc}") from exc
            for frame in batch:
                yield frame

    async def _send(self, frame: ToRunner) -> None:
        await self._send_bytes(TO_RUNNER.pack(frame))

    async def _send_bytes(self, data: bytes) -> None:
        """Send one packed frame, whole. Shielded: a frame cut off by a cancellation would leave
        the stream mid-frame and the runner would read garbage, failing every request. The wait
        is bounded all the same: a runner that stops reading stops beating too, the watchdog
        fails it, and closing its socket ends this send with :class:`RunnerCrashed`."""
        assert self._stream is not None
        with trio.CancelScope(shield=True):
            async with self._send_lock:
                try:
                    await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise RunnerCrashed(f"runner socket closed: {exc}") from exc

    async def _drain(self, pipe: trio.abc.ReceiveStream) -> None:
        """Copy the runner's output into the node log, keeping a short tail for diagnostics."""
        pending = b""
        async for data in pipe:
            pending += data
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                self._log_line(raw)
            if len(pending) > 8192:
                self._log_line(pending)
                pending = b""
        if pending:
            self._log_line(pending)

    def _log_line(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip()[:2000]
        self._tail.append(line)
        log.info("runner %s#%d[%s]: %s", self.model_id, self.incarnation, self._pid, line)

    async def _stop(self, proc: trio.Process) -> None:
        """Fail open requests at once, then terminate the process group and reap it.

        A serving rank of a sharded instance is first asked to ``Shutdown`` and given
        ``shutdown_grace`` to exit by itself: rank 0 then ends the whole compute group cleanly
        (the other ranks report ``group_stopped`` instead of a lost peer). A runner that
        reported its own failure (``RunnerFailed``: ``group_stopped`` among them) exits right
        after it, so it too is given ``shutdown_grace`` before any signal."""
        graceful = self.shard is not None and self.phase in ("ready", "busy")
        if self.phase != "failed":
            self._transition("stopping")
        bound = (3 if graceful or self._leaving else 2) * self.config.shutdown_grace + 1
        with trio.move_on_after(bound, shield=True):
            why = self.failure.reason if self.failure else "runner_stopped"
            for rid in self._inflight:
                self.recorder.record("request.fail", why, rid)
            for send in self._requests.values():
                send.close()
            self._requests.clear()
            self._inflight.clear()
            self._cancel_deadlines.clear()
            if graceful:
                with trio.move_on_after(self.config.shutdown_grace):
                    try:
                        await self._send(Shutdown())
                    except RunnerError:
                        pass  # gone already
                    await proc.wait()
            elif self._leaving:
                with trio.move_on_after(self.config.shutdown_grace):
                    await proc.wait()
            if self._stream is not None:
                await self._stream.aclose()
            await terminate_group(
                proc,
                self.config.shutdown_grace,
                lambda sig: self.recorder.record("signal", f"{sig.name} to group {proc.pid}"),
            )
        self._exit_code = proc.returncode
        self.recorder.record("exit", f"code {proc.returncode}")
        if self.phase != "failed":
            self._transition("stopped")
        log.info("runner %s#%d: exited with %s", self.model_id, self.incarnation, proc.returncode)


def _crashed(reason: str, message: str) -> RunnerError:
    return RunnerCrashed(f"{reason}: {message}")


def _too_slow(request_id: str) -> RequestFailed:
    return RequestFailed(
        request_id,
        "client_too_slow",
        f"the client fell {REQUEST_BUFFER} chunks behind the runner; the request was cancelled",
    )


async def _next(frames: AsyncIterator[FromRunner]) -> FromRunner:
    try:
        return await frames.__anext__()
    except StopAsyncIteration:
        raise RunnerCrashed("runner exited before it was ready") from None


def _encode_generate(frame: Generate | Tokenize | Embed) -> bytes:
    """``frame`` packed for the runner, or :class:`RequestRejected` saying why it cannot be."""
    try:
        return TO_RUNNER.pack(frame)
    except FrameTooLarge as exc:
        raise RequestRejected(
            "prompt_too_long",
            f"the request encodes to {exc.size} bytes; the runner link carries at most "
            f"{exc.limit} bytes per request",
        ) from None
    except WireError as exc:
        # The codec's message names the field; keep it printable whatever the field held.
        detail = str(exc).encode("utf-8", "backslashreplace").decode("utf-8")
        raise RequestRejected(
            "invalid_request", f"the request cannot be encoded: {detail}"
        ) from None
