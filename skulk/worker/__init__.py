"""Node-local serving: keeps the runners this node should run alive and admits requests."""

from skulk.worker._model_service import (
    CRASH_LOOP_COOLDOWN,
    RUNNER_RESTARTS,
    Generation,
    ModelService,
    ModelStatus,
    ModelUnavailable,
    RequestFailure,
)

__all__ = [
    "CRASH_LOOP_COOLDOWN",
    "RUNNER_RESTARTS",
    "Generation",
    "ModelService",
    "ModelStatus",
    "ModelUnavailable",
    "RequestFailure",
]
