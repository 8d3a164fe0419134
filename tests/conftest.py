"""Suite-wide checks."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

_BOOT_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")
_started = time.time()


def _runner_processes_started_since(since: float) -> list[str]:
    """``pid cmdline`` of live ``python -m skulk.runner`` processes started after ``since``."""
    boot = time.time() - float(Path("/proc/uptime").read_text().split()[0])
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if "-m skulk.runner" not in cmdline or stat[0] == "Z":
            continue
        started = boot + int(stat[19]) / _BOOT_TICKS_PER_SECOND
        if started >= since - 1:
            found.append(f"{proc.name} {cmdline}")
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No runner process may outlive the suite (each exits within 0.2 s of its node)."""
    if not Path("/proc").is_dir():
        return
    deadline = time.monotonic() + 5
    while (left := _runner_processes_started_since(_started)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        print("\nrunner processes left behind by the suite:\n  " + "\n  ".join(left))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
