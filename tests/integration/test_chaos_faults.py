"""The chaos run's clock and disk faults act as they say: a process started with the clock
environment sees :func:`skulk.clock.wall` jump (and jump back) while its monotonic clock goes
on, and a disk fault refuses to fill anything but a filesystem of the node's own."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skulk.chaos._clock import clock_env, set_offset
from skulk.chaos._disk import fill

PROBE = """
import sys, time
from skulk.clock import wall
for line in sys.stdin:
    print(wall() - time.time(), time.monotonic(), flush=True)
"""


def test_a_clock_fault_moves_the_wall_clock_and_not_the_monotonic_one(tmp_path: Path) -> None:
    env = clock_env(tmp_path, os.environ)
    proc = subprocess.Popen([sys.executable, "-c", PROBE], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)  # fmt: skip
    assert proc.stdin is not None and proc.stdout is not None

    def ask() -> tuple[float, float, float]:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write("\n")
        proc.stdin.flush()
        skew, mono = map(float, proc.stdout.readline().split())
        return skew, mono, time.monotonic()

    try:
        skew, _, _ = ask()
        assert abs(skew) < 1
        for jump in (3600.0, -900.0, 0.0):
            set_offset(tmp_path, jump)
            time.sleep(1.2)  # the offset file is re-read every second
            skew, mono, ours = ask()
            assert abs(skew - jump) < 1, (jump, skew)
            assert abs(mono - ours) < 60  # the monotonic clock is the machine's
    finally:
        proc.kill()
        proc.wait()


def test_a_disk_fault_fills_only_a_filesystem_of_its_own(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a filesystem of its own"):
        fill(tmp_path)
    assert list(tmp_path.iterdir()) == []
