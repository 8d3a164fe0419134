"""A histogram that takes many equal observations in one step (for inter-token latency).

The serving path sees a request's deltas, not the moment of each token, so inter-token
latency is observed once per request, when it ends: its ``n - 1`` intervals, each at the
request's mean (``(end - first token) / (n - 1)``). ``prometheus_client``'s
:class:`~prometheus_client.Histogram` adds one observation per call; this one adds ``count``
equal ones in O(buckets), so a request of a thousand tokens costs what a request of two does.
It is exposed as an ordinary Prometheus histogram by :meth:`WeightedHistogram.collect`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterator, Sequence

from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.registry import Collector


class WeightedHistogram(Collector):
    """Bucket counts and sums by label values (``labelnames``), exposed as ``name``."""

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Sequence[float]
    ) -> None:
        bounds = sorted(float(b) for b in buckets if not math.isinf(b))
        if not bounds or len(set(bounds)) != len(bounds):
            raise ValueError("buckets must be distinct finite numbers")
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.bounds = tuple(bounds)
        #: label values -> (per-bucket counts, the last one +Inf), sum
        self._series: dict[tuple[str, ...], tuple[list[int], list[float]]] = {}

    def observe(self, labels: tuple[str, ...], value: float, count: int = 1) -> None:
        """Add ``count`` observations of ``value`` to the series of ``labels``."""
        if count <= 0 or not math.isfinite(value):
            return
        if len(labels) != len(self.labelnames):
            raise ValueError(f"{self.name} takes labels {self.labelnames}, not {labels!r}")
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = ([0] * (len(self.bounds) + 1), [0.0])
        counts, total = series
        counts[bisect.bisect_left(self.bounds, value)] += count
        total[0] += value * count

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for labels, (counts, total) in sorted(self._series.items()):
            cumulative = 0
            buckets: list[tuple[str, float]] = []
            for bound, n in zip((*self.bounds, math.inf), counts, strict=True):
                cumulative += n
                buckets.append(("+Inf" if math.isinf(bound) else repr(bound), float(cumulative)))
            family.add_metric(list(labels), buckets, total[0])
        yield family

    def describe(self) -> Iterator[Metric]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
