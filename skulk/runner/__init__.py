"""Runner subprocesses: the node-side :class:`Runner` and the typed failures it raises.

The runner process itself is ``python -m skulk.runner`` (see ``_child.py``); its engine imports
mlx and is never imported by the node.
"""

from skulk.runner._errors import (
    HelloTimeout,
    LoadFailed,
    LoadTimeout,
    ProtocolError,
    RunnerCrashed,
    RunnerError,
)
from skulk.runner._process import (
    RequestEvent,
    Runner,
    RunnerConfig,
    RunnerStatistics,
    terminate_group,
)

__all__ = [
    "HelloTimeout",
    "LoadFailed",
    "LoadTimeout",
    "ProtocolError",
    "RequestEvent",
    "Runner",
    "RunnerConfig",
    "RunnerCrashed",
    "RunnerError",
    "RunnerStatistics",
    "terminate_group",
]
