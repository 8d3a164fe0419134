"""``python -m skulk.bench models`` end to end with a tiny repo: the local Hub endpoint in a
subprocess, Skulk's pull against ``hf download``, a cut and its resume. Checks the shape of
the result and the resume's accounting, not the timings."""

from __future__ import annotations

import json
import subprocess
import sys


def test_models_bench_compares_with_hf_download_and_measures_the_resume() -> None:
    args = ("models", "--json", "--mib", "2", "--rounds", "1", "--no-peer-fetch")
    done = subprocess.run(
        [sys.executable, "-m", "skulk.bench", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    download = result["hub_download"]
    assert len(download["skulk_s"]) == len(download["hf_download_s"]) == 1
    assert download["hub_download_ratio"] > 0 and download["bytes"] > 2 * 1024 * 1024
    resume = result["resume"]
    assert resume["cut_at"] == resume["file_bytes"] // 2
    # Every byte of the file came at least once; the cut re-sent at most one read buffer.
    assert 0 <= resume["bytes_sent"] - resume["file_bytes"] <= 512 * 1024
