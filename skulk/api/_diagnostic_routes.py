"""``GET /v1/diagnostics/cluster/timeline``: every reachable node's runner events, merged; and
``GET /v1/requests/{request_id}``: one request's events, from every node it touched.

Query parameters (each at most once; any other is a 400 naming it):

* ``limit``: the most events returned, an integer from 1 to
  :data:`~skulk.diagnostics.MAX_LIMIT` (default :data:`~skulk.diagnostics.DEFAULT_LIMIT`);
  the most recent ones are kept.
* ``since``: only events at or after this wall-clock time (seconds since the Unix epoch, a
  finite number >= 0; default 0).

The answer: ``events`` (oldest first, each with ``at``, ``node``, ``model``, ``instance``,
``rank``, ``incarnation``, ``kind``, ``detail``, ``request_id``), ``dropped`` (matching events
the limits left out), ``answered`` (nodes whose events are in) and ``unanswered`` (nodes that
did not answer in time, each with a ``reason``). A node that never answers costs the request
its per-node deadline, no more.

``GET /v1/requests/{request_id}`` (the id as the ``x-request-id`` header carried it, or as the
node generated it) answers ``{"request_id", "events", "answered", "unanswered"}``: the events
of that request on every reachable node, oldest first, each ``{"at", "node_id", "kind",
"detail", "model", "instance", "rank", "incarnation"}``. Events with ``incarnation`` 0 are the
node's own (``request.received``, ``request.routed``, ``route.hop``, ``route.stream``,
``route.arrived``, ``request.admitted``, ``request.done``, ``request.error``); the others are
a runner's flight recorder's (``request.start``: sent to the runner, ``request.admitted_kv``:
admitted to its KV budget after waiting in its queue, ``request.prefill``: one prefill chunk,
with the prompt tokens computed so far, ``request.first_token``,
``request.finish`` with its token counts, ``request.fail``, ``request.cancel``). An id that is
not a valid request id is a 400 naming ``request_id``; an id no node has an event for, a 404
(``request_not_found``). Nodes keep a bounded number of events: an old request is forgotten.
"""

from __future__ import annotations

import math

from quart import Response, request
from quart_trio import QuartTrio

from skulk.api._errors import ApiError
from skulk.api._http_errors import json_response
from skulk.api._schema import Schema, honoured
from skulk.diagnostics import DEFAULT_LIMIT, MAX_LIMIT, ClusterTimeline, events_json
from skulk.tracing import check_request_id

#: The query parameters, with the JSON Schema of what each accepts (the OpenAPI document's).
_TIMELINE_PARAMS: dict[str, Schema] = {
    "limit": honoured(
        f"The most events returned, the most recent kept (default {DEFAULT_LIMIT}).",
        type="integer",
        minimum=1,
        maximum=MAX_LIMIT,
    ),
    "since": honoured(
        "Only events at or after this time (seconds since the Unix epoch).",
        type="number",
        minimum=0,
    ),
}


def parse_timeline_query(args: dict[str, list[str]]) -> tuple[float, int]:
    """``(since, limit)`` from the query's parameters (name → values);
    :class:`ApiError` (400 naming the parameter) otherwise."""
    for name, values in args.items():
        if name not in _TIMELINE_PARAMS:
            raise ApiError.unknown_parameter(name)
        if len(values) != 1:
            raise ApiError.invalid(name, f"{name} is given {len(values)} times")
    limit = DEFAULT_LIMIT
    if "limit" in args:
        raw = args["limit"][0].strip()
        if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_LIMIT:
            raise ApiError.invalid("limit", f"limit must be an integer from 1 to {MAX_LIMIT}")
        limit = int(raw)
    since = 0.0
    if "since" in args:
        raw = args["since"][0].strip()
        try:
            since = float(raw) if raw.isascii() else math.nan
        except ValueError:
            since = math.nan
        if not (math.isfinite(since) and since >= 0):
            raise ApiError.invalid(
                "since", "since must be a time in seconds since the Unix epoch (a number >= 0)"
            )
    return since, limit


def install_timeline_route(app: QuartTrio, timeline: ClusterTimeline) -> None:
    """Add ``GET /v1/diagnostics/cluster/timeline`` to ``app``."""

    @app.get("/v1/diagnostics/cluster/timeline")
    async def cluster_timeline() -> Response:
        args = {name: request.args.getlist(name) for name in request.args}
        since, limit = parse_timeline_query(args)
        result = await timeline.gather(since, limit)
        body = {
            "events": events_json(result.events),
            "dropped": result.dropped,
            "answered": list(result.answered),
            "unanswered": [{"node": u.node, "reason": u.reason} for u in result.unanswered],
        }
        return json_response(body, 200)


def install_request_route(app: QuartTrio, timeline: ClusterTimeline) -> None:
    """Add ``GET /v1/requests/{request_id}`` to ``app``."""

    @app.get("/v1/requests/<path:request_id>")
    async def one_request(request_id: str) -> Response:
        try:
            check_request_id(request_id)
        except ValueError as exc:
            raise ApiError.invalid("request_id", f"request_id: {exc}") from None
        result = await timeline.gather(0.0, MAX_LIMIT, request_id)
        if not result.events:
            raise ApiError.not_found(
                f"no node has an event of request {request_id!r} (unknown, or forgotten)",
                code="request_not_found",
            )
        events = [
            {
                "at": e.at,
                "node_id": e.node,
                "kind": e.kind,
                "detail": e.detail,
                "model": e.model,
                "instance": e.instance,
                "rank": e.rank,
                "incarnation": e.incarnation,
            }
            for e in result.events
        ]
        body = {
            "request_id": request_id,
            "events": events,
            "dropped": result.dropped,
            "answered": list(result.answered),
            "unanswered": [{"node": u.node, "reason": u.reason} for u in result.unanswered],
        }
        return json_response(body, 200)
