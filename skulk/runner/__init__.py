"""Runner subprocesses: the node-side :class:`Runner` and the typed failures it raises.

The runner process itself is ``python -m skulk.runner`` (see ``_child.py``); its engine imports
mlx and is never imported by the node.
"""

from skulk.runner._config import TRANSITIONS, Phase, RunnerConfig, RunnerStatistics
from skulk.runner._errors import (
    CancelTimeout,
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
from skulk.runner._process import RequestEvent, Runner
from skulk.runner._recorder import FlightEvent, FlightRecorder

__all__ = [
    "TRANSITIONS",
    "CancelTimeout",
    "FlightEvent",
    "FlightRecorder",
    "HelloTimeout",
    "LoadFailed",
    "LoadTimeout",
    "Phase",
    "ProtocolError",
    "RequestEvent",
    "RequestRejected",
    "Runner",
    "RunnerConfig",
    "RunnerCrashed",
    "RunnerError",
    "RunnerStatistics",
    "RunnerWedged",
    "WarmupTimeout",
    "terminate_group",
]
