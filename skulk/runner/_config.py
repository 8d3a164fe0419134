"""A runner's settings, lifecycle table and statistics record (plain data, no I/O)."""

from __future__ import annotations

import sys
from typing import Literal

import attrs

Phase = Literal[
    "spawning", "connecting", "loading", "warming", "ready", "busy", "stopping", "stopped", "failed"
]

#: The lifecycle as data: the phases each phase may move to. ``connecting`` (forming the
#: compute group) comes only for a rank of a sharded instance.
TRANSITIONS: dict[Phase, frozenset[Phase]] = {
    "spawning": frozenset({"connecting", "loading", "stopping", "failed"}),
    "connecting": frozenset({"loading", "stopping", "failed"}),
    "loading": frozenset({"warming", "stopping", "failed"}),
    "warming": frozenset({"ready", "stopping", "failed"}),
    "ready": frozenset({"busy", "stopping", "failed"}),
    "busy": frozenset({"ready", "stopping", "failed"}),
    "stopping": frozenset({"stopped", "failed"}),
    "stopped": frozenset(),
    "failed": frozenset(),
}


@attrs.frozen
class RunnerConfig:
    """Deadlines (seconds) and settings of one runner process.

    ``progress_timeout = 0`` disables the progress deadline (a wedged runner then hangs its
    requests: only for experiments). ``rank_pause_timeout``: how long the process of a rank of a
    sharded instance may be stopped by a signal before the rank fails ``runner_paused`` (kept
    under half the collective deadline; ``0`` disables; see :mod:`skulk.runner._pause`).
    ``preload``: a shared library the runner process preloads (``LD_PRELOAD``): the OpenBLAS
    of ``--cpu-blas openblas`` (see :mod:`skulk.runner._blas`), ``""`` for none. ``faults`` is
    a fault-hook spec (see :mod:`skulk.engine.faults`), empty in production. ``kv_cache_bytes``,
    ``prefix_cache_bytes``, ``kv_waiting`` and ``speculative_tokens`` go to the runner in its
    ``Load`` (``None``: the runner's defaults; see :class:`~skulk.wire.runner.Load`).
    """

    hello_timeout: float = 30.0
    load_timeout: float = 600.0
    warmup_timeout: float = 60.0
    progress_timeout: float = 30.0
    cancel_timeout: float = 5.0
    shutdown_grace: float = 5.0
    heartbeat_interval: float = 1.0
    rank_pause_timeout: float = 3.0
    faults: str = ""
    preload: str = ""
    python: str = sys.executable
    kv_cache_bytes: int | None = None
    prefix_cache_bytes: int | None = None
    kv_waiting: int = 64
    speculative_tokens: int | None = None

    def deadlines(self) -> dict[str, float]:
        return {
            "hello_timeout": self.hello_timeout,
            "load_timeout": self.load_timeout,
            "warmup_timeout": self.warmup_timeout,
            "progress_timeout": self.progress_timeout,
            "cancel_timeout": self.cancel_timeout,
            "shutdown_grace": self.shutdown_grace,
            "rank_pause_timeout": self.rank_pause_timeout,
        }


@attrs.frozen
class RunnerStatistics:
    """A runner at one moment (:meth:`Runner.statistics`). ``active_requests``: requests the
    runner still works on; ``cancels_pending``: Cancels it has not answered yet; ``rss_bytes``
    and ``mlx_active_bytes`` come from its last heartbeat."""

    incarnation: int
    phase: Phase
    pid: int | None
    loaded: int
    total: int
    active_requests: int
    cancels_pending: int
    tokens_out: int
    cancelled: int
    rss_bytes: int | None
    mlx_active_bytes: int | None
    exit_code: int | None
    failure: str | None
