"""A real ``python -m skulk serve`` process on an ephemeral loopback port.

Its output is read continuously (a full pipe would stall the node) and kept as a tail;
:meth:`NodeProcess.start` waits for the "API listening on" line and, by default, for
``/health`` to answer 200. Stopping sends SIGTERM and, if the node does not exit in time,
SIGKILLs its whole process group, so nothing is left behind.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

START_DEADLINE = 120.0
_LISTENING = re.compile(r"API listening on (http://\S+)")
_FEDERATION = re.compile(r"skulk: node (\S+) of cluster .* federation listening on (ws://\S+)")


class NodeProcess:
    """One node; use as a context manager or call :meth:`start` and :meth:`stop`."""

    def __init__(
        self, home: Path, *extra: str, env: dict[str, str] | None = None, keep: int = 400
    ) -> None:
        """``keep``: how many of the node's last output lines :attr:`output` holds."""
        self.home = home
        self.extra = extra
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.ws_url = ""  # where other nodes --join this one
        self.node_id = ""
        self.output: deque[str] = deque(maxlen=keep)
        self._url_seen = threading.Event()

    def start(self, *, wait_ready: bool = True) -> NodeProcess:
        """Start the node; raises ``AssertionError`` with its output if it does not come up."""
        # Ephemeral ports for the API and, unless the caller picks one, for the federation.
        listen = () if "--listen" in self.extra else ("--listen", "127.0.0.1:0")
        cmd = [sys.executable, "-m", "skulk", "serve", "--port", "0", "--home", str(self.home),
               *listen, *self.extra]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=self.env,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        if not self._url_seen.wait(START_DEADLINE):
            self._dump_stacks()
            code = self.proc.poll()
            self.stop()
            how = "still running" if code is None else f"exited with {code}"
            raise AssertionError(f"server never listened ({how}):\n" + self.log())
        if wait_ready:
            self.wait_ready()
        return self

    def _dump_stacks(self) -> None:
        """Have a live node write every thread's stack into its output (its SIGUSR1)."""
        if self.proc is not None and self.proc.poll() is None:
            self.output.append(f"(the node, pid {self.proc.pid}, is running: its stacks follow)")
            try:
                os.kill(self.proc.pid, signal.SIGUSR1)
            except OSError:
                return
            time.sleep(2.0)

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip())
            if not self.ws_url and (m := _FEDERATION.search(line)):
                self.node_id, self.ws_url = m.group(1), m.group(2)
            if not self._url_seen.is_set() and (m := _LISTENING.search(line)):
                self.url = m.group(1)
                self._url_seen.set()

    def log(self) -> str:
        return "\n".join(self.output)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, **{"timeout": 30, **kw})

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.post(self.url + path, **{"timeout": 60, **kw})

    def delete(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.delete(self.url + path, **{"timeout": 60, **kw})

    def wait_ready(self, deadline: float = START_DEADLINE) -> None:
        self.wait_for(lambda: self.get("/health").status_code == 200, deadline, "ready")

    def wait_for(self, predicate: Callable[[], bool], deadline: float, what: str) -> None:
        """Poll ``predicate`` until true; fail with the node's output after ``deadline`` s."""
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited ({self.proc.returncode}):\n{self.log()}")
            if predicate():
                return
            time.sleep(0.05)
        raise AssertionError(f"not {what} within {deadline}s:\n{self.log()}")

    def diagnostics(self) -> dict[str, Any]:
        body: dict[str, Any] = self.get("/v1/diagnostics/node").json()
        return body

    def runner(self) -> dict[str, Any]:
        """The newest runner's diagnostics (statistics, failure, deadlines, events)."""
        runners: list[dict[str, Any]] = self.diagnostics()["runners"]
        return runners[-1]

    def signal(self, sig: signal.Signals) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait_exit(self, timeout: float) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> NodeProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); it is gone for our purposes once it is not running.
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"
