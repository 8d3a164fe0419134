"""Prometheus metrics of one node (``GET /metrics``), with ``prometheus_client``.

:class:`NodeMetrics` holds a node's own registry. Requests are observed on the serving path
(:class:`RequestMetrics`, one :class:`RequestObserver` per generation); everything else (engine,
Raft, links, gossip, runners, weight transfers) is read from the parts' ``statistics()`` when
Prometheus scrapes (:meth:`NodeMetrics.set_source`), so it costs nothing between scrapes.
Names are vLLM's with the prefix ``skulk:`` where the meaning is the same (docs/operations.md,
"Monitoring").
"""

from ._histogram import WeightedHistogram
from ._node import CONTENT_TYPE, NodeMetrics, Source
from ._requests import RequestMetrics, RequestObserver

__all__ = [
    "CONTENT_TYPE",
    "NodeMetrics",
    "RequestMetrics",
    "RequestObserver",
    "Source",
    "WeightedHistogram",
]
