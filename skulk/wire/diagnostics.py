"""Diagnostics between nodes: the cluster timeline (rpc ``diagnostics.timeline``).

A node's API merges every reachable node's runner flight recorders into one timeline: it calls
rpc ``diagnostics.timeline`` on each peer with a :class:`TimelineAsk` (a
:data:`DiagnosticsFrame`, tagged) and the peer answers a :class:`TimelineReply` holding its
most recent events at or after ``since`` (wall-clock seconds since the Unix epoch), at most
``limit`` of them, oldest first; ``dropped`` counts the matching events left out by the limit.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class TimelineAsk:
    """Ask a node for its runners' events at or after ``since``, at most ``limit`` (>= 1);
    with ``request_id``, only the events about that request, its node-level events (routing,
    admission: ``incarnation`` 0) included."""

    since: float
    limit: int
    request_id: str | None = None


@attrs.frozen
class TimelineEvent:
    """One flight-recorder event of a runner: rank ``rank`` of ``instance`` (a model ``model``
    instance) on ``node``, in its ``incarnation`` (1 for the first runner, then relaunches).
    ``at`` is the node's wall clock (seconds since the Unix epoch); ``kind`` and ``detail`` are
    the recorder's (``phase``, ``deadline``, ``exit``, ...); ``request_id`` names the request
    an event is about, if any."""

    at: float
    node: str
    model: str
    instance: str
    rank: int
    incarnation: int
    kind: str
    detail: str
    request_id: str | None = None


@attrs.frozen
class TimelineReply:
    events: tuple[TimelineEvent, ...]
    dropped: int
    """Events at or after ``since`` left out by the limit (the oldest ones)."""


DiagnosticsFrame = TimelineAsk | TimelineReply
