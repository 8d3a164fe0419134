"""Typed runner failures. ``reason`` is a stable snake_case name shown to operators and clients."""

from __future__ import annotations


class RunnerError(Exception):
    """The runner process failed; ``retryable`` says whether relaunching could help."""

    reason = "runner_failed"
    retryable = True

    def __init__(self, message: str, *, tail: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.tail = tail

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


class HelloTimeout(RunnerError):
    reason = "hello_timeout"


class LoadTimeout(RunnerError):
    reason = "load_timeout"


class LoadFailed(RunnerError):
    """The runner reported it cannot load the model (``reason`` comes from the runner)."""

    def __init__(self, reason: str, message: str, *, tail: tuple[str, ...] = ()) -> None:
        super().__init__(message, tail=tail)
        self.reason = reason
        self.retryable = reason not in NON_RETRYABLE_LOAD_FAILURES


NON_RETRYABLE_LOAD_FAILURES = frozenset({"model_not_found", "out_of_memory"})


class RunnerCrashed(RunnerError):
    reason = "runner_crashed"


class ProtocolError(RunnerError):
    reason = "protocol_error"
