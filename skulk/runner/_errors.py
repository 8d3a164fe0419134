"""Typed runner failures. ``reason`` is a stable snake_case name shown to operators and clients."""

from __future__ import annotations


class RunnerError(Exception):
    """A typed failure of a runner or of one request on it; ``retryable`` says whether
    relaunching (or retrying) could help. All but :class:`RequestRejected` mean the runner
    process failed."""

    reason = "runner_failed"
    retryable = True

    def __init__(self, message: str, *, tail: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.tail = tail

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class HelloTimeout(RunnerError):
    """The runner did not say hello within ``hello_timeout`` of being spawned."""

    reason = "hello_timeout"


class LoadTimeout(RunnerError):
    """The model was not loaded within ``load_timeout``."""

    reason = "load_timeout"


class WarmupTimeout(RunnerError):
    """The warm-up generation did not finish within ``warmup_timeout``."""

    reason = "warmup_timeout"


class RunnerWedged(RunnerError):
    """A request was active and the runner sent nothing — no token, no heartbeat — for
    ``progress_timeout``."""

    reason = "runner_wedged"


class CancelTimeout(RunnerError):
    """A cancelled request was not acknowledged within ``cancel_timeout``."""

    reason = "cancel_timeout"


class LoadFailed(RunnerError):
    """The runner reported it cannot load the model (``reason`` comes from the runner)."""

    def __init__(self, reason: str, message: str, *, tail: tuple[str, ...] = ()) -> None:
        super().__init__(message, tail=tail)
        self.reason = reason
        self.retryable = reason not in NON_RETRYABLE_LOAD_FAILURES


#: Load failures that relaunching cannot fix. A rank of a sharded instance is never relaunched
#: on its own anyway (the leader re-places the whole instance); these say why.
NON_RETRYABLE_LOAD_FAILURES = frozenset(
    {"model_not_found", "out_of_memory", "unsupported_sharding", "group_connect_failed"}
)


class RunnerCrashed(RunnerError):
    """The runner process exited or closed its socket while it was needed."""

    reason = "runner_crashed"


class ProtocolError(RunnerError):
    """The runner sent something the protocol does not allow."""

    reason = "protocol_error"


class RequestRejected(RunnerError):
    """The node refused to send a request to its runner; only that request fails, the runner
    and its other requests are untouched. ``reason`` is ``invalid_request`` (a field the frame
    codec cannot carry: a string with a lone surrogate, a NaN or infinite number) or
    ``prompt_too_long`` (the request would exceed the runner link's frame limit)."""

    retryable = False

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# ---- a rank of a sharded instance -----------------------------------------------------------
# None of these is retryable: a rank is never relaunched on its own, the leader re-places the
# whole instance.


class GroupConnectTimeout(RunnerError):
    """The rank announced it was joining its compute group, and the group was not formed
    within ``ShardSpec.connect_timeout`` (a peer never came, or came too late)."""

    reason = "group_connect_timeout"
    retryable = False


class GroupNotJoined(RunnerError):
    """The rank never even started joining its compute group within
    ``ShardSpec.connect_timeout`` (it hung before: a stuck load of the model's config, a fault
    hook)."""

    reason = "group_not_joined"
    retryable = False


class CollectiveTimedOut(RunnerError):
    """One distributed evaluation of the rank did not complete within
    ``ShardSpec.collective_timeout``: a peer is stopped, wedged or unreachable. The message
    names the collective and the lockstep step (``all_sum(control) at step 57 took > 10s``)."""

    reason = "collective_timeout"
    retryable = False


class CollectiveFailed(RunnerError):
    """A distributed evaluation of the rank failed: a peer's connection was lost (a peer
    process died; the ring backend notices at once, without waiting for a deadline)."""

    reason = "collective_failed"
    retryable = False


class RunnerPaused(RunnerError):
    """The rank's process was stopped by a signal (SIGSTOP, a debugger) for its pause deadline
    (see :mod:`skulk.runner._pause`): it stalls its whole compute group, and it is the culprit
    its peers cannot name."""

    reason = "runner_paused"
    retryable = False


class GroupStopped(RunnerError):
    """Rank 0 ended the compute group (its node stopped the instance's rank 0), so this rank
    exited with it."""

    reason = "group_stopped"
    retryable = False


#: ``RunnerFailed`` reasons that are failures of the compute group, with their error types.
GROUP_FAILURES: dict[str, type[RunnerError]] = {
    CollectiveFailed.reason: CollectiveFailed,
    GroupStopped.reason: GroupStopped,
}
