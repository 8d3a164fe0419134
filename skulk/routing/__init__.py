"""Any-node request routing: the API asks the :class:`Router` for a model and gets its request
served by a ready instance (the one whose prefix cache most likely holds its prompt, within a
balance bound; moved to the next when refused before any output) — in-process when this node
runs one, else on the node running it, over the federation data plane (:class:`RemoteRouting`).
Each serving node bounds what it takes (:class:`Admission`). Failures are typed
(:class:`Overloaded`, :class:`RemoteUnavailable`, :class:`NodeUnreachable`, and the router's
own)."""

from ._admission import Admission, AdmissionStatistics
from ._errors import NodeUnreachable, Overloaded, RemoteUnavailable
from ._policy import AFFINITY_SLACK, RETRY_WITHIN, prefix_key, rank
from ._remote import ASK_METHOD, ROUTE_METHOD, RemoteRouting, RouteTimeouts, RoutingStatistics
from ._router import ModelListing, ModelNotPlaced, NoReadyInstance, Route, Router, Served

__all__ = [
    "AFFINITY_SLACK",
    "ASK_METHOD",
    "RETRY_WITHIN",
    "ROUTE_METHOD",
    "Admission",
    "AdmissionStatistics",
    "ModelListing",
    "ModelNotPlaced",
    "NoReadyInstance",
    "NodeUnreachable",
    "Overloaded",
    "RemoteRouting",
    "RemoteUnavailable",
    "Route",
    "RouteTimeouts",
    "Router",
    "RoutingStatistics",
    "Served",
    "prefix_key",
    "rank",
]
