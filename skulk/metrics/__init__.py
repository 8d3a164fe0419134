"""Prometheus metrics of one node (``GET /metrics``), with ``prometheus_client``.

:class:`NodeMetrics` holds a node's own registry. Requests are observed on the serving path
(``NodeMetrics.requests``: one observer per generation, ``_requests.py``); everything else
(engine, Raft, links, gossip, runners, weight transfers) is read from the parts'
``statistics()`` when Prometheus scrapes (:meth:`NodeMetrics.set_source`), so it costs nothing
between scrapes. Names are vLLM's with the prefix ``skulk:`` where the meaning is the same
(docs/operations.md, "Monitoring").
"""

from ._node import CONTENT_TYPE, NodeMetrics

__all__ = ["CONTENT_TYPE", "NodeMetrics"]
