"""A runner's process group: spawned in a session of its own, and always ended whole.

:func:`spawn` starts ``python -m skulk.engine`` as the leader of a new process group (so that
its grandchildren can be signalled with it), with one end of a socketpair and its output piped.
:func:`reap` and :func:`terminate_group` end it: a polite way out first where there is one,
then SIGTERM to the group, a grace period, SIGKILL to the group — also when the leader is gone
already, since a grandchild may still hold the group — and the leader reaped.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Callable

import trio

from skulk.engine.faults import ENV as FAULTS_ENV
from skulk.runner._blas import preload_env
from skulk.runner._config import RunnerConfig
from skulk.runner._errors import RunnerError
from skulk.runner._link import RunnerLink
from skulk.wire.runner import Shutdown


async def spawn(config: RunnerConfig, incarnation: int, child_sock: socket.socket) -> trio.Process:
    """Start runner incarnation ``incarnation`` speaking over ``child_sock``, its stdout and
    stderr piped (they must be drained). Raises ``OSError`` when it cannot be started."""
    return await trio.lowlevel.open_process(
        [
            config.python,
            "-m",
            "skulk.engine",
            "--fd",
            str(child_sock.fileno()),
            "--parent-pid",
            str(os.getpid()),
            "--incarnation",
            str(incarnation),
            "--heartbeat-interval",
            str(config.heartbeat_interval),
            "--load-timeout",
            str(config.load_timeout),
        ],
        pass_fds=(child_sock.fileno(),),
        start_new_session=True,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=preload_env(
            config.preload, {**os.environ, "PYTHONUNBUFFERED": "1", FAULTS_ENV: config.faults}
        ),
    )


async def reap(
    proc: trio.Process,
    link: RunnerLink,
    grace: float,
    *,
    shutdown: bool,
    exiting: bool,
    on_signal: Callable[[signal.Signals], None],
) -> None:
    """End runner ``proc`` and its whole group, and reap it.

    ``shutdown``: ask it to ``Shutdown`` first, and give it ``grace`` to exit by itself (a
    serving rank of a sharded instance: rank 0 then ends the compute group cleanly). ``exiting``:
    it said it exits by itself (it reported its own failure); give it ``grace`` to. Then its
    socket is closed and the group terminated (:func:`terminate_group`, which calls
    ``on_signal`` for each signal sent). Takes at most ``3 * grace`` plus a little."""
    if shutdown:
        with trio.move_on_after(grace):
            try:
                await link.send(Shutdown())
            except RunnerError:
                pass  # gone already
            await proc.wait()
    elif exiting:
        with trio.move_on_after(grace):
            await proc.wait()
    await link.aclose()
    await terminate_group(proc, grace, on_signal)


async def terminate_group(
    proc: trio.Process,
    grace: float,
    on_signal: Callable[[signal.Signals], None] = lambda sig: None,
) -> None:
    """SIGTERM the process group, wait up to ``grace``, then SIGKILL the group and reap."""
    if proc.returncode is None:
        _killpg(proc.pid, signal.SIGTERM, on_signal)
        with trio.move_on_after(grace):
            await proc.wait()
    # Also when the leader is gone already: a grandchild may still hold the group.
    _killpg(proc.pid, signal.SIGKILL, on_signal if proc.returncode is None else lambda s: None)
    await proc.wait()


def _killpg(pgid: int, sig: signal.Signals, on_signal: Callable[[signal.Signals], None]) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return
    on_signal(sig)
