"""``python -m skulk.bench scale`` end to end at a tiny size: meshes of 2 and 3 real model-less
nodes, a few seconds a phase. Checks the result's shape and that its counts are sane (every
node linked to every other, bytes flowing, placements committing entries), never its timings.
Then checks that every node process it started is gone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from skulk.bench._scale_fit import MODELS
from skulk.bench._scale_metrics import FIGURES


def test_bench_scale_at_two_and_three_nodes(tmp_path: Path) -> None:
    args = ["--json", "--sizes", "2,3", "--phase", "3", "--rate", "60", "--settle", "1",
            "--extrapolate", "100,1000", "--home", str(tmp_path),
            "--gossip-fanout", "1"]  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "skulk.bench", "scale", *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = json.loads(result.stdout)
    assert out["benchmark"] == "scale" and out["sizes"] == [2, 3]
    assert out["gossip_fanout"] == 1
    assert set(out["figures"]) == set(FIGURES)
    assert [r["nodes"] for r in out["runs"]] == [2, 3]
    for r in out["runs"]:
        n = r["nodes"]
        for phase in ("idle", "load"):
            figures = r[phase]
            assert set(figures) == set(FIGURES)
            # every node has a link up to every other, and one of them leads
            assert figures["links"]["min"] == figures["links"]["max"] == n - 1
            assert figures["links"]["leader"] == n - 1
            for name in ("gossip_bytes_per_s", "raft_bytes_per_s", "link_bytes_per_s"):
                assert figures[name]["min"] > 0, (n, phase, name)
            # what a node sends on its links includes its gossip and Raft messages
            assert figures["link_bytes_per_s"]["mean"] >= figures["gossip_bytes_per_s"]["mean"]
            assert figures["state_bytes"]["min"] > 0 and figures["snapshot_bytes"]["min"] > 0
            assert figures["rss_mib"]["min"] > 10
        # placements commit entries: applied on every node while the load runs
        assert r["placements"]["placed"] >= 1 and r["placements"]["errors"] == 0
        assert r["placements"]["per_min"] > 0
        assert r["load"]["entries_per_s"]["min"] > 0
        assert r["load"]["apply_us_per_entry"]["max"] is not None
        assert r["load"]["raft_append_bytes_per_s"]["leader"] > 0
    for phase in ("idle", "load"):
        links = out["fits"][phase]["links"]["max"]
        assert links["model"] in MODELS and set(links["at"]) == {"100", "1000"}
        assert set(links["candidates"]) == set(MODELS)
    # 1 → 2 links for 2 → 3 nodes: exactly linear in N, so the linear candidate says N - 1
    assert out["fits"]["idle"]["links"]["max"]["candidates"]["linear"]["100"] == 99
    verdict = out["verdict"]
    assert set(verdict["share_of_1gbit"]) == {"100", "1000"}
    assert isinstance(verdict["gossip_at_most_linear"], bool)
    assert isinstance(verdict["gossip_tail_exponent"], float)
    # the nodes were stopped: none of the data dirs' nodes is still running
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout == "", left.stdout
