"""Plain-text tables of the API's JSON, as the client commands print them. Pure: no I/O.

The input is JSON as decoded (``Mapping[str, object]``), and the renderers are forgiving: a
missing or mistyped field shows as ``-`` instead of failing, so an older or newer server still
gets a readable table (``--json`` shows everything as sent).

Columns are left-aligned and separated by two spaces, like ``docker ps``; no line ends in
spaces. Layers show as ``start:end``, half-open like a Python slice (``0:12`` is layers 0 to 11).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

JsonObject = Mapping[str, object]

#: What a table shows for a value that is absent or unknown.
NONE = "-"

INSTANCE_HEADERS = ("INSTANCE", "MODEL", "SHARDING", "STATUS", "READY", "NODES", "PHASES")
NODE_HEADERS = (
    "NODE",
    "STATUS",
    "HOST",
    "API",
    "MEMORY FREE/TOTAL",
    "CPUS",
    "LOAD",
    "AGE",
)
SHARD_HEADERS = ("RANK", "NODE", "LAYERS", "ADDRESS", "RUNNER")
PLAN_HEADERS = ("RANK", "NODE", "LAYERS", "ADDRESS", "NEED", "FREE")


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """``headers`` and ``rows`` as aligned text lines, joined by newlines (no final newline)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))
    lines = []
    for row in (headers, *rows):
        cells = [cell.ljust(widths[i]) for i, cell in enumerate(row)]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def instances_table(instances: Sequence[JsonObject]) -> str:
    """``python -m skulk ps``: one row per instance; NODES and PHASES list its shards in rank
    order (comma-separated), READY counts the shards whose runner is ``ready``."""
    rows = []
    for instance in instances:
        shards = shards_of(instance)
        phases = [runner_phase(s) for s in shards]
        rows.append(
            (
                text(instance.get("id")),
                text(instance.get("model")),
                text(instance.get("sharding")),
                text(instance.get("status")),
                f"{phases.count('ready')}/{len(shards)}" if shards else NONE,
                ",".join(text(s.get("node")) for s in shards) or NONE,
                ",".join(phases) or NONE,
            )
        )
    return render_table(INSTANCE_HEADERS, rows)


def runner_failures(instances: Sequence[JsonObject]) -> list[str]:
    """One line per shard whose runner reports a failure (shown under the ``ps`` table)."""
    lines = []
    for instance in instances:
        for shard in shards_of(instance):
            runner = shard.get("runner")
            failure = runner.get("failure") if isinstance(runner, Mapping) else None
            if isinstance(failure, str) and failure:
                lines.append(
                    f"{text(instance.get('id'))} rank {text(shard.get('rank'))} "
                    f"on {text(shard.get('node'))}: {runner_phase(shard)}: {failure}"
                )
    return lines


def shards_table(instance: JsonObject) -> str:
    """One instance's shards (``place``'s answer): rank, node, layers, compute address
    (``-`` for single), runner phase."""
    rows = [
        (
            text(s.get("rank")),
            text(s.get("node")),
            layers(s.get("layers")),
            text(s.get("address")),
            runner_phase(s),
        )
        for s in shards_of(instance)
    ]
    return render_table(SHARD_HEADERS, rows)


def plan_table(plan: JsonObject) -> str:
    """A dry run's plan: rank, node, layers, compute address, the bytes the shard needs and the
    node has free."""
    rows = [
        (
            text(s.get("rank")),
            text(s.get("node")),
            layers(s.get("layers")),
            text(s.get("address")),
            size(s.get("need_bytes")),
            size(s.get("available_bytes")),
        )
        for s in shards_of(plan)
    ]
    return render_table(PLAN_HEADERS, rows)


def nodes_table(nodes: Sequence[JsonObject]) -> str:
    """``python -m skulk nodes``: committed status, host, API address, memory, CPUs, load and
    the age of the node's latest readings; a node known only from the State shows dashes."""
    rows = []
    for node in nodes:
        rows.append(
            (
                text(node.get("node_id")),
                text(node.get("status")),
                text(node.get("hostname")),
                text(node.get("api_address")),
                memory(node.get("memory_available_bytes"), node.get("memory_total_bytes")),
                text(node.get("cpu_count")),
                NONE if (load := _as_float(node.get("load_1m"))) is None else f"{load:.2f}",
                age(node.get("age_s")),
            )
        )
    return render_table(NODE_HEADERS, rows)


def shards_of(obj: JsonObject) -> list[JsonObject]:
    """The ``shards`` of an instance or plan that are JSON objects (none if absent)."""
    shards = obj.get("shards")
    if not isinstance(shards, list):
        return []
    return [s for s in shards if isinstance(s, Mapping)]


def runner_phase(shard: JsonObject) -> str:
    """The runner's phase; ``fetching 42%`` while its weights arrive (when the progress is
    known)."""
    runner = shard.get("runner")
    if not isinstance(runner, Mapping):
        return NONE
    phase = text(runner.get("phase"))
    done, total = _as_int(runner.get("bytes_done")), _as_int(runner.get("bytes_total"))
    if phase == "fetching" and done is not None and total:
        return f"fetching {min(100, max(0, done * 100 // total))}%"
    return phase


def text(value: object) -> str:
    """A scalar as a cell: ``-`` for null, absent, empty or a non-scalar."""
    if value is None or value == "" or isinstance(value, (list, dict, bool)):
        return NONE
    return str(value)


def layers(value: object) -> str:
    """``[start, end]`` as ``start:end``."""
    if isinstance(value, list) and len(value) == 2:
        start, end = _as_int(value[0]), _as_int(value[1])
        if start is not None and end is not None:
            return f"{start}:{end}"
    return NONE


def size(value: object) -> str:
    """A byte count in binary units: ``512 B``, ``1.5 KiB``, ``10.3 GiB``."""
    count = _as_int(value)
    if count is None or count < 0:
        return NONE
    amount = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if amount < 1024 or unit == "TiB":
            return f"{int(amount)} {unit}" if unit == "B" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def memory(free: object, total: object) -> str:
    """Free and total memory: ``10.3/15.6 GiB`` (one unit shown once when both share it)."""
    free_s, total_s = size(free), size(total)
    if free_s == NONE and total_s == NONE:
        return NONE
    free_n, _, free_unit = free_s.partition(" ")
    total_n, _, total_unit = total_s.partition(" ")
    if free_unit and free_unit == total_unit:
        return f"{free_n}/{total_n} {total_unit}"
    return f"{free_s}/{total_s}"


def age(value: object) -> str:
    """Seconds as a short age: ``0.4s``, ``12s``, ``3m``, ``2h``, ``5d``."""
    seconds = _as_float(value)
    if seconds is None or seconds < 0:
        return NONE
    if seconds < 10:
        return f"{seconds:.1f}s"
    for unit, span in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= span:
            return f"{int(seconds // span)}{unit}"
    return f"{int(seconds)}s"


def _as_int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _as_float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
