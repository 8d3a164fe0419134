"""One node's metrics: its own registry, what the request path observes, and what is read
from the node's parts when Prometheus scrapes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ._requests import RequestMetrics

log = logging.getLogger("skulk.metrics")

#: What a scrape-time source gives: metric families built from a part's statistics.
Source = Callable[[], Iterable[Metric]]

#: The ``Content-Type`` of :meth:`NodeMetrics.exposition` (Prometheus text format 0.0.4).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class NodeMetrics:
    """The metrics ``GET /metrics`` of one node exposes.

    A registry of its own (never ``prometheus_client``'s global one: tests run several nodes in
    one process) holding the client's process, platform and GC collectors,
    :attr:`requests` (observed on the serving path) and the node's scrape-time
    :meth:`sources <set_source>`: callables that build metric families from the
    ``statistics()`` of the node's parts when scraped, so those cost nothing in between.
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.requests = RequestMetrics(self.registry)
        self._sources: dict[str, Source] = {}
        self.registry.register(_Sources(self._sources))

    def set_source(self, key: str, source: Source) -> None:
        """Read ``source`` at each scrape (replacing the source of the same ``key``). A
        source that raises is logged and left out of that scrape; the others still show."""
        self._sources[key] = source

    def exposition(self) -> bytes:
        """Every metric in the Prometheus text format (:data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)


class _Sources(Collector):
    def __init__(self, sources: dict[str, Source]) -> None:
        self._sources = sources

    def collect(self) -> Iterator[Metric]:
        for key, source in sorted(self._sources.items()):
            try:
                families = list(source())
            except Exception:  # a bug in one source must not cost the whole scrape
                log.exception("metrics source %s failed", key)
                continue
            yield from families
