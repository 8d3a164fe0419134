"""The serving node's admission bound: at most ``max_in_flight`` requests per instance.

Local and routed requests alike go through :meth:`Admission.admit`; beyond the bound a request
is refused at once with :class:`Overloaded` (the API answers 429 with ``Retry-After``) rather
than queued without limit in front of a runner.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

#: What a refused client is told to wait before it tries again (seconds).
RETRY_AFTER = 1.0


class Overloaded(Exception):
    """The instance has ``max_in_flight`` requests already; try again in ``retry_after`` s."""

    def __init__(self, instance: str, in_flight: int, retry_after: float = RETRY_AFTER) -> None:
        super().__init__(f"instance {instance} has {in_flight} requests in flight (its limit)")
        self.instance = instance
        self.retry_after = retry_after


@attrs.frozen
class AdmissionStatistics:
    in_flight: dict[str, int]
    admitted: int
    refused: int


class Admission:
    def __init__(self, max_in_flight: int = 64) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, not {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._admitted = self._refused = 0

    def in_flight(self, instance: str) -> int:
        return self._in_flight[instance]

    @contextmanager
    def admit(self, instance: str) -> Iterator[None]:
        """Hold one of ``instance``'s places for the ``with`` body, or raise
        :class:`Overloaded` at once when none is free."""
        if self._in_flight[instance] >= self.max_in_flight:
            self._refused += 1
            raise Overloaded(instance, self._in_flight[instance])
        self._in_flight[instance] += 1
        self._admitted += 1
        try:
            yield
        finally:
            self._in_flight[instance] -= 1
            if self._in_flight[instance] <= 0:
                del self._in_flight[instance]

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(dict(self._in_flight), self._admitted, self._refused)
