"""Node-local serving: keeps the runners this node should run alive and admits requests."""

from skulk.worker._model_service import (
    CRASH_LOOP_COOLDOWN,
    RUNNER_RESTARTS,
    Embedding,
    ModelService,
    ModelStatus,
    ModelUnavailable,
    RequestFailure,
    ServiceStatistics,
)
from skulk.worker._models import (
    FetchWhole,
    HubAccess,
    ModelDuties,
    SpreadProgress,
    failure_of,
    local_card,
    store_reading,
)
from skulk.worker._reconciler import Assignment, Reconciler, phase_of
from skulk.worker._scored import ScoredText, join_scored, logprobs_of
from skulk.worker._serving import ServingSampler

__all__ = [
    "CRASH_LOOP_COOLDOWN",
    "RUNNER_RESTARTS",
    "Assignment",
    "Embedding",
    "FetchWhole",
    "HubAccess",
    "ModelDuties",
    "ModelService",
    "ModelStatus",
    "ModelUnavailable",
    "Reconciler",
    "RequestFailure",
    "ScoredText",
    "ServiceStatistics",
    "ServingSampler",
    "SpreadProgress",
    "failure_of",
    "join_scored",
    "local_card",
    "logprobs_of",
    "phase_of",
    "store_reading",
]
