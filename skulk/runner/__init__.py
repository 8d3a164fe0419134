"""Runners, node side: the :class:`Runner` that spawns and supervises one runner process.

The runner process itself is ``python -m skulk.engine`` (:mod:`skulk.engine`), which imports
mlx; this package never does. A :class:`Runner` owns its subprocess and every deadline on it
(hello, group connect, load, warm-up, per-step progress, shutdown grace), keeps its
:class:`FlightRecorder`, and turns the process's frames into per-request streams. Given a
:class:`~skulk.wire.runner.ShardSpec` it is one rank of a sharded (pipeline or tensor)
instance; :func:`open_local_group` runs all ranks of one on this machine (tests, benchmarks).
"""

from skulk.runner._blas import CPU_BLAS, CpuBlasUnavailable, openblas_library, preload_env
from skulk.runner._config import TRANSITIONS, Phase, RunnerConfig, RunnerStatistics
from skulk.runner._errors import (
    CancelTimeout,
    CollectiveFailed,
    CollectiveTimedOut,
    GroupConnectTimeout,
    GroupNotJoined,
    GroupStopped,
    HelloTimeout,
    LoadFailed,
    LoadTimeout,
    ProtocolError,
    RequestRejected,
    RunnerCrashed,
    RunnerError,
    RunnerPaused,
    RunnerWedged,
    WarmupTimeout,
)
from skulk.runner._group import terminate_group
from skulk.runner._local_group import (
    LocalGroup,
    even_layers,
    loopback_hosts,
    open_local_group,
    shard_specs,
)
from skulk.runner._process import Runner
from skulk.runner._produced import PRODUCED_FILE_ENV
from skulk.runner._recorder import FlightEvent, FlightRecorder
from skulk.runner._request_table import RequestEvent

__all__ = [
    "CPU_BLAS",
    "PRODUCED_FILE_ENV",
    "TRANSITIONS",
    "CancelTimeout",
    "CollectiveFailed",
    "CollectiveTimedOut",
    "CpuBlasUnavailable",
    "FlightEvent",
    "FlightRecorder",
    "GroupConnectTimeout",
    "GroupNotJoined",
    "GroupStopped",
    "HelloTimeout",
    "LoadFailed",
    "LoadTimeout",
    "LocalGroup",
    "Phase",
    "ProtocolError",
    "RequestEvent",
    "RequestRejected",
    "Runner",
    "RunnerConfig",
    "RunnerCrashed",
    "RunnerError",
    "RunnerPaused",
    "RunnerStatistics",
    "RunnerWedged",
    "WarmupTimeout",
    "even_layers",
    "loopback_hosts",
    "open_local_group",
    "openblas_library",
    "preload_env",
    "shard_specs",
    "terminate_group",
]
