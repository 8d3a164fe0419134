"""``python -m skulk.bench scale``: how the control plane's cost grows with the number of nodes.

For each size N (default 3, 5, 10, 20) a real mesh of N model-less nodes runs on this machine
(:class:`~skulk.bench._scale_mesh.ScaleMesh`). Once converged (every node linked to every
other, every node ``up`` in every State) and ``settle`` seconds later, two phases of
``phase`` seconds each are measured from the nodes' own ``GET /metrics``, scraped at the
start and the end of the phase (:mod:`skulk.bench._scale_metrics`):

* ``idle``: nothing asked;
* ``load``: ``--rate`` placements a minute (:class:`~skulk.bench._scale_mesh.PlacementLoad`:
  each places the demo model on one node and deletes it again).

Every figure (links, gossip / Raft / link bytes per second, entries applied per second and
apply time, State and snapshot size, snapshot time, RSS, CPU) is summarised per phase over the
nodes (mean, min, max, the leader's) and its mean and max are fitted against N and
extrapolated (:mod:`skulk.bench._scale_fit`). ``verdict`` says whether gossip bytes per node
grow at most linearly, and what share of a 1 Gbit/s link the busiest node's traffic would take
at each extrapolated size.

All nodes share this machine's cores: CPU and time figures at large N include the contention
of N processes on few cores (``cpu_count`` is in the result), bytes and sizes do not.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from skulk.telemetry import DEFAULT_FANOUT

from ._scale_fit import fit
from ._scale_mesh import PlacementLoad, ScaleMesh
from ._scale_metrics import FIGURES, node_figures, summarize

PHASES = ("idle", "load")
#: A 1 Gbit/s link in bytes per second.
GIGABIT = 1e9 / 8
#: Exponents up to this count as "at most linear" (four points of a noisy figure).
LINEAR_SLACK = 1.15


@attrs.frozen
class Settings:
    sizes: tuple[int, ...] = (3, 5, 10, 20)
    #: seconds each phase is measured
    phase: float = 30.0
    #: placements a minute in the load phase
    rate: float = 100.0
    #: seconds between convergence and the first phase
    settle: float = 5.0
    extrapolate: tuple[int, ...] = (100, 1000)
    home: Path | None = None
    #: the nodes' ``--gossip-fanout`` (``None``: their default)
    gossip_fanout: int | None = None

    def node_args(self) -> tuple[str, ...]:
        fanout = self.gossip_fanout
        return () if fanout is None else ("--gossip-fanout", str(fanout))


def measure_size(root: Path, models: Path, count: int, settings: Settings) -> dict[str, Any]:
    """One mesh of ``count`` nodes: its start, then each phase's summary."""
    mesh = ScaleMesh(root / f"mesh{count}", models, count, settings.node_args())
    (root / f"mesh{count}").mkdir()
    run: dict[str, Any] = {"nodes": count}
    try:
        started = time.monotonic()
        mesh.start()
        converged = mesh.wait_converged(60.0 + 15.0 * count)
        run["start_s"] = round(time.monotonic() - started, 1)
        run["converge_s"] = round(converged, 1)
        time.sleep(settings.settle)
        for phase in PHASES:
            load = PlacementLoad(mesh.nodes, settings.rate) if phase == "load" else None
            before = mesh.scrape_all()
            if load is not None:
                load.start()
            time.sleep(settings.phase)
            after = mesh.scrape_all()
            if load is not None:
                counts = attrs.asdict(load.stop())
                counts["per_min"] = round(counts["placed"] * 60 / settings.phase, 1)
                run["placements"] = counts
            nodes = [node_figures(b, a) for b, a in zip(before, after, strict=True)]
            run[phase] = summarize(nodes)
    finally:
        mesh.stop()
    return run


def fits(runs: Sequence[dict[str, Any]], extrapolate: Sequence[int]) -> dict[str, Any]:
    """Per phase and figure: the fit of its per-node ``mean`` and ``max`` against N."""
    out: dict[str, Any] = {}
    for phase in PHASES:
        per_figure: dict[str, object] = {}
        for name in FIGURES:
            entry: dict[str, object] = {}
            for stat in ("mean", "max"):
                points = [
                    (int(r["nodes"]), v) for r in runs if (v := r[phase][name][stat]) is not None
                ]
                if len({n for n, _ in points}) >= 2:
                    sizes, values = zip(*points, strict=True)
                    entry[stat] = fit(sizes, values, extrapolate).as_dict()
            per_figure[name] = entry
        out[phase] = per_figure
    return out


def tail_exponent(runs: Sequence[dict[str, Any]], phase: str, name: str) -> float | None:
    """The growth exponent of ``name``'s per-node mean between the two largest sizes (what the
    extrapolation continues; the small sizes may grow differently, e.g. while a bounded gossip
    fan-out still reaches every peer); ``None`` with fewer than two sizes or a value <= 0."""
    points = sorted((int(r["nodes"]), r[phase][name]["mean"]) for r in runs)
    if len(points) < 2:
        return None
    (n0, y0), (n1, y1) = points[-2], points[-1]
    if y0 is None or y1 is None or y0 <= 0 or y1 <= 0 or n0 == n1:
        return None
    return round(math.log(y1 / y0) / math.log(n1 / n0), 3)


def verdict(
    fitted: dict[str, Any], runs: Sequence[dict[str, Any]], extrapolate: Sequence[int]
) -> dict[str, object]:
    """Whether gossip bytes per node grow at most linearly (the exponent of the idle mean
    between the two largest sizes; ``gossip_exponent`` is the log-log slope over every size),
    and the busiest node's link traffic under load at each extrapolated size, as a share of a
    1 Gbit/s link."""
    gossip = fitted["idle"]["gossip_bytes_per_s"].get("mean", {})
    tail = tail_exponent(runs, "idle", "gossip_bytes_per_s")
    at = fitted["load"]["link_bytes_per_s"].get("max", {}).get("at", {})
    return {
        "gossip_exponent": gossip.get("exponent"),
        "gossip_tail_exponent": tail,
        "gossip_at_most_linear": None if tail is None else tail <= LINEAR_SLACK,
        "busiest_link_bytes_per_s": {str(n): at.get(str(n)) for n in extrapolate},
        "share_of_1gbit": {
            str(n): None if at.get(str(n)) is None else round(at[str(n)] / GIGABIT, 4)
            for n in extrapolate
        },
    }


def run(settings: Settings) -> dict[str, object]:
    from skulk.models import ensure_demo_model

    with tempfile.TemporaryDirectory(prefix="skulk-bench-scale-", dir=settings.home) as tmp:
        root = Path(tmp)
        models = ensure_demo_model(root / "shared").parent
        runs = [measure_size(root, models, n, settings) for n in sorted(settings.sizes)]
    fitted = fits(runs, settings.extrapolate)
    return {
        "benchmark": "scale",
        "sizes": sorted(settings.sizes),
        "phase_s": settings.phase,
        "placements_per_min": settings.rate,
        "settle_s": settings.settle,
        "gossip_fanout": DEFAULT_FANOUT
        if settings.gossip_fanout is None
        else settings.gossip_fanout,
        "cpu_count": os.cpu_count(),
        "figures": {name: {"unit": u, "what": w} for name, (u, w) in FIGURES.items()},
        "runs": runs,
        "fits": fitted,
        "verdict": verdict(fitted, runs, settings.extrapolate),
    }
