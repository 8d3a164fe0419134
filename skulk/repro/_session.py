"""One run of one scenario: its nodes, its deadline, its checks and its cleanup.

Every wait a script makes goes through :meth:`Session.budget` (capped by what is left of the
scenario's budget) or :meth:`Session.wait_until` (polling with a deadline), and a last-resort
watchdog kills every process the run started and exits if the run as a whole overstays, so a
repro can fail but never hang.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from skulk.harness import NodeProcess, pid_alive
from skulk.repro._client import Reply, request
from skulk.repro._recorder import Recorder, is_runner
from skulk.repro._scenario import Check, StepFailed

#: Short deadlines, so every fault is detected quickly; a scenario overrides what it tests.
BASE_FLAGS: Mapping[str, str] = {
    "hello-timeout": "10",
    "load-timeout": "60",
    "warmup-timeout": "30",
    "progress-timeout": "3",
    "cancel-timeout": "3",
    "shutdown-grace": "1",
    "heartbeat-interval": "0.5",
    "restart-backoff": "0.2",
    "stream-interval": "0",
}
#: Slack on top of a configured deadline before a late detection counts as a failure (the
#: machine may be a slow, shared 2-core VM; these are not timing assertions).
MARGIN = 10.0
#: How long a node has to exit after SIGTERM, and runners after their node stopped.
NODE_EXIT_BUDGET = 30.0
RUNNER_EXIT_BUDGET = 10.0
#: How long the node log tail kept in a result is.
LOG_TAIL = 60


class Node:
    """A node this session started, with the recorder watching it."""

    def __init__(self, index: int, process: NodeProcess, recorder: Recorder) -> None:
        self.index = index
        self.process = process
        self.recorder = recorder
        self.killed = False
        self.stopped = False

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def pid(self) -> int:
        assert self.process.proc is not None
        return self.process.proc.pid

    def get(self, path: str, budget: float = 5.0) -> Reply:
        return request("GET", self.url + path, budget=budget)

    def kill(self) -> None:
        """SIGKILL the node process alone (not its runners: they must notice on their own)."""
        self.killed = True
        os.kill(self.pid, signal.SIGKILL)

    def log_tail(self) -> list[str]:
        lines = [line for line in self.process.output if "skulk.access" not in line]
        return lines[-LOG_TAIL:]


class Session:
    def __init__(
        self,
        home: Path,
        *,
        faults: str,
        flags: Mapping[str, str],
        budget_s: float,
    ) -> None:
        self.home = home
        self.faults = faults
        self.flags = {**BASE_FLAGS, **flags}
        self.t0 = time.time()
        self.started = time.monotonic()
        self.budget_s = budget_s
        self.deadline = self.started + budget_s
        self.nodes: list[Node] = []
        self.checks: list[Check] = []
        # Scripts, cleanup, and then some: past this the run is stuck in a bug of ours.
        self._watchdog = threading.Timer(budget_s + 2 * NODE_EXIT_BUDGET + 60, self._stuck)
        self._watchdog.daemon = True
        self._watchdog.start()

    # -- deadlines -------------------------------------------------------------------------

    def setting(self, flag: str) -> float:
        """A deadline flag's value as the nodes get it."""
        return float(self.flags[flag])

    def remaining(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def budget(self, seconds: float) -> float:
        """``seconds``, or less if the scenario's budget is nearly spent."""
        return max(0.1, min(seconds, self.remaining()))

    def wait_until(
        self, predicate: Callable[[], bool], seconds: float, *, capped: bool = True
    ) -> float | None:
        """Poll ``predicate`` until it holds; the seconds that took, or None if it did not
        hold within ``seconds`` (capped by the scenario's budget unless ``capped=False``,
        which cleanup uses)."""
        start = time.monotonic()
        end = start + (self.budget(seconds) if capped else seconds)
        while True:
            if predicate():
                return time.monotonic() - start
            if time.monotonic() >= end:
                return None
            time.sleep(0.1)

    # -- checks ----------------------------------------------------------------------------

    def check(self, name: str, passed: bool, detail: str = "") -> bool:
        self.checks.append(Check(name, passed, detail))
        return passed

    def require(self, name: str, passed: bool, detail: str = "") -> None:
        """A check the rest of the script depends on: failing it ends the script."""
        if not self.check(name, passed, detail):
            raise StepFailed(name)

    # -- nodes -----------------------------------------------------------------------------

    def node_args(self, *, faults: bool = True) -> list[str]:
        args = [a for k, v in self.flags.items() for a in ("--" + k, v)]
        if faults and self.faults:
            args += ["--runner-faults", self.faults]
        return args

    def start_node(self, *, wait_ready: bool = True, faults: bool = True) -> Node:
        """Start a node with the scenario's flags (and faults, unless ``faults=False``) and
        watch it; with ``wait_ready`` require ``/health`` 200 within the load deadlines."""
        index = len(self.nodes) + 1
        process = NodeProcess(self.home, *self.node_args(faults=faults))
        what = f"node {index} started"
        try:
            process.start(wait_ready=False)
        except AssertionError as exc:
            self.require(what, False, str(exc)[-2000:])
        assert process.proc is not None
        recorder = Recorder(index, process.url, process.proc.pid)
        node = Node(index, process, recorder)
        self.nodes.append(node)
        recorder.start()
        if wait_ready:
            limit = self.setting("hello-timeout") + self.setting("load-timeout") + MARGIN
            took = self.wait_until(lambda: node.get("/health").status == 200, limit)
            self.require(
                f"node {index} ready",
                took is not None,
                f"/health 200 after {took:.1f}s"
                if took is not None
                else f"/health: {node.get('/health').describe()}",
            )
        return node

    # -- cleanup ---------------------------------------------------------------------------

    def finish(self) -> None:
        """Stop every node, then require that no runner outlives it; always bounded."""
        for node in self.nodes:
            self._stop_node(node)
        pids = {(node.index, pid) for node in self.nodes for pid in node.recorder.pids()}
        took = self.wait_until(
            lambda: not any(pid_alive(p) for _, p in pids), RUNNER_EXIT_BUDGET, capped=False
        )
        alive = sorted(p for _, p in pids if pid_alive(p))
        for pid in alive:
            if is_runner(pid):
                try:
                    os.killpg(pid, signal.SIGKILL)  # runners lead their own process group
                except OSError:
                    os.kill(pid, signal.SIGKILL)
        listed = ", ".join(str(p) for _, p in sorted(pids)) or "none"
        self.check(
            "no stray processes",
            not alive and took is not None,
            f"runner pids seen: {listed}; all gone after the nodes stopped"
            if not alive
            else f"still running after {RUNNER_EXIT_BUDGET:g}s: {alive} (killed now)",
        )

    def close(self) -> None:
        """Disarm the watchdog (after :meth:`finish`, or instead of it)."""
        self._watchdog.cancel()

    def _stop_node(self, node: Node) -> None:
        if node.stopped:
            return
        node.stopped = True
        proc = node.process.proc
        assert proc is not None
        if proc.poll() is None:
            node.recorder.poll()  # the final view, with the last events
        node.recorder.stop()
        if node.killed:
            proc.wait(NODE_EXIT_BUDGET)  # SIGKILLed: the kernel reaps it at once
            return
        if proc.poll() is not None:
            self.check(
                f"node {node.index} still running at the end",
                False,
                f"it exited early with {proc.returncode}",
            )
            return
        begin = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code: int | None = proc.wait(NODE_EXIT_BUDGET)
        except subprocess.TimeoutExpired:
            code = None
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        took = time.monotonic() - begin
        self.check(
            f"node {node.index} shut down cleanly on SIGTERM",
            code == 0,
            f"exit {code} after {took:.1f}s"
            if code is not None
            else f"still running after {NODE_EXIT_BUDGET:g}s (SIGKILLed)",
        )

    def kill_everything(self) -> None:
        """SIGKILL every node group and every runner seen (the watchdog's last resort)."""
        for node in self.nodes:
            proc = node.process.proc
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            for pid in node.recorder.pids():
                if pid_alive(pid) and is_runner(pid):
                    os.kill(pid, signal.SIGKILL)

    def _stuck(self) -> None:
        print("repro: the run overstayed its hard limit; killing everything", file=sys.stderr)
        try:
            self.kill_everything()
        finally:
            os._exit(3)
