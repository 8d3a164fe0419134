"""The ``health`` and ``serving`` fields of ``GET /v1/cluster/nodes`` rows (see docs/api.md).

The derivation itself is :func:`skulk.cluster.node_health` (pure); this puts it, and the
runners each node gossips that it serves, into the route's rows.
"""

from __future__ import annotations

from collections.abc import Mapping

from skulk.cluster import State, node_health
from skulk.wire.telemetry import RunnerReading, TelemetryEntry


def add_health(
    rows: list[dict[str, object]], view: Mapping[str, TelemetryEntry], state: State
) -> list[dict[str, object]]:
    """``rows`` (``node_id``, ``age_s``: seconds since its telemetry was last refreshed,
    ``None`` when unknown), each with its ``health`` and ``serving``. A down node serves
    nothing: its gossiped runners, stale, are not shown. A node that is down and no member of
    the cluster (removed, its telemetry not expired yet) is left out."""
    members = {n.id for n in state.nodes}
    kept = []
    for row in rows:
        node_id = str(row["node_id"])
        entry = view.get(node_id)
        readings = entry.readings if entry is not None else None
        age = row.get("age_s")
        known = float(age) if isinstance(age, (int, float)) else None
        health = node_health(node_id, readings, known, state)
        if health.down and members and node_id not in members:
            continue
        row["health"] = health.to_json()
        serving = readings.serving if readings is not None and not health.down else ()
        row["serving"] = [serving_json(r) for r in serving]
        kept.append(row)
    return kept


def serving_json(r: RunnerReading) -> dict[str, object]:
    """One ``serving`` item, with exactly the documented fields."""
    return {
        "instance_id": r.instance,
        "model": r.model,
        "rank": r.rank,
        "phase": r.phase,
        "running": r.running,
        "waiting": r.waiting,
        "kv_used_bytes": r.kv_used_bytes,
        "kv_capacity_bytes": r.kv_capacity_bytes,
        "tokens_per_s": r.tokens_per_s,
        "ttft_p50_s": r.ttft_p50_s,
    }
