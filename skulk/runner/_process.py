"""Parent side of a runner: owns one ``python -m skulk.runner`` subprocess.

:meth:`Runner.run` spawns the process in its own process group, waits for ``Hello`` and for the
model to load (each under a deadline), then dispatches the runner's frames to the requests
waiting for them until the process exits or the caller cancels. However ``run`` ends — success,
failure or cancellation — the whole process group is terminated (SIGTERM, a grace period, then
SIGKILL) and reaped, and every open request's channel is closed so no caller waits on a runner
that is gone.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Literal

import attrs
import trio

from skulk.runner._errors import (
    HelloTimeout,
    LoadFailed,
    LoadTimeout,
    ProtocolError,
    RunnerCrashed,
    RunnerError,
)
from skulk.runner.protocol import FROM_RUNNER, TO_RUNNER
from skulk.wire import FrameReader, WireError
from skulk.wire.runner import (
    PROTOCOL_VERSION,
    Cancel,
    Finished,
    FromRunner,
    Generate,
    Heartbeat,
    Hello,
    Load,
    Loaded,
    LoadProgress,
    Prompt,
    RequestFailed,
    RunnerFailed,
    SamplingParams,
    TokenChunk,
    ToRunner,
)

log = logging.getLogger("skulk.runner")

RequestEvent = TokenChunk | Finished | RequestFailed
Phase = Literal["spawning", "loading", "ready", "stopping", "stopped", "failed"]

#: Events buffered per request before the runner's reader waits for that request's consumer.
REQUEST_BUFFER = 1024
TAIL_LINES = 64


@attrs.frozen
class RunnerConfig:
    """Deadlines (seconds) and limits of one runner process."""

    hello_timeout: float = 30.0
    load_timeout: float = 600.0
    shutdown_grace: float = 5.0
    cancel_send_timeout: float = 1.0
    python: str = sys.executable


@attrs.frozen
class RunnerStatistics:
    phase: Phase
    pid: int | None
    loaded: int
    total: int
    active_requests: int
    tokens_out: int
    cancelled: int
    exit_code: int | None
    failure: str | None


class Runner:
    """One runner subprocess serving one model. Create it, then ``await nursery.start(r.run)``
    (``start`` returns once the model is loaded) and use :meth:`open_request`."""

    def __init__(
        self,
        model_id: str,
        model_path: str,
        config: RunnerConfig | None = None,
        *,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        self.model_id = model_id
        self.model_path = model_path
        self.config = config or RunnerConfig()
        self.phase: Phase = "spawning"
        self.failure: RunnerError | None = None
        self.context_length = 0
        self._on_progress = on_progress
        self._progress = (0, 0)
        self._pid: int | None = None
        self._stream: trio.SocketStream | None = None
        self._send_lock = trio.Lock()
        self._requests: dict[str, trio.MemorySendChannel[RequestEvent]] = {}
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._tokens_out = 0
        self._cancelled = 0
        self._exit_code: int | None = None

    # ---- public ---------------------------------------------------------------------------

    def statistics(self) -> RunnerStatistics:
        return RunnerStatistics(
            phase=self.phase,
            pid=self._pid,
            loaded=self._progress[0],
            total=self._progress[1],
            active_requests=len(self._requests),
            tokens_out=self._tokens_out,
            cancelled=self._cancelled,
            exit_code=self._exit_code,
            failure=str(self.failure) if self.failure else None,
        )

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
        (client gone, cancellation) sends ``Cancel`` to the runner.
        """
        if self.phase != "ready":
            raise RunnerCrashed(f"runner is {self.phase}")
        if request_id in self._requests:
            raise ValueError(f"request id {request_id!r} already active")
        send, receive = trio.open_memory_channel[RequestEvent](REQUEST_BUFFER)
        self._requests[request_id] = send
        try:
            await self._send(Generate(request_id=request_id, prompt=prompt, params=params))
            async with receive:
                yield receive
        finally:
            # Still registered ⇒ the runner has not finished it: stop the work there.
            if self._requests.pop(request_id, None) is not None:
                send.close()
                if self.phase == "ready":
                    with trio.move_on_after(self.config.cancel_send_timeout, shield=True):
                        try:
                            await self._send(Cancel(request_id=request_id))
                        except RunnerError:
                            pass  # the runner is gone; nothing left to cancel

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Spawn, load, then serve until the process exits (raises) or we are cancelled."""
        parent_sock, child_sock = socket.socketpair()
        try:
            proc = await trio.lowlevel.open_process(
                [self.config.python, "-m", "skulk.runner", "--fd", str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),),
                start_new_session=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        finally:
            child_sock.close()
        self._pid = proc.pid
        self._stream = trio.SocketStream(trio.socket.from_stdlib_socket(parent_sock))
        log.info("runner %s: started pid %d for %s", self.model_id, proc.pid, self.model_path)
        try:
            try:
                async with trio.open_nursery() as nursery:
                    assert proc.stdout is not None and proc.stderr is not None
                    nursery.start_soon(self._drain, proc.stdout)
                    nursery.start_soon(self._drain, proc.stderr)
                    frames = self._frames(self._stream)
                    await self._handshake(frames)
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
        except BaseException:
            if self.phase != "failed":
                self.phase = "stopping"
            raise
        finally:
            await self._stop(proc)

    # ---- internals ------------------------------------------------------------------------

    async def _handshake(self, frames: AsyncIterator[FromRunner]) -> None:
        with trio.move_on_after(self.config.hello_timeout) as hello_scope:
            hello = await _next(frames)
        if hello_scope.cancelled_caught:
            raise HelloTimeout(
                f"no hello within {self.config.hello_timeout:g}s", tail=self.output_tail
            )
        if not isinstance(hello, Hello):
            raise ProtocolError(f"expected Hello, got {type(hello).__name__}")
        if hello.protocol_version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"runner speaks protocol {hello.protocol_version}, node {PROTOCOL_VERSION}"
            )
        self.phase = "loading"
        await self._send(Load(model_path=self.model_path, model_id=self.model_id))
        with trio.move_on_after(self.config.load_timeout) as load_scope:
            while True:
                frame = await _next(frames)
                if isinstance(frame, LoadProgress):
                    self._progress = (frame.loaded, frame.total)
                    if self._on_progress is not None:
                        self._on_progress(frame.loaded, frame.total)
                elif isinstance(frame, Loaded):
                    self.context_length = frame.context_length
                    break
                elif isinstance(frame, RunnerFailed):
                    raise LoadFailed(frame.reason, frame.message, tail=self.output_tail)
                elif not isinstance(frame, Heartbeat):
                    raise ProtocolError(f"unexpected {type(frame).__name__} while loading")
        if load_scope.cancelled_caught:
            raise LoadTimeout(
                f"model not loaded within {self.config.load_timeout:g}s", tail=self.output_tail
            )
        self.phase = "ready"
        log.info("runner %s: ready (context %d)", self.model_id, self.context_length)

    async def _dispatch(self, frames: AsyncIterator[FromRunner]) -> None:
        async for frame in frames:
            if isinstance(frame, (TokenChunk, Finished, RequestFailed)):
                if isinstance(frame, Finished) and frame.finish_reason == "cancelled":
                    self._cancelled += 1
                send = self._requests.get(frame.request_id)
                if send is None:
                    continue  # the request was abandoned; its Cancel is on the way
                if isinstance(frame, TokenChunk):
                    self._tokens_out += len(frame.token_ids)
                else:
                    del self._requests[frame.request_id]
                try:
                    await send.send(frame)
                except trio.BrokenResourceError:
                    pass  # its consumer left
                if not isinstance(frame, TokenChunk):
                    send.close()
            elif isinstance(frame, RunnerFailed):
                raise RunnerCrashed(f"{frame.reason}: {frame.message}", tail=self.output_tail)
            elif not isinstance(frame, Heartbeat):
                raise ProtocolError(f"unexpected {type(frame).__name__} while serving")
        raise RunnerCrashed("runner closed its socket", tail=self.output_tail)

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
        assert self._stream is not None
        async with self._send_lock:
            try:
                await self._stream.send_all(TO_RUNNER.pack(frame))
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
        log.info("runner %s[%s]: %s", self.model_id, self._pid, line)

    def _fail(self, exc: RunnerError) -> None:
        if not exc.tail:
            exc.tail = self.output_tail
        self.failure = exc
        self.phase = "failed"
        log.error("runner %s failed: %s", self.model_id, exc)

    async def _stop(self, proc: trio.Process) -> None:
        """Terminate the process group within the grace period, reap it, fail open requests."""
        with trio.move_on_after(2 * self.config.shutdown_grace + 1, shield=True):
            for send in self._requests.values():
                send.close()
            self._requests.clear()
            if self._stream is not None:
                await self._stream.aclose()
            await terminate_group(proc, self.config.shutdown_grace)
        self._exit_code = proc.returncode
        if self.phase != "failed":
            self.phase = "stopped"
        log.info("runner %s: pid %d exited with %s", self.model_id, proc.pid, proc.returncode)


async def terminate_group(proc: trio.Process, grace: float) -> None:
    """SIGTERM the process group, wait up to ``grace``, then SIGKILL the group and reap."""
    if proc.returncode is None:
        _killpg(proc.pid, signal.SIGTERM)
        with trio.move_on_after(grace):
            await proc.wait()
    # Also when the leader is gone already: a grandchild may still hold the group.
    _killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


def _killpg(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


async def _next(frames: AsyncIterator[FromRunner]) -> FromRunner:
    try:
        return await frames.__anext__()
    except StopAsyncIteration:
        raise RunnerCrashed("runner exited before it was ready") from None
