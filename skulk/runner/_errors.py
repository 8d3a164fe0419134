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


#: Load failures that relaunching cannot fix.
NON_RETRYABLE_LOAD_FAILURES = frozenset({"model_not_found", "out_of_memory"})


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
