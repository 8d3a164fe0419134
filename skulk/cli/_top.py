"""``python -m skulk top``'s frame: the cluster at a glance, as rich tables. Pure: no I/O.

A frame is drawn from two answers, ``GET /v1/instances`` and ``GET /v1/cluster/nodes``:

* **Instances**, one row each: model, sharding, phase (its runners'), nodes, and from the
  ``serving`` lists that each node row carries (one entry per runner it hosts) the requests
  running/waiting, tokens/s and TTFT p50 of rank 0 (the rank that takes the requests, so
  they are not counted once per rank) and the KV cache use summed over the ranks (each holds
  the cache of its own layers).
* **Nodes**, one row each: committed status, health level and its first reason, memory used and
  free, load, and the age of the readings.

Like the other tables, it is forgiving: a field that is absent or mistyped shows ``-`` (a
server without ``serving`` lists still gets its instances drawn), and a node without a
``health`` field shows ``?``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from skulk.cli._tables import (
    NONE,
    JsonObject,
    _as_float,
    _as_int,
    age,
    runner_phase,
    shards_of,
    size,
    text,
)

INSTANCE_COLUMNS = (
    "INSTANCE",
    "MODEL",
    "SHARDING",
    "PHASE",
    "NODES",
    "RUN/WAIT",
    "TOK/S",
    "KV",
    "TTFT p50",
)
NODE_COLUMNS = ("NODE", "STATUS", "HEALTH", "MEM USED", "MEM FREE", "LOAD", "AGE", "REASON")
#: Columns never narrowed below this on a narrow terminal (ids are 12 and 21 characters); the
#: others not listed in :data:`SHRINKING` keep at least their header's width.
MIN_WIDTHS = {"INSTANCE": 12, "NODE": 21, "KV": 14}
#: The columns that give up their width first when the terminal is narrow.
SHRINKING = ("MODEL", "NODES", "PHASE", "REASON")
#: What the HEALTH column shows for a node whose row has no ``health`` field.
UNKNOWN_HEALTH = "?"
#: The style of each health level and runner phase (anything else is drawn plain).
STYLES = {
    "ok": "green",
    "ready": "green",
    "warn": "yellow",
    "error": "bold red",
    "failed": "bold red",
    "?": "dim",
}


def serving_by_instance(nodes: Sequence[JsonObject]) -> dict[str, list[JsonObject]]:
    """Every ``serving`` entry of every node, grouped by ``instance_id`` and sorted by rank."""
    found: dict[str, list[JsonObject]] = {}
    for node in nodes:
        entries = node.get("serving")
        if not isinstance(entries, list):
            continue
        for entry in entries:
            if isinstance(entry, Mapping) and isinstance(entry.get("instance_id"), str):
                found.setdefault(str(entry["instance_id"]), []).append(entry)
    for entries in found.values():
        entries.sort(key=lambda e: r if isinstance(r := e.get("rank"), int) else 1 << 30)
    return found


def instance_row(instance: JsonObject, serving: Sequence[JsonObject]) -> tuple[str, ...]:
    """One instance's cells, in :data:`INSTANCE_COLUMNS` order; ``serving`` is its entries
    from the nodes' ``serving`` lists (any order; none while unknown)."""
    shards = shards_of(instance)
    rank0 = next((e for e in serving if e.get("rank") == 0), None)
    used = [u for e in serving if (u := _as_int(e.get("kv_used_bytes"))) is not None]
    capacity = [c for e in serving if (c := _as_int(e.get("kv_capacity_bytes"))) is not None]
    return (
        text(instance.get("id")),
        text(instance.get("model")),
        text(instance.get("sharding")),
        instance_phase(instance),
        ",".join(text(s.get("node")) for s in shards) or NONE,
        _run_wait(rank0),
        NONE if rank0 is None else rate(rank0.get("tokens_per_s")),
        kv_use(sum(used), sum(capacity)) if used and capacity else NONE,
        NONE if rank0 is None else seconds(rank0.get("ttft_p50_s")),
    )


def instance_phase(instance: JsonObject) -> str:
    """``failed`` for a failed instance; else its runners' phase, one word when they agree
    (``ready``), else per rank (``ready,fetching 40%``)."""
    if instance.get("status") == "failed":
        return "failed"
    phases = [runner_phase(s) for s in shards_of(instance)]
    if not phases:
        return text(instance.get("status"))
    return phases[0] if len(set(phases)) == 1 else ",".join(phases)


def node_row(node: JsonObject) -> tuple[str, ...]:
    """One node's cells, in :data:`NODE_COLUMNS` order."""
    total = _as_int(node.get("memory_total_bytes"))
    free = _as_int(node.get("memory_available_bytes"))
    level, reason = health(node.get("health"))
    load = _as_float(node.get("load_1m"))
    return (
        text(node.get("node_id")),
        text(node.get("status")),
        level,
        size(total - free) if total is not None and free is not None else NONE,
        size(free),
        f"{load:.2f}" if load is not None and 0 <= load < math.inf else NONE,
        age(node.get("age_s")),
        reason,
    )


def health(value: object) -> tuple[str, str]:
    """A node's ``health`` field as (level, first reason): ``("?", "-")`` when absent;
    the reason as ``code: message`` with ``(+N more)`` when there are others."""
    if not isinstance(value, Mapping):
        return UNKNOWN_HEALTH, NONE
    level = value.get("level")
    reasons = value.get("reasons")
    listed = [r for r in reasons if isinstance(r, Mapping)] if isinstance(reasons, list) else []
    if not listed:
        return (level if isinstance(level, str) and level else UNKNOWN_HEALTH), NONE
    first = listed[0]
    code, message = text(first.get("code")), first.get("message")
    reason = f"{code}: {message}" if isinstance(message, str) and message else code
    if len(listed) > 1:
        reason += f" (+{len(listed) - 1} more)"
    return (level if isinstance(level, str) and level else UNKNOWN_HEALTH), reason


def rate(value: object) -> str:
    """Tokens per second: ``12.3``."""
    number = _as_float(value)
    return NONE if number is None or not 0 <= number < math.inf else f"{number:.1f}"


def seconds(value: object) -> str:
    """A latency: ``35 ms`` under a second, else ``1.25 s``; ``-`` for null."""
    number = _as_float(value)
    if number is None or not 0 <= number < math.inf:  # NaN and infinities too
        return NONE
    return f"{number * 1000:.0f} ms" if number < 1 else f"{number:.2f} s"


def kv_use(used: int, capacity: int) -> str:
    """KV cache use: ``12% of 1.0 GiB``."""
    if capacity <= 0:
        return NONE
    percent = min(100, max(0, round(used * 100 / capacity)))
    return f"{percent}% of {size(capacity)}"


def top_frame(
    instances: Sequence[JsonObject], nodes: Sequence[JsonObject], *, title: str = "skulk top"
) -> RenderableType:
    """The whole frame: a title line, the instances table and the nodes table."""
    serving = serving_by_instance(nodes)
    ordered = sorted(instances, key=lambda i: text(i.get("id")))
    instance_table = _table(f"Instances ({len(instances)})", INSTANCE_COLUMNS)
    for instance in ordered:
        row = instance_row(instance, serving.get(text(instance.get("id")), []))
        instance_table.add_row(*_styled(row, INSTANCE_COLUMNS.index("PHASE")))
    node_table = _table(f"Nodes ({len(nodes)})", NODE_COLUMNS)
    for node in sorted(nodes, key=lambda n: text(n.get("node_id"))):
        node_table.add_row(*_styled(node_row(node), NODE_COLUMNS.index("HEALTH")))
    return Group(Text(title, style="bold"), instance_table, node_table)


def error_frame(message: str, *, title: str = "skulk top") -> RenderableType:
    """What ``top`` shows while the API does not answer (it keeps trying)."""
    return Group(Text(title, style="bold"), Text(message, style="bold red"))


def _table(title: str, columns: Sequence[str]) -> Table:
    table = Table(title=title, title_justify="left", expand=False, box=None, pad_edge=False)
    for column in columns:
        table.add_column(
            column,
            no_wrap=True,
            overflow="ellipsis",
            min_width=None if column in SHRINKING else max(len(column), MIN_WIDTHS.get(column, 0)),
        )
    return table


def _styled(row: Sequence[str], index: int) -> list[Text]:
    cells = [Text(cell) for cell in row]
    cells[index].stylize(STYLES.get(row[index].split(" ")[0].split(",")[0], ""))
    return cells


def _run_wait(rank0: JsonObject | None) -> str:
    if rank0 is None:
        return NONE
    running, waiting = _as_int(rank0.get("running")), _as_int(rank0.get("waiting"))
    if running is None and waiting is None:
        return NONE
    return f"{text(running)}/{text(waiting)}"
