"""A runner process's start, each step within its deadline and each failure typed.

::

    Hello            within hello_timeout of the spawn             else HelloTimeout
    Load →
    [GroupJoining, GroupJoined   within shard.connect_timeout     else GroupNotJoined /
                                                                        GroupConnectTimeout]
    LoadProgress* , Loaded       within load_timeout              else LoadTimeout
    WarmedUp                     within warmup_timeout            else WarmupTimeout

Heartbeats and the other background frames may come in between (:meth:`FramePump.background`);
a ``RunnerFailed`` now is :class:`LoadFailed` with the runner's reason; any other frame, or a
Hello of another protocol version, is a :class:`ProtocolError`. A runner that exits before it
is ready is :class:`RunnerCrashed` — unless a rank exits by its own alarm (``SIGALRM``) while
its compute group forms, which is :class:`GroupConnectTimeout` too.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import AsyncIterator

import trio

from skulk.runner._config import RunnerConfig
from skulk.runner._errors import (
    GroupConnectTimeout,
    GroupNotJoined,
    HelloTimeout,
    LoadFailed,
    LoadTimeout,
    ProtocolError,
    RunnerCrashed,
    RunnerError,
    WarmupTimeout,
)
from skulk.runner._lifecycle import Lifecycle
from skulk.runner._link import RunnerLink
from skulk.runner._output import RunnerOutput
from skulk.runner._pump import FramePump
from skulk.runner._recorder import FlightRecorder, deadline_fired
from skulk.runner._watchdog import Watchdog
from skulk.wire.runner import (
    PROTOCOL_VERSION,
    FromRunner,
    GroupJoined,
    GroupJoining,
    Hello,
    Load,
    Loaded,
    LoadProgress,
    ShardSpec,
    WarmedUp,
)

log = logging.getLogger("skulk.runner")


class Startup:
    """Starts runner ``who`` (``runner MODEL#INCARNATION``) with ``load``; what it learns on
    the way (:attr:`world`, :attr:`context_length`) stays here."""

    def __init__(
        self,
        who: str,
        load: Load,
        config: RunnerConfig,
        lifecycle: Lifecycle,
        link: RunnerLink,
        pump: FramePump,
        watchdog: Watchdog,
        recorder: FlightRecorder,
        output: RunnerOutput,
    ) -> None:
        self._who = who
        self._load = load
        self._config = config
        self._lifecycle = lifecycle
        self._link = link
        self._pump = pump
        self._watchdog = watchdog
        self._recorder = recorder
        self._output = output
        #: The compute group's size, once joined (a rank of a sharded instance).
        self.world: int | None = None
        self.context_length = 0

    async def run(self, frames: AsyncIterator[FromRunner], proc: trio.Process) -> None:
        """Take the runner ``proc`` (its ``frames``) from ``spawning`` to ``ready``."""
        cfg = self._config
        hello = await self._within(cfg.hello_timeout, "hello_timeout", HelloTimeout, frames)
        if not isinstance(hello, Hello):
            raise ProtocolError(f"expected Hello, got {type(hello).__name__}")
        if hello.protocol_version != PROTOCOL_VERSION:
            raise ProtocolError(
                f"runner speaks protocol {hello.protocol_version}, node {PROTOCOL_VERSION}"
            )
        shard = self._load.shard
        if shard is None:
            self._lifecycle.move("loading")
            await self._link.send(self._load)
        else:
            self._lifecycle.move("connecting")
            await self._link.send(self._load)
            await self._connect(frames, shard, proc)
            self._lifecycle.move("loading")
        with trio.move_on_after(cfg.load_timeout) as load_scope:
            while not isinstance(frame := await _next(frames), Loaded):
                if isinstance(frame, LoadProgress):
                    self._lifecycle.loading(frame.loaded, frame.total)
                else:
                    self._expect_while("loading", frame)
            self.context_length = frame.context_length
        if load_scope.cancelled_caught:
            deadline_fired(self._recorder, self._who, "load_timeout", cfg.load_timeout)
            raise LoadTimeout(f"model not loaded within {cfg.load_timeout:g}s")
        self._lifecycle.move("warming")
        warmed = await self._within(cfg.warmup_timeout, "warmup_timeout", WarmupTimeout, frames)
        if not isinstance(warmed, WarmedUp):
            raise ProtocolError(f"expected WarmedUp, got {type(warmed).__name__}")
        self._watchdog.heard()
        self._lifecycle.move("ready", f"context {self.context_length}")
        log.info("%s: ready", self._who)

    async def _connect(
        self, frames: AsyncIterator[FromRunner], shard: ShardSpec, proc: trio.Process
    ) -> None:
        """Wait for the runner to join its compute group: ``GroupJoining`` then
        ``GroupJoined``, within ``shard.connect_timeout`` of ``Load``."""
        joining = False
        with trio.move_on_after(shard.connect_timeout):
            while True:
                try:
                    frame = await _next(frames)
                except RunnerCrashed:
                    raise await self._crashed_connecting(joining, shard, proc) from None
                if isinstance(frame, GroupJoining):
                    joining = True
                    self._recorder.record("group", f"joining as rank {shard.rank} of {shard.world}")
                elif isinstance(frame, GroupJoined):
                    self.world = frame.world
                    self._recorder.record("group", f"joined: {frame.world} ranks")
                    return
                else:
                    self._expect_while("connecting", frame)
        deadline_fired(self._recorder, self._who, "connect_timeout", shard.connect_timeout)
        hosts = ", ".join(shard.hosts)
        if joining:
            raise GroupConnectTimeout(
                f"rank {shard.rank}: the compute group ({hosts}) did not form within "
                f"{shard.connect_timeout:g}s",
                tail=self._output.tail,
            )
        raise GroupNotJoined(
            f"rank {shard.rank} did not start joining its compute group within "
            f"{shard.connect_timeout:g}s",
            tail=self._output.tail,
        )

    async def _crashed_connecting(
        self, joining: bool, shard: ShardSpec, proc: trio.Process
    ) -> RunnerError:
        """The runner exited while connecting: its own alarm (``SIGALRM``: the group did not
        form in time) or a crash."""
        with trio.move_on_after(1):
            await proc.wait()
        if joining and proc.returncode == -signal.SIGALRM:
            return GroupConnectTimeout(
                f"rank {shard.rank}: the compute group did not form within "
                f"{shard.connect_timeout:g}s (the runner's own alarm)",
                tail=self._output.tail,
            )
        return RunnerCrashed(
            "runner exited while joining its compute group", tail=self._output.tail
        )

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
                if not self._pump.background(frame, LoadFailed):
                    return frame
        deadline_fired(self._recorder, self._who, name, seconds)
        raise error(f"nothing within {seconds:g}s ({name})")

    def _expect_while(self, phase: str, frame: FromRunner) -> None:
        if not self._pump.background(frame, LoadFailed):
            raise ProtocolError(f"unexpected {type(frame).__name__} while {phase}")


async def _next(frames: AsyncIterator[FromRunner]) -> FromRunner:
    try:
        return await frames.__anext__()
    except StopAsyncIteration:
        raise RunnerCrashed("runner exited before it was ready") from None
