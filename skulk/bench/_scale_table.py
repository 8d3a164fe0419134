"""The ``bench scale`` result as text: one rich table per phase (each figure's per-node mean and
max at every N, its best fit, log-log exponent and extrapolations), then the verdict."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console
from rich.table import Table

from ._scale_metrics import FIGURES


def _num(value: object) -> str:
    if value is None:
        return "-"
    assert isinstance(value, int | float)
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.1f}"
    return f"{value:.3g}"


def table(result: dict[str, Any]) -> str:
    out = io.StringIO()
    console = Console(file=out, width=180, force_terminal=False, color_system=None)
    runs, fitted = result["runs"], result["fits"]
    sizes = [r["nodes"] for r in runs]
    console.print(
        f"bench scale: sizes {sizes}, {result['phase_s']} s a phase, load "
        f"{result['placements_per_min']} placements/min, gossip fan-out "
        f"{result['gossip_fanout'] or 'every peer'}, {result['cpu_count']} CPUs"
    )
    for r in runs:
        console.print(
            f"  N={r['nodes']}: started in {r.get('start_s')} s, converged in "
            f"{r.get('converge_s')} s; load {r.get('placements')}"
        )
    for phase in ("idle", "load"):
        grid = Table(title=f"{phase}: per node, mean / max", title_justify="left")
        grid.add_column("figure")
        grid.add_column("unit")
        for n in sizes:
            grid.add_column(f"N={n}", justify="right")
        grid.add_column("fit (max)")
        grid.add_column("k", justify="right")
        for n in result["verdict"]["share_of_1gbit"]:
            grid.add_column(f"@{n} (max)", justify="right")
        for name, (unit, _) in FIGURES.items():
            cells = [
                f"{_num(r[phase][name]['mean'])} / {_num(r[phase][name]['max'])}" for r in runs
            ]
            f = fitted[phase][name].get("max", {})
            at = [_num(f.get("at", {}).get(n)) for n in result["verdict"]["share_of_1gbit"]]
            grid.add_row(name, unit, *cells, f.get("model", "-"), _num(f.get("exponent")), *at)
        console.print(grid)
    v = result["verdict"]
    console.print(
        f"gossip bytes/s per node (idle mean) grow as N^{_num(v['gossip_exponent'])} over "
        f"every size, N^{_num(v['gossip_tail_exponent'])} between the two largest: "
        f"{'at most linear' if v['gossip_at_most_linear'] else 'FASTER THAN LINEAR'}"
    )
    for n, share in v["share_of_1gbit"].items():
        console.print(
            f"busiest node's link traffic under load at N={n}: "
            f"{_num(v['busiest_link_bytes_per_s'][n])} B/s = "
            f"{'-' if share is None else f'{share:.1%}'} of 1 Gbit/s"
        )
    return out.getvalue()
