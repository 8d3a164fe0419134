"""``python -m skulk.sim``: run, scenario, mutants, replay; exit codes and repro files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from skulk.sim import MUTANTS


def sim(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skulk.sim", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_mutants_lists_one_name_per_line() -> None:
    out = sim("mutants")
    assert out.returncode == 0
    assert [line.split()[0] for line in out.stdout.splitlines()] == list(MUTANTS)


def test_run_ok_prints_hashes_and_summary() -> None:
    out = sim("run", "--seeds", "0:2", "--steps", "300")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("seed 0 ") and lines[0].endswith(" ok")
    assert "2 seed(s), 0 with a violation" in lines[-1]


def test_a_violation_writes_a_repro_that_replays_exactly(tmp_path: Path) -> None:
    out = sim(
        "run",
        "--seeds",
        "0:1",
        "--steps",
        "300",
        "--mutant",
        "apply-before-commit",
        "--repro-dir",
        str(tmp_path),
    )
    assert out.returncode == 1
    assert "VIOLATION apply_beyond_commit" in out.stdout
    (repro,) = tmp_path.glob("*.json")
    raw = json.loads(repro.read_text())
    assert raw["seed"] == 0 and raw["mutant"] == "apply-before-commit" and raw["plan"]
    replay = sim("replay", str(repro))
    assert replay.returncode == 1, replay.stdout + replay.stderr
    assert "reproduced exactly" in replay.stdout
    assert raw["expect"]["trace_hash"] in replay.stdout
    raw["expect"]["trace_hash"] = "0" * 64
    repro.write_text(json.dumps(raw))
    assert sim("replay", str(repro)).returncode == 3


def test_scenario_command(tmp_path: Path) -> None:
    out = sim("scenario", "impure-apply-detected", "--trace", str(tmp_path / "t.txt"))
    assert out.returncode == 0, out.stdout
    assert out.stdout.startswith("PASS impure-apply-detected")
    assert "VIOLATION state_machine_safety" in (tmp_path / "t.txt").read_text()


def test_usage_errors_exit_2() -> None:
    assert sim("run", "--seeds", "5:5").returncode == 2
    assert sim("run", "--seeds", "0:1", "--mutant", "gremlin").returncode == 2
    assert sim("scenario", "no-such-scenario").returncode == 2
