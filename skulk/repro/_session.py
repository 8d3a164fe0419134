"""One run of one scenario: its nodes, its deadline, its checks and its cleanup.

Every wait a script makes goes through :meth:`Session.budget` (capped by what is left of the
scenario's budget) or :meth:`Session.wait_until` (polling with a deadline), and a last-resort
watchdog kills every process the run started and exits if the run as a whole overstays, so a
repro can fail but never hang.

A single-node scenario starts its nodes on the shared data dir (:meth:`Session.start_node`). A
distributed one starts a cluster (:meth:`Session.start_cluster_node`): each node its own data
dir in a temporary directory (its own node id; the demo model linked from the shared dir), one
cluster secret for the run, ``--model none``, its own runner faults; the first founds the
cluster, the others join it. The :class:`~skulk.repro._cluster.ClusterWatch` polls the cluster
from the first node on. Cleanup resumes a paused node, stops every node at once and checks that
no runner of any node outlives it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from skulk.harness import NodeProcess, pid_alive
from skulk.repro._client import Reply, request
from skulk.repro._cluster import ClusterWatch
from skulk.repro._recorder import Recorder, is_runner, runner_children
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
#: Node output lines kept for the checks that read the log (a flight-recorder dump alone is up
#: to 256 lines).
LOG_KEPT = 20000
#: How long a node of a cluster has to come up, and a cluster to see all its nodes up.
JOIN_BUDGET = 60.0


class Node:
    """A node this session started, with the recorder watching it."""

    def __init__(self, index: int, process: NodeProcess, recorder: Recorder) -> None:
        self.index = index
        self.process = process
        self.recorder = recorder
        self.killed = False
        self.stopped = False
        self.paused = False

    @property
    def url(self) -> str:
        return self.process.url

    @property
    def node_id(self) -> str:
        return self.process.node_id

    @property
    def ws_url(self) -> str:
        """Where other nodes ``--join`` this one."""
        return self.process.ws_url

    @property
    def name(self) -> str:
        """``node 2 (node-5dfe…)``: how checks name it."""
        return f"node {self.index} ({self.node_id})" if self.node_id else f"node {self.index}"

    @property
    def serving(self) -> bool:
        """Whether the node process runs and is not paused (it can answer)."""
        proc = self.process.proc
        return proc is not None and proc.poll() is None and not self.paused

    def runner_pids(self) -> set[int]:
        """The runner processes of this node now."""
        return runner_children(self.pid)

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

    def pause(self) -> None:
        """SIGSTOP the node process alone: its runners (each in its own process group) go on,
        its links fall silent."""
        self.paused = True
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.paused:
            os.kill(self.pid, signal.SIGCONT)
            self.paused = False

    def log_lines(self, *, containing: str = "") -> list[str]:
        """The node's output lines (the last :data:`LOG_KEPT`) that contain ``containing``."""
        return [line for line in list(self.process.output) if containing in line]

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
        node_faults: Mapping[int, str] | None = None,
        compute_ports: int | None = None,
        break_node_flags: Mapping[int, Mapping[str, str]] | None = None,
    ) -> None:
        self.home = home
        self.break_node_flags = {n: dict(f) for n, f in (break_node_flags or {}).items()}
        #: Run after every node stopped (:meth:`defer`), newest first.
        self._deferred: list[Callable[[], None]] = []
        self.faults = faults
        self.node_faults = dict(node_faults or {})
        self.compute_ports = compute_ports
        self.flags = {**BASE_FLAGS, **flags}
        self.secret = secrets.token_hex(32)
        self._cluster_dir: Path | None = None  # the data dirs of cluster nodes, made on demand
        self.watch = ClusterWatch(self._answering_urls, self._index_of)
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

    def _launch(self, process: NodeProcess, *, cluster: bool) -> Node:
        index = len(self.nodes) + 1
        try:
            process.start(wait_ready=False)
        except AssertionError as exc:
            self.require(f"node {index} started", False, str(exc)[-2000:])
        assert process.proc is not None
        recorder = Recorder(index, process.url, process.proc.pid, runners=not cluster)
        node = Node(index, process, recorder)
        self.nodes.append(node)
        recorder.start()
        return node

    def start_node(self, *, wait_ready: bool = True, faults: bool = True) -> Node:
        """Start a node with the scenario's flags (and faults, unless ``faults=False``) and
        watch it; with ``wait_ready`` require ``/health`` 200 within the load deadlines."""
        index = len(self.nodes) + 1
        node = self._launch(
            NodeProcess(self.home, *self.node_args(faults=faults), keep=LOG_KEPT), cluster=False
        )
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

    def start_cluster_node(
        self, *, join: Node | None = None, flags: Mapping[str, str] | None = None
    ) -> Node:
        """Start one node of this run's cluster: its own data dir (so its own node id; the
        demo model linked from the shared one), the run's cluster secret, ``--model none``
        (capacity only: scripts place what they need), the scenario's flags plus ``flags``,
        and its runner faults (``Scenario.node_faults`` by its number). It founds the cluster,
        or joins ``join``'s. Requires that it listens; the watch polls the cluster from then."""
        index = len(self.nodes) + 1
        if self._cluster_dir is None:
            self._cluster_dir = Path(tempfile.mkdtemp(prefix="skulk-repro-cluster-"))
        home = self._cluster_dir / f"node{index}"
        home.mkdir()
        (home / "models").symlink_to((self.home / "models").resolve())
        args = [*self.node_args(faults=False), "--model", "none"]
        extra = {**(flags or {}), **self.break_node_flags.get(index, {})}
        args += [a for k, v in extra.items() for a in ("--" + k, v)]
        if faults := self.node_faults.get(index):
            args += ["--runner-faults", faults]
        if join is not None:
            args += ["--join", join.ws_url]
        if self.compute_ports is not None:
            first, last = free_port_range(self.compute_ports)
            args += ["--compute-ports", f"{first}-{last}"]
        env = {"SKULK_CLUSTER_SECRET": self.secret}
        node = self._launch(NodeProcess(home, *args, env=env, keep=LOG_KEPT), cluster=True)
        self.watch.start()
        return node

    def _answering_urls(self) -> list[str]:
        return [n.url for n in self.nodes if n.serving]

    def _index_of(self, node_id: str) -> int:
        return next((n.index for n in self.nodes if n.node_id == node_id), 0)

    def by_id(self, node_id: str) -> Node | None:
        return next((n for n in self.nodes if n.node_id == node_id), None)

    # -- cleanup ---------------------------------------------------------------------------

    def defer(self, cleanup: Callable[[], None]) -> None:
        """Run ``cleanup`` once every node has stopped (link proxies, say), even if the
        script failed."""
        self._deferred.append(cleanup)

    def finish(self) -> None:
        """Stop every node (all at once), then require that no runner outlives its node;
        always bounded. A paused node is resumed first."""
        self.watch.stop()
        for node in self.nodes:
            node.resume()
        begun = {node.index: self._signal_stop(node) for node in self.nodes}
        for node in self.nodes:
            self._await_stop(node, begun[node.index])
        while self._deferred:
            self._deferred.pop()()
        if self._cluster_dir is not None:
            shutil.rmtree(self._cluster_dir, ignore_errors=True)
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

    def _signal_stop(self, node: Node) -> float | None:
        """Take the node's last view and SIGTERM it; when that was sent (None: not sent)."""
        if node.stopped:
            return None
        node.stopped = True
        proc = node.process.proc
        assert proc is not None
        if proc.poll() is None:
            node.recorder.poll()  # the final view, with the last events
        node.recorder.stop()
        if node.killed or proc.poll() is not None:
            return None
        proc.send_signal(signal.SIGTERM)
        return time.monotonic()

    def _await_stop(self, node: Node, begin: float | None) -> None:
        proc = node.process.proc
        assert proc is not None
        if node.killed:
            proc.wait(NODE_EXIT_BUDGET)  # SIGKILLed: the kernel reaps it at once
            return
        if begin is None:
            if proc.returncode is not None:  # it exited before it was stopped
                self.check(
                    f"node {node.index} still running at the end",
                    False,
                    f"it exited early with {proc.returncode}",
                )
            return
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
        self.watch.stop()
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


def free_port_range(count: int) -> tuple[int, int]:
    """``count`` consecutive loopback ports that are free now (``count`` 1: any free one)."""
    if count == 1:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        return port, port
    for _ in range(200):
        first = secrets.randbelow(60000 - 20000) + 20000
        if all(_bindable(p) for p in range(first, first + count)):
            return first, first + count - 1
    raise RuntimeError(f"no {count} consecutive free ports found")


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
