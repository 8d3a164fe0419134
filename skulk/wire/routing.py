"""Any-node routing on the data plane: a request admitted over rpc, its answer on a data stream.

The API node calls rpc ``route.generate`` on the node running the instance's rank 0 with a
:class:`RouteRequest`; once admitted, that node opens a data stream back to the caller and sends
:data:`RouteItem` chunks: first a :class:`RouteHeader` naming the request, then
:class:`RouteDelta` texts, then exactly one :class:`RouteEnd` or :class:`RouteFailed`.
"""

from __future__ import annotations

import attrs

from . import runner as _runner  # not its names: the wire spec test reads this namespace


@attrs.frozen
class RouteRequest:
    """Serve ``prompt`` on ``instance`` and stream the answer back to node ``caller``."""

    request_id: str
    caller: str
    instance: str
    prompt: _runner.Prompt
    params: _runner.SamplingParams


@attrs.frozen
class RouteHeader:
    """The first chunk of a route stream: which request it answers."""

    request_id: str


@attrs.frozen
class RouteDelta:
    text: str


@attrs.frozen
class RouteEnd:
    finish_reason: _runner.FinishReason
    usage: _runner.Usage


@attrs.frozen
class RouteFailed:
    """The request failed on the serving node (``reason`` as a runner's, e.g.
    ``prompt_too_long``, ``runner_crashed``; ``not_ready`` when the instance stopped being
    ready before the request started)."""

    reason: str
    message: str


RouteItem = RouteHeader | RouteDelta | RouteEnd | RouteFailed
