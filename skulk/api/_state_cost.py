"""What the applied cluster State costs to keep, for ``GET /metrics``: its size and the time a
snapshot of it takes, measured on this node when scraped (at most once per applied index, so
an idle cluster's scrapes cost nothing but a lookup).

The scaling benchmark (``python -m skulk.bench scale``) reads these to tell how the State
grows with the number of nodes; an operator reads them to see a State grow.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import attrs
from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from skulk.cluster import ClusterMachine, State, canonical_bytes
from skulk.control import ClusterControl


@attrs.frozen
class StateCost:
    """One measurement of the State applied at ``applied``."""

    applied: int
    #: the State's canonical CBOR (what a snapshot compresses)
    cbor_bytes: int
    #: the snapshot image (canonical CBOR compressed with zstd), and the seconds making it took
    snapshot_bytes: int
    snapshot_seconds: float


def measure_state(state: State, applied: int) -> StateCost:
    """Encode ``state`` as a snapshot would (timed) and as canonical CBOR."""
    started = time.perf_counter()
    image = ClusterMachine().snapshot(state)
    seconds = time.perf_counter() - started
    return StateCost(applied, len(canonical_bytes(state)), len(image), seconds)


class StateCostSource:
    """A metrics source: the :class:`StateCost` of ``control``'s State, measured again only
    when the applied index moved since the last scrape."""

    def __init__(self, control: ClusterControl) -> None:
        self._control = control
        self._last: StateCost | None = None

    def measure(self) -> StateCost:
        applied = self._control.applied
        if self._last is None or self._last.applied != applied:
            self._last = measure_state(self._control.state, applied)
        return self._last

    def __call__(self) -> Iterator[Metric]:
        cost = self.measure()
        yield GaugeMetricFamily(
            "skulk:cluster_state_bytes",
            "The applied cluster State's size as canonical CBOR.",
            value=cost.cbor_bytes,
        )
        yield GaugeMetricFamily(
            "skulk:cluster_snapshot_bytes",
            "A snapshot image of the applied State (CBOR compressed with zstd).",
            value=cost.snapshot_bytes,
        )
        yield GaugeMetricFamily(
            "skulk:cluster_snapshot_seconds",
            "Seconds making that snapshot image took here (measured when scraped, once per "
            "applied index).",
            value=cost.snapshot_seconds,
        )
