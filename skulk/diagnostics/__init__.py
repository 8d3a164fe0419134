"""Diagnostics across the cluster: the merged runner timeline.

    timeline = ClusterTimeline(node_id, local_source, peers, mesh.link)
    mesh rpc handler: TIMELINE_METHOD → timeline.handle_rpc
    result = await timeline.gather(since=0.0, limit=500)   # GET /v1/diagnostics/cluster/timeline
    events_json(result.events)                             # the events as that route shows them

    result = await timeline.gather(0.0, MAX_LIMIT, request_id)  # GET /v1/requests/{id}

``local_source`` is any callable returning this node's :class:`~skulk.wire.diagnostics.
TimelineEvent`\\ s (:func:`runner_events` turns runners' flight recorders into them).
"""

from ._timeline import (
    DEFAULT_LIMIT,
    MAX_LIMIT,
    TIMELINE_METHOD,
    ClusterTimeline,
    events_json,
    journal_events,
    runner_events,
)

__all__ = [
    "DEFAULT_LIMIT",
    "MAX_LIMIT",
    "TIMELINE_METHOD",
    "ClusterTimeline",
    "events_json",
    "journal_events",
    "runner_events",
]
