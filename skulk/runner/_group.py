"""Ending a runner's whole process group: SIGTERM, a grace period, SIGKILL, reap."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

import trio


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
