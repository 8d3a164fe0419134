"""The serving node's admission bound: at most ``max_in_flight`` requests per instance.

Local and routed requests alike go through :meth:`Admission.admit` on the node that runs the
instance's rank 0; beyond the bound a request is refused at once with :class:`Overloaded`
(the API answers 429 with ``Retry-After``) rather than queued without limit in front of a
runner. Sans-IO: no clock, no Trio; the holder of a place decides how long it holds it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from contextlib import contextmanager

import attrs

from ._errors import RETRY_AFTER, Overloaded


@attrs.frozen
class AdmissionStatistics:
    """``in_flight``: the instances with requests in flight, and how many each; ``admitted``
    and ``refused``: counts since the start."""

    in_flight: dict[str, int]
    admitted: int
    refused: int
    max_in_flight: int


class Admission:
    """Bounds the requests in flight per instance on this node.

    ``retry_after`` (seconds) is what a refused request is told to wait.
    """

    def __init__(self, max_in_flight: int = 64, retry_after: float = RETRY_AFTER) -> None:
        if isinstance(max_in_flight, bool) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, not {max_in_flight!r}")
        if not retry_after >= 0:
            raise ValueError(f"retry_after must be >= 0, not {retry_after!r}")
        self.max_in_flight = max_in_flight
        self.retry_after = retry_after
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._admitted = self._refused = 0

    def in_flight(self, instance: str) -> int:
        return self._in_flight[instance]

    @contextmanager
    def admit(self, instance: str) -> Iterator[None]:
        """Hold one of ``instance``'s places for the ``with`` body, or raise
        :class:`Overloaded` at once (before the body) when none is free. The place is given
        back however the body ends."""
        held = self._in_flight[instance]
        if held >= self.max_in_flight:
            self._refused += 1
            raise Overloaded(
                instance, self.retry_after, f"has {held} requests in flight (its limit)"
            )
        self._in_flight[instance] = held + 1
        self._admitted += 1
        try:
            yield
        finally:
            self._in_flight[instance] -= 1
            if self._in_flight[instance] <= 0:
                del self._in_flight[instance]

    def statistics(self) -> AdmissionStatistics:
        return AdmissionStatistics(
            dict(self._in_flight), self._admitted, self._refused, self.max_in_flight
        )
