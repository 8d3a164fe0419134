"""``serve``'s progress bars, on a real node: drawn when its stderr is a terminal (a pty here)
while the demo model's runner starts, and nothing of the kind in a piped log."""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from skulk.harness import NodeProcess

DEADLINE = 120.0
BAR = "━"  # rich's bar character
_URL = re.compile(r"API listening on (http://\S+)")


def home_for(root: Path, skulk_home: Path) -> Path:
    """A data dir of its own (Raft, identity) sharing the session's demo model."""
    root.mkdir()
    (root / "models").symlink_to(skulk_home / "models")
    return root


def ready(url: str) -> bool:
    try:
        instances = httpx.get(url + "/v1/instances", timeout=5).json()["instances"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    return any(i["shards"][0]["runner"]["phase"] == "ready" for i in instances)


def read_some(fd: int, seen: bytearray) -> bool:
    """Append what ``fd`` has within 0.2 s to ``seen``; false once the node has exited (its
    side of the pty is closed)."""
    if select.select([fd], [], [], 0.2)[0]:
        try:
            seen += os.read(fd, 65536)
        except OSError:
            return False
    return True


def test_serve_on_a_terminal_draws_the_runner_starting(skulk_home: Path, tmp_path: Path) -> None:
    home = home_for(tmp_path / "tty", skulk_home)
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "skulk", "serve", "--port", "0", "--home", str(home),
         "--listen", "127.0.0.1:0"],
        stdin=subprocess.DEVNULL, stdout=follower, stderr=follower, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "160"},
    )  # fmt: skip
    os.close(follower)
    seen = bytearray()
    try:
        end = time.monotonic() + DEADLINE
        url = None
        while time.monotonic() < end and read_some(leader, seen):
            text = seen.decode(errors="replace")
            if url is None and (m := _URL.search(text)):
                url = m.group(1)
            if url is not None and ready(url):
                break
        assert url is not None and ready(url), seen.decode(errors="replace")[-4000:]
        # The API may say ready before this side has read all the node wrote: read on until
        # the log lines are in (or the deadline), so the assertions below see all of it.
        while time.monotonic() < end and read_some(leader, seen):
            if b"started pid" in seen and b": ready" in seen:
                break
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        os.close(leader)
    text = seen.decode(errors="replace")
    assert "skulk-demo (" in text and BAR in text, text[-4000:]
    bar_lines = [line for line in re.split(r"[\r\n]", text) if BAR in line]
    assert any(re.search(r"(loading|warming|connecting) skulk-demo \(\w+ rank 0\)", line)
               for line in bar_lines), bar_lines[-5:]  # fmt: skip
    # The log went on above the bars: the runner's start and its readiness are both there.
    assert "started pid" in text and ": ready" in text


def test_serve_into_a_pipe_draws_nothing(skulk_home: Path, tmp_path: Path) -> None:
    with NodeProcess(home_for(tmp_path / "pipe", skulk_home)) as node:
        node.wait_for(lambda: ready(node.url), DEADLINE, "the demo model ready")
        log = node.log()
    assert BAR not in log and "\x1b[" not in log, log[-2000:]
