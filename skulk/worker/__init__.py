"""Node-local serving: keeps the runners this node should run alive and admits requests."""

from skulk.worker._model_service import (
    RUNNER_RESTARTS,
    Generation,
    ModelService,
    ModelStatus,
    ModelUnavailable,
    RequestFailure,
)

__all__ = [
    "RUNNER_RESTARTS",
    "Generation",
    "ModelService",
    "ModelStatus",
    "ModelUnavailable",
    "RequestFailure",
]
