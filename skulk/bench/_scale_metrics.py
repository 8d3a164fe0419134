"""The scaling benchmark's figures, read from the nodes' own ``GET /metrics`` (pure: text in,
numbers out).

Two scrapes of one node, ``dt`` seconds apart, give its per-node figures (:func:`node_figures`):
links up, bytes/s it sent (gossip, Raft, everything on its links), entries applied per second
and the time each took, the State's size and snapshot cost, resident memory and CPU. Counters
are the node's (docs/operations.md, "Monitoring"): nothing is guessed from outside. A link's
byte counters restart with the link, so a counter that went down counts from zero.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import attrs
from prometheus_client.parser import text_string_to_metric_families

Key = tuple[str, frozenset[tuple[str, str]]]

#: The per-node figures, in table order: name → (unit, what it is).
FIGURES: dict[str, tuple[str, str]] = {
    "links": ("", "links up"),
    "gossip_bytes_per_s": ("B/s", "telemetry gossip sent (digests and pushes)"),
    "raft_bytes_per_s": ("B/s", "Raft messages sent (every kind)"),
    "raft_append_bytes_per_s": ("B/s", "AppendEntries sent (with entries, and heartbeats)"),
    "link_bytes_per_s": ("B/s", "everything sent on the node's links"),
    "entries_per_s": ("/s", "Raft entries applied"),
    "apply_us_per_entry": ("µs", "apply time per entry"),
    "state_bytes": ("B", "the State as canonical CBOR"),
    "snapshot_bytes": ("B", "a snapshot image (zstd)"),
    "snapshot_ms": ("ms", "making that snapshot"),
    "rss_mib": ("MiB", "node process resident memory"),
    "cpu_percent": ("%", "node process CPU (of one core)"),
}


@attrs.frozen
class Scrape:
    """One node's metrics at ``at`` (seconds, any monotonic clock)."""

    at: float
    samples: Mapping[Key, float]


def parse(text: str, at: float) -> Scrape:
    """A scrape of the Prometheus text ``text`` taken at ``at``."""
    samples = {
        (s.name, frozenset(s.labels.items())): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    return Scrape(at, samples)


def series(scrape: Scrape, name: str, **labels: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of ``name`` whose labels include ``labels``, by their whole label set."""
    want = set(labels.items())
    return {lab: v for (n, lab), v in scrape.samples.items() if n == name and want <= lab}


def total(scrape: Scrape, name: str, **labels: str) -> float:
    """The sum of :func:`series` (0 when there is none)."""
    return sum(series(scrape, name, **labels).values())


def increase(before: Scrape, after: Scrape, name: str, **labels: str) -> float:
    """How much the counter ``name`` (summed over its series) grew; a series that went down
    (a link made again) counts from zero, one that appeared counts whole."""
    old = series(before, name, **labels)
    grown = 0.0
    for lab, value in series(after, name, **labels).items():
        prior = old.get(lab, 0.0)
        grown += value - prior if value >= prior else value
    return grown


def node_figures(before: Scrape, after: Scrape) -> dict[str, float | None]:
    """The :data:`FIGURES` of one node between two scrapes (``None``: nothing to divide, e.g.
    no entry applied), and ``leader`` (1.0 if the node led at the second scrape)."""
    dt = after.at - before.at
    if dt <= 0:
        raise ValueError(f"the second scrape must come later (dt {dt})")

    def rate(name: str, **labels: str) -> float:
        return increase(before, after, name, **labels) / dt

    applied = increase(before, after, "skulk:raft_entries_applied_total")
    apply_s = increase(before, after, "skulk:raft_apply_seconds_total")
    links = series(after, "skulk:link_state", state="up")
    return {
        "links": float(sum(1 for v in links.values() if v == 1.0)),
        "gossip_bytes_per_s": rate("skulk:gossip_sent_bytes_total"),
        "raft_bytes_per_s": rate("skulk:raft_sent_bytes_total"),
        "raft_append_bytes_per_s": rate("skulk:raft_sent_bytes_total", message="append")
        + rate("skulk:raft_sent_bytes_total", message="heartbeat"),
        "link_bytes_per_s": rate("skulk:link_sent_bytes_total"),
        "entries_per_s": applied / dt,
        "apply_us_per_entry": apply_s / applied * 1e6 if applied else None,
        "state_bytes": total(after, "skulk:cluster_state_bytes"),
        "snapshot_bytes": total(after, "skulk:cluster_snapshot_bytes"),
        "snapshot_ms": total(after, "skulk:cluster_snapshot_seconds") * 1000,
        "rss_mib": total(after, "process_resident_memory_bytes") / 2**20,
        "cpu_percent": rate("process_cpu_seconds_total") * 100,
        "leader": total(after, "skulk:raft_role", role="leader"),
    }


def summarize(nodes: Sequence[Mapping[str, float | None]]) -> dict[str, dict[str, float | None]]:
    """Per figure over ``nodes``: ``mean``, ``min``, ``max`` and the ``leader``'s value (the
    node whose ``leader`` is 1; ``None`` if none led)."""
    leader = next((n for n in nodes if n.get("leader") == 1.0), None)
    out: dict[str, dict[str, float | None]] = {}
    for name in FIGURES:
        values = [v for n in nodes if (v := n.get(name)) is not None]
        out[name] = {
            "mean": _mean(values),
            "min": min(values) if values else None,
            "max": max(values) if values else None,
            "leader": None if leader is None else leader.get(name),
        }
    return out


def _mean(values: Iterable[float]) -> float | None:
    vs = list(values)
    return sum(vs) / len(vs) if vs else None
