"""Random fault plans over many seeds hold every invariant; runs are deterministic.

Every seed drives the real cluster State (``skulk.cluster.ClusterMachine`` behind the real
sessions): random placements, deletions, runner reports, node status changes and removals,
some of them rejected, interleaved with the network and disk faults.

``SKULK_SIM_SEEDS`` (default 200) sets how many seeds the suite runs; ``SKULK_SIM_STEPS``
(default 600) their length in ticks. ``python -m skulk.sim run --seeds A:B`` runs more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from skulk.sim import RunResult, SimConfig, run_seed

SEEDS = int(os.environ.get("SKULK_SIM_SEEDS", "200"))
STEPS = int(os.environ.get("SKULK_SIM_STEPS", "600"))
CONFIG = SimConfig(steps=STEPS)


def _run(seed: int) -> RunResult:
    return run_seed(seed, CONFIG)


def test_random_seeds_hold_every_invariant() -> None:
    workers = min(2, os.cpu_count() or 1)
    with ProcessPoolExecutor(max_workers=workers) as pool:
        results = list(pool.map(_run, range(SEEDS), chunksize=8))
    failures = [f"seed {r.seed}: {r.violation}" for r in results if r.violation]
    assert not failures, "\n".join(failures)
    assert sum(r.acks for r in results) > SEEDS * 20
    assert all("probe acknowledged" in r.liveness or "skipped" in r.liveness for r in results)
    # the faults happened
    totals: dict[str, int] = {}
    for r in results:
        for k, v in r.counters:
            totals[k] = totals.get(k, 0) + v
    assert min(totals["crashes"], totals["degraded"], totals["restores"]) > 0
    assert totals["elections"] > SEEDS and totals["triggered"] > 0  # leaders were hunted
    # the cluster State was driven: commands of every kind took effect, and apply() refused
    # the ones it must refuse (placements on nodes that are not up among them)
    commands: dict[str, int] = {}
    for r in results:
        for k, v in r.commands:
            commands[k] = commands.get(k, 0) + v
    assert commands.get("PlaceInstance:applied", 0) > SEEDS * 3, commands
    assert {k.split(":")[0] for k in commands if k.endswith(":applied")} == {
        "UpsertNode",
        "NodeStatusChanged",
        "RemoveNode",
        "RegisterModel",
        "PlaceInstance",
        "DeleteInstance",
        "SetInstanceStatus",
        "ReportRunner",
        "SetConfig",
    }
    for refused in (
        "PlaceInstance:node_not_up",
        "PlaceInstance:unknown_model",
        "DeleteInstance:unknown_instance",
        "ReportRunner:wrong_node",
        "ReportRunner:unknown_instance",
        "RemoveNode:node_in_use",
    ):
        assert commands.get(refused, 0) > 0, (refused, commands)


def test_same_seed_same_trace_hash() -> None:
    a, b, c = (
        run_seed(11, SimConfig(steps=400)),
        run_seed(11, SimConfig(steps=400)),
        run_seed(12, SimConfig(steps=400)),
    )
    assert a.trace_hash == b.trace_hash and a.summary() == b.summary()
    assert a.trace_hash != c.trace_hash


def test_same_trace_hash_in_other_processes_whatever_the_hash_seed(tmp_path: Path) -> None:
    want = {s: run_seed(s, SimConfig(steps=300)).trace_hash for s in (3, 4)}
    for hash_seed in ("0", "12345"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "skulk.sim",
                "run",
                "--seeds",
                "3:5",
                "--steps",
                "300",
                "--json",
                "--repro-dir",
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
        )
        assert done.returncode in (0, 1), done.stderr  # 1: a violation (tested elsewhere)
        out = done.stdout
        got = {s["seed"]: s["trace_hash"] for s in json.loads(out)["seeds"]}
        assert got == want
