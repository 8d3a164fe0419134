"""Suite-wide checks."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

# Every process this test session starts (nodes, runners) inherits this marker, so the leak
# check below finds exactly ours, whatever else runs on the machine.
_MARKER = f"SKULK_TEST_SESSION={uuid.uuid4().hex}".encode()
os.environ["SKULK_TEST_SESSION"] = _MARKER.split(b"=", 1)[1].decode()


def _our_runner_processes() -> list[str]:
    """``pid cmdline`` of live ``python -m skulk.engine`` processes this session started."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            if "-m skulk.engine" not in cmdline:
                continue
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
            environ = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if state != "Z" and _MARKER in environ:
            found.append(f"{proc.name} {cmdline}")
    return found


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """No runner process may outlive the suite (each exits within 0.2 s of its node)."""
    if not Path("/proc").is_dir():
        return
    deadline = time.monotonic() + 5
    while (left := _our_runner_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    if left:
        print("\nrunner processes left behind by the suite:\n  " + "\n  ".join(left))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
