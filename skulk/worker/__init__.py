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
from skulk.worker._reconciler import Assignment, Reconciler, phase_of

__all__ = [
    "CRASH_LOOP_COOLDOWN",
    "RUNNER_RESTARTS",
    "Assignment",
    "Generation",
    "ModelService",
    "ModelStatus",
    "ModelUnavailable",
    "Reconciler",
    "RequestFailure",
    "phase_of",
]
