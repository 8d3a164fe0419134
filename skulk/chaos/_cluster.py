"""The chaos run's cluster: N real ``python -m skulk serve`` processes on loopback.

Every node has its own data dir (its own node id, its Raft storage; the demo model linked from
one shared models dir), fixed loopback ports (the API and the federation listener keep their
ports across restarts, so the other nodes' dialers find a restarted node where it was; all of
them, compute ports included, below the kernel's ephemeral range: :func:`port_block`) and
``--model none``: the load places every instance itself, so every instance in the State is
one a client asked for. Node 1 founds the cluster; the others ``--join`` every other node (a
node restarted while node 1 is down still finds the cluster).

With ``links`` every node dials every other through its own :class:`~skulk.harness.LinkProxy`
(its ``--join`` URLs are the proxies) and listens on the wildcard address, which gossip never
dials: so every link between two nodes passes a proxy the run controls. Only inside a private
network namespace (:mod:`skulk.chaos._namespace`).

:meth:`ChaosNode.kill` SIGKILLs the node process alone — its runners must notice on their own
(their parent watchdog) — and :meth:`ChaosNode.restart` starts it again on the same data dir.
:meth:`ChaosNode.pause` SIGSTOPs the node process alone (its runners, in their own process
groups, go on). A sampler thread records every runner pid each node ever had, so the stray
check finds runners that outlived a killed node too.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import threading
from collections.abc import Mapping
from pathlib import Path

import httpx

from skulk.chaos._clock import clock_env
from skulk.chaos._disk import NODE_DISK_BYTES
from skulk.chaos._namespace import mount_small_fs, unmount
from skulk.config import COMPUTE_PORTS_COUNT
from skulk.harness import NodeProcess, Proxies
from skulk.repro import runner_children
from skulk.runner import PRODUCED_FILE_ENV

#: Node output lines kept (the summary prints a failing node's tail).
LOG_KEPT = 2000
SAMPLE_INTERVAL = 0.5


#: Ports per node: the API, the federation listener, then its runners' compute ports.
PORTS_PER_NODE = 2 + COMPUTE_PORTS_COUNT
#: The lowest port a run uses.
PORT_FLOOR = 10000


def ephemeral_floor() -> int:
    """The lowest port the kernel hands out to outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_block(count: int, host: str = "127.0.0.1") -> int:
    """The first of ``count`` consecutive ports below the kernel's ephemeral range, the first
    two of every :data:`PORTS_PER_NODE` free now. A node keeps its ports across restarts, so
    they must never be ones an outgoing connection may take meanwhile (a node restarted on an
    ephemeral port once found it held by one of the load's connections)."""
    rng = random.Random()
    top = ephemeral_floor() - count
    for _ in range(1000):
        base = rng.randrange(PORT_FLOOR, top)
        if all(_bindable(host, base + i * PORTS_PER_NODE + j)
               for i in range(count // PORTS_PER_NODE) for j in (0, 1)):  # fmt: skip
            return base
    raise RuntimeError(f"no free block of {count} ports in {PORT_FLOOR}-{ephemeral_floor()}")


def _bindable(host: str, port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class ChaosNode:
    """One node of the run (``index`` 1-based)."""

    def __init__(
        self,
        index: int,
        home: Path,
        args: list[str],
        env: Mapping[str, str],
        listen_host: str,
        first_port: int,
    ) -> None:
        self.index = index
        self.listen_host = listen_host
        self.home = home
        self.api_port = first_port
        self.fed_port = first_port + 1
        compute = f"{first_port + 2}-{first_port + PORTS_PER_NODE - 1}"
        self.args = [*args, "--compute-ports", compute]
        self.env = dict(env)
        self.process: NodeProcess | None = None
        self.paused = False
        self.killed = False
        self.starts = 0
        #: Held by a fault from its injection until it healed (a restart included, which may
        #: take longer than the schedule thought): the next fault on this node waits for it.
        self.faulted = threading.Lock()
        self._node_id = ""

    @property
    def node_id(self) -> str:
        """The node's id, once its output said it (a restart keeps it: same data dir)."""
        if self.process is not None and self.process.node_id:
            self._node_id = self.process.node_id
        return self._node_id

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.fed_port}"

    @property
    def pid(self) -> int | None:
        proc = self.process.proc if self.process is not None else None
        return proc.pid if proc is not None and proc.poll() is None else None

    @property
    def running(self) -> bool:
        """The process runs (it may be paused)."""
        return self.pid is not None

    @property
    def serving(self) -> bool:
        return self.running and not self.paused

    def start(self, join: list[str]) -> None:
        """Start (or restart) the node; returns once it listens (not once it is healthy)."""
        extra = [*self.args, "--port", str(self.api_port), "--listen",
                 f"{self.listen_host}:{self.fed_port}"]  # fmt: skip
        for url in join:
            extra += ["--join", url]
        self.process = NodeProcess(self.home, *extra, env=self.env, keep=LOG_KEPT)
        self.process.start(wait_ready=False)
        self.killed = False
        self.paused = False
        self.starts += 1

    def kill(self) -> None:
        if (pid := self.pid) is not None:
            self.resume()
            os.kill(pid, signal.SIGKILL)
            assert self.process is not None and self.process.proc is not None
            self.process.proc.wait(30)
        self.killed = True

    def pause(self) -> None:
        if (pid := self.pid) is not None:
            os.kill(pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.paused and (pid := self.pid) is not None:
            os.kill(pid, signal.SIGCONT)
        self.paused = False

    def stop(self) -> None:
        self.resume()
        if self.process is not None:
            self.process.stop()

    def log_tail(self, lines: int = 40) -> list[str]:
        if self.process is None:
            return []
        return [ln for ln in self.process.output if "skulk.access" not in ln][-lines:]


class ChaosCluster:
    """The nodes, and every runner pid each one had (node index → pids)."""

    def __init__(
        self,
        root: Path,
        models: Path,
        count: int,
        flags: Mapping[str, str],
        *,
        links: bool = False,
        clock: bool = False,
        disks: bool = False,
    ) -> None:
        self.root = root
        self.links = links
        self.disks = disks
        self.proxies = Proxies()
        self._proxy_ports: dict[tuple[int, int], int] = {}
        env = {"SKULK_CLUSTER_SECRET": os.urandom(32).hex()}
        args = [a for k, v in flags.items() for a in ("--" + k, v)]
        args += ["--model", "none", "--log-level", "warning"]
        self.nodes: list[ChaosNode] = []
        host = "0.0.0.0" if links else "127.0.0.1"
        base = port_block(count * PORTS_PER_NODE, host)
        for i in range(1, count + 1):
            home = root / f"node{i}"
            home.mkdir()
            if disks:  # a filesystem of its own, that a disk fault fills
                mount_small_fs(home, NODE_DISK_BYTES)
            (home / "models").symlink_to(models)
            node_env = clock_env(home, env) if clock else env
            # Outside the node's data dir: a full disk must not cut the record short.
            node_env = {**node_env, PRODUCED_FILE_ENV: str(root / f"node{i}.produced.jsonl")}
            first = base + (i - 1) * PORTS_PER_NODE
            self.nodes.append(ChaosNode(i, home, args, node_env, host, first))
        self._runner_pids: dict[int, set[int]] = {n.index: set() for n in self.nodes}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sampler = threading.Thread(target=self._sample, name="chaos-pids", daemon=True)

    def produced_files(self) -> list[Path]:
        """Each node's record of what its runners produced (see
        :mod:`skulk.runner._produced`)."""
        return [self.root / f"node{n.index}.produced.jsonl" for n in self.nodes]

    def node(self, index: int) -> ChaosNode:
        return self.nodes[index - 1]

    def join_urls(self, node: ChaosNode) -> list[str]:
        """Whom ``node`` joins: nobody for the founder, every other node otherwise."""
        if node.index == 1:
            return []
        if self.links:
            return [f"ws://127.0.0.1:{self._proxy_ports[(node.index, n.index)]}"
                    for n in self.nodes if n is not node]  # fmt: skip
        return [n.ws_url for n in self.nodes if n is not node]

    def start(self) -> None:
        if self.links:
            self._proxy_ports = self.proxies.start(
                {(a.index, b.index): b.fed_port for a in self.nodes for b in self.nodes if a != b}
            )
        for node in self.nodes:
            node.start(self.join_urls(node))
        self._sampler.start()

    def restart(self, node: ChaosNode) -> None:
        node.start(self.join_urls(node))

    def leader(self) -> int | None:
        """The index of the node that the first answering node's Raft names leader."""
        for node in self.nodes:
            if not node.serving:
                continue
            try:
                leader = httpx.get(node.url + "/v1/cluster/raft", timeout=3.0).json().get("leader")
            except (httpx.HTTPError, ValueError, AttributeError):
                continue
            found = next((n.index for n in self.nodes if n.node_id and n.node_id == leader), None)
            if found is not None:
                return found
        return None

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL):
            self.sample()

    def sample(self) -> None:
        """Record each running node's runner children now."""
        for node in self.nodes:
            if (pid := node.pid) is not None:
                found = runner_children(pid)
                with self._lock:
                    self._runner_pids[node.index] |= found

    def runner_pids(self) -> dict[int, set[int]]:
        with self._lock:
            return {k: set(v) for k, v in self._runner_pids.items()}

    def stop(self) -> None:
        """Stop every node (all at once: SIGTERM to each, then wait)."""
        self._stop.set()
        for node in self.nodes:
            node.resume()
            proc = node.process.proc if node.process is not None else None
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for node in self.nodes:
            node.stop()  # waits, SIGKILLs the group if the node does not exit
            if self.disks:
                unmount(node.home)
        self.proxies.stop()
