"""Any-node request routing: the API asks the :class:`Router` for a model and gets its request
served by a ready instance — in-process when this node runs one, else on the node running it,
over the federation data plane (:class:`RemoteRouting`). Each serving node bounds what it takes
(:class:`Admission`). Failures are typed (:class:`Overloaded`, :class:`RemoteUnavailable`,
:class:`NodeUnreachable`, and the router's own)."""

from ._admission import Admission, AdmissionStatistics
from ._errors import NodeUnreachable, Overloaded, RemoteUnavailable
from ._remote import ASK_METHOD, ROUTE_METHOD, RemoteRouting, RouteTimeouts, RoutingStatistics
from ._router import ModelListing, ModelNotPlaced, NoReadyInstance, Route, Router

__all__ = [
    "ASK_METHOD",
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
]
