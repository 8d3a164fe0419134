"""``python -m skulk.bench pipeline`` end to end with the tiny model and tiny counts: real
pipeline-2 groups on loopback: overlapped, taking turns, spinning. Checks the shape of the
result and that every variant wrote the same text, not the numbers (timing is for benchmarks, not
tests)."""

from __future__ import annotations

import json
import subprocess
import sys

TINY = ("--tiny", "--rounds", "1", "--streams", "1,2", "--max-tokens", "8", "--slow", "0.02",
        "--idle", "0.5")  # fmt: skip


def cores(value: object) -> bool:
    return isinstance(value, float | int) and not isinstance(value, bool) and value >= 0


def test_pipeline_bench_measures_both_variants() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "skulk.bench", "pipeline", "--json", *TINY],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["rounds"] == 1 and result["max_tokens"] == 8
    assert result["same_text"] is True
    for variant in ("overlap", "spin"):
        waiting = result["waiting"][variant]
        assert cores(waiting["rank0_waits"]) and cores(waiting["rank1_waits"])
        assert len(waiting["idle"]) == 2 and all(map(cores, waiting["idle"]))
    assert set(result["streams"]) == {"1", "2"}
    for level in result["streams"].values():
        assert level["overlap_vs_turns"] > 0 and level["overlap_vs_spin"] > 0
        for variant in ("overlap", "turns", "spin"):
            assert level[variant]["tokens_per_s"] > 0
            assert len(level[variant]["cores"]) == 2
    assert len(result["by_round"]) == 1
