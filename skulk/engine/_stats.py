"""A runner's engine counters for the node's diagnostics (:class:`~skulk.wire.runner.EngineStats`).

Speculation is measured per request, by its
:class:`~skulk.engine._speculation_control.SpeculationController` (kept with the row across its
single-row spells). :class:`EngineTotals` adds a request's counters to the runner's totals when
the request leaves (finished, cancelled or failed) and, for a snapshot, adds those of the
requests still running, so a long request's acceptance shows while it runs and no request is
counted twice. It decides what to send too: a snapshot only when it differs from the last one
sent, so an idle runner sends nothing. When to ask (once per heartbeat) is the link's business.

Plain data, no I/O, no mlx.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

from skulk.wire.runner import EngineStats

if TYPE_CHECKING:  # _speculate imports mlx; this module must not need it
    from skulk.engine._speculation_control import SpeculationStatistics


@attrs.frozen
class SpeculationTotals:
    """Summed speculation counters (see :class:`SpeculationStatistics`)."""

    verify_steps: int = 0
    plain_steps: int = 0
    drafted: int = 0
    accepted: int = 0

    def plus(self, stats: SpeculationStatistics) -> SpeculationTotals:
        return SpeculationTotals(
            self.verify_steps + stats.verify_steps,
            self.plain_steps + stats.plain_steps,
            self.drafted + stats.drafted,
            self.accepted + stats.accepted,
        )


class EngineTotals:
    """The runner's speculation totals over the requests that left, and the last
    :class:`EngineStats` sent."""

    def __init__(self) -> None:
        self.speculation = SpeculationTotals()
        self._sent: EngineStats | None = None

    def request_left(self, stats: SpeculationStatistics | None) -> None:
        """Count a request that left (``None``: it never speculated)."""
        if stats is not None:
            self.speculation = self.speculation.plus(stats)

    def with_running(self, running: Iterable[SpeculationStatistics]) -> SpeculationTotals:
        """The totals now: the requests that left plus those ``running`` (their speculation
        so far)."""
        spec = self.speculation
        for stats in running:
            spec = spec.plus(stats)
        return spec

    def changed(self, stats: EngineStats) -> EngineStats | None:
        """``stats`` if it differs from the last one this returned (which it then becomes),
        else ``None``: what to send."""
        if stats == self._sent:
            return None
        self._sent = stats
        return stats
