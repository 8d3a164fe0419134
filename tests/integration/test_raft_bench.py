"""``python -m skulk.bench raft`` end to end with tiny counts: three replica processes on
loopback per system, fsync on. Checks the shape of the result, not the numbers (timing is for
benchmarks, not tests)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from skulk.bench._raft import NAMES

TINY = ("--clients", "4", "--duration", "0.5", "--sequential", "5", "--trials", "1")
KEYS = (
    "commit_p50_ms",
    "commit_p99_ms",
    "commits_per_s",
    "idle_commit_p50_ms",
    "election_p50_timeouts",
    "election_p99_timeouts",
)


def bench(*args: str) -> dict[str, object]:
    result = subprocess.run(
        [sys.executable, "-m", "skulk.bench", "raft", "--json", *TINY, *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    value = json.loads(result.stdout)
    assert isinstance(value, dict)
    return value


def test_raft_bench_runs_our_cluster() -> None:
    result = bench("--no-baseline")
    for key in KEYS:
        value = result[key]
        assert isinstance(value, int | float) and value > 0, key
    assert result["failed_submits"] == 0
    assert "pysyncobj" not in result


def test_raft_bench_compares_with_pysyncobj() -> None:
    result = bench()
    baseline = result["pysyncobj"]
    assert isinstance(baseline, dict)
    for key in KEYS:
        assert isinstance(baseline[key], int | float) and baseline[key] > 0, key
    ratio = result["throughput_ratio_vs_pysyncobj"]
    assert isinstance(ratio, float) and ratio > 0


def test_raft_bench_measures_levels_in_interleaved_rounds() -> None:
    result = bench("--no-baseline", "--levels", "2,3", "--rounds", "2", "--trials", "0")
    assert result["rounds"] == 2
    levels = result["levels"]
    assert isinstance(levels, list)
    assert [level["clients"] for level in levels] == [2, 3]
    for level in levels:
        assert level["commits_per_s"] > 0 and level["idle_commit_p50_ms"] > 0
        assert level["failed_submits"] == 0 and "pysyncobj" not in level


async def test_a_replica_that_exits_fails_the_wait_at_once_with_its_log(tmp_path: Path) -> None:
    from skulk.bench._raft import Cluster, Settings

    cluster = Cluster("skulk", tmp_path, Settings())
    try:
        for name in NAMES:
            (tmp_path / name).mkdir()
            await cluster.start(name)
        crashed = cluster.procs["n2"]
        os.killpg(crashed.pid, signal.SIGKILL)  # a crash: the cluster still lists it
        await crashed.wait()
        with trio.fail_after(30), pytest.raises(RuntimeError) as failed:
            await cluster.wait_agreed(60)
        message = str(failed.value)
        assert "n2 exited" in message and "--- n2 ---" in message
    finally:
        await cluster.reap()


class StillExiting:
    """A killed incarnation that takes a while to exit (as one in an fsync does)."""

    exited = False

    async def wait(self) -> None:
        await trio.sleep(0.3)
        self.exited = True


async def test_a_restart_waits_for_the_killed_incarnation_and_ports_are_distinct(
    tmp_path: Path,
) -> None:
    """The failover phase kills a replica and starts it again on the same ports: the new one
    must not start while the old one still holds them. Every replica port drawn is a
    different port."""
    from skulk.bench._raft import Cluster, Settings

    cluster = Cluster("skulk", tmp_path, Settings())
    ports = [*cluster.peer_ports.values(), *cluster.control.values()]
    assert len(set(ports)) == len(ports)
    try:
        (tmp_path / "n1").mkdir()
        await cluster.start("n1")
        first = cluster.procs["n1"]
        cluster.kill("n1")
        old = StillExiting()
        cluster.dead["n1"].append(old)  # type: ignore[arg-type]
        await cluster.start("n1")
        assert first.returncode is not None and old.exited
        assert cluster.procs["n1"] is not first
    finally:
        await cluster.reap()


class NeverExiting:
    """A killed incarnation that never exits."""

    async def wait(self) -> None:
        await trio.sleep_forever()


async def test_a_restart_gives_up_on_a_killed_incarnation_that_never_exits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from skulk.bench import _raft

    monkeypatch.setattr(_raft, "EXIT_DEADLINE", 0.2)
    cluster = _raft.Cluster("skulk", tmp_path, _raft.Settings())
    cluster.dead["n1"] = [NeverExiting()]  # type: ignore[list-item]
    with trio.fail_after(10), pytest.raises(RuntimeError, match="n1: killed, still running"):
        await cluster.start("n1")
    assert "n1" not in cluster.procs
