"""``python -m skulk.bench transfer`` end to end with tiny counts: a holder process, one
fetch over a loopback link, the local copies. Checks the shape of the result and that the
settings reach the fetch, not the numbers (timing is for benchmarks, not tests)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TINY = ("--mib", "1", "--rounds", "1", "--chunk-kib", "64", "--streams", "2",
        "--batch-mib", "1")  # fmt: skip


def test_transfer_bench_reports_its_settings_and_ratios() -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", "skulk.bench", "transfer", "--json", *TINY],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["chunk_bytes"] == 64 * 1024 and result["rounds"] == 1
    assert result["streams_per_holder"] == 2 and result["batch_bytes"] == 1024 * 1024
    assert result["bytes"] > 1024 * 1024
    for key in ("fetch_mb_s", "copy_mb_s", "copy_fsync_mb_s", "fetch_vs_copy",
                "verified_copy_mb_s", "fetch_vs_verified_copy"):  # fmt: skip
        assert result[key] > 0, key
    assert result["fetch_cpu_s"] >= 0
    assert len(result["fetch_s"]) == 1


def test_the_holder_can_dial_the_fetcher() -> None:
    """``--holder-dials``: the link the other way round (the holder's frames masked)."""
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run(
        [sys.executable, "-m", "skulk.bench", "transfer", "--json", *TINY, "--holder-dials"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=root,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["holder_dials"] is True and result["fetch_mb_s"] > 0


def test_the_verified_copy_copies_every_byte(tmp_path: Path) -> None:
    from skulk.bench._transfer import _verified_copy

    data = os.urandom(3 * 1024 * 1024 + 12345)  # pieces and reads that do not line up
    (tmp_path / "src").write_bytes(data)
    assert _verified_copy(tmp_path / "src", tmp_path / "dst", chunk=100_000) >= 0
    assert (tmp_path / "dst").read_bytes() == data
