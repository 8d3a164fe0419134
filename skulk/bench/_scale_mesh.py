"""The scaling benchmark's meshes and load: N real model-less nodes on loopback, and a steady
stream of placements through them.

:class:`ScaleMesh` starts ``python -m skulk serve --model none`` N times
(:class:`~skulk.harness.NodeProcess`; each with its own data dir and the demo model linked from
one shared models dir): the first founds the cluster, the rest ``--join`` it and find each
other through gossip. It is converged when every node has a link up to every other and sees
every node ``up`` in its State. :meth:`ScaleMesh.stop` SIGTERMs them all at once, then reaps
each (SIGKILLing the process group of one that lingers).

:class:`PlacementLoad` places the demo model on one node at a time (round-robin, asked through
another node's API, so the ask is forwarded to the leader as a client's would be) and deletes
the instance once placed: each cycle commits at least a ``PlaceInstance`` and a
``DeleteInstance``, plus the ``ReportRunner`` phases the target reports meanwhile (its runner
starts and is stopped: the node's own process is what the benchmark measures).
"""

from __future__ import annotations

import concurrent.futures
import signal
import threading
import time
from pathlib import Path

import attrs
import httpx

from skulk.harness import NodeProcess

from ._scale_metrics import Scrape, parse, total

SECRET = "5c" * 32
#: Nodes started at once (their imports are CPU-bound: more only queue on the cores).
START_WORKERS = 4


class ScaleMesh:
    """``count`` nodes under ``root`` (see the module doc)."""

    def __init__(
        self, root: Path, models: Path, count: int, node_args: tuple[str, ...] = ()
    ) -> None:
        """``node_args``: more ``skulk serve`` options for every node."""
        self.nodes: list[NodeProcess] = []
        self._root = root
        self._models = models
        self._count = count
        self._node_args = node_args

    def _node(self, index: int, *join: str) -> NodeProcess:
        home = self._root / f"node{index}"
        home.mkdir()
        (home / "models").symlink_to(self._models)
        joins = [a for url in join for a in ("--join", url)]
        args = ("--model", "none", "--log-level", "warning", *self._node_args, *joins)
        return NodeProcess(home, *args, env={"SKULK_CLUSTER_SECRET": SECRET}, keep=200)

    def start(self) -> None:
        """Start the founder, then the others joining it (a few at a time); returns once
        every one listens (not once they are linked: :meth:`wait_converged`)."""
        founder = self._node(1)
        self.nodes.append(founder)
        founder.start(wait_ready=False)
        others = [self._node(i, founder.ws_url) for i in range(2, self._count + 1)]
        self.nodes += others
        with concurrent.futures.ThreadPoolExecutor(START_WORKERS) as pool:
            for started in [pool.submit(n.start, wait_ready=False) for n in others]:
                started.result()

    def scrape(self, node: NodeProcess) -> Scrape:
        response = httpx.get(node.url + "/metrics", timeout=30)
        response.raise_for_status()
        return parse(response.text, time.monotonic())

    def scrape_all(self) -> list[Scrape]:
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            return list(pool.map(self.scrape, self.nodes))

    def converged(self) -> bool:
        """Every node has ``count - 1`` links up and sees ``count`` nodes up."""
        want = self._count
        for scrape in self.scrape_all():
            links = total(scrape, "skulk:link_state", state="up")
            if links != want - 1 or total(scrape, "skulk:cluster_nodes", status="up") != want:
                return False
        return True

    def wait_converged(self, deadline: float) -> float:
        """Poll :meth:`converged`; the seconds it took (``RuntimeError`` after ``deadline``)."""
        started = time.monotonic()
        while time.monotonic() - started < deadline:
            for node in self.nodes:
                assert node.proc is not None
                if node.proc.poll() is not None:
                    raise RuntimeError(f"a node exited ({node.proc.returncode}):\n{node.log()}")
            try:
                if self.converged():
                    return time.monotonic() - started
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self._count} nodes not converged within {deadline} s")

    def stop(self) -> None:
        """SIGTERM every node at once, then reap each (SIGKILL if it lingers)."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.send_signal(signal.SIGTERM)
        for node in self.nodes:  # a runner exits within 0.2 s of its node (its watchdog)
            node.stop()


@attrs.define
class LoadCounts:
    """What a :class:`PlacementLoad` did."""

    placed: int = 0
    deleted: int = 0
    #: placements answered with a 4xx/5xx (the leader refused, or was being elected)
    refused: int = 0
    #: calls that failed on the way (time-outs, connection errors)
    errors: int = 0
    #: cycles that could not start on time (the previous one took longer than the interval)
    late: int = 0


class PlacementLoad:
    """Place-and-delete cycles at ``per_min`` a minute over ``nodes`` until :meth:`stop`."""

    def __init__(self, nodes: list[NodeProcess], per_min: float, model: str = "skulk-demo"):
        if per_min <= 0:
            raise ValueError(f"placements per minute must be > 0, not {per_min}")
        self._nodes = nodes
        self._interval = 60.0 / per_min
        self._model = model
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scale-load", daemon=True)
        self.counts = LoadCounts()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> LoadCounts:
        self._stop.set()
        self._thread.join(120)
        return self.counts

    def _run(self) -> None:
        count = len(self._nodes)
        next_at = time.monotonic()
        cycle = 0
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                via = self._nodes[cycle % count]
                target = self._nodes[(cycle + 1) % count]
                cycle += 1
                self._cycle(client, via, target)
                next_at += self._interval
                wait = next_at - time.monotonic()
                if wait < 0:
                    self.counts.late += 1
                    next_at = time.monotonic()
                elif self._stop.wait(wait):
                    return

    def _cycle(self, client: httpx.Client, via: NodeProcess, target: NodeProcess) -> None:
        body = {"model": self._model, "nodes": [target.node_id]}
        try:
            placed = client.post(via.url + "/v1/placements", json=body)
            if placed.status_code != 201:
                self.counts.refused += 1
                return
            self.counts.placed += 1
            instance = placed.json()["instance"]["id"]
            deleted = client.delete(f"{via.url}/v1/instances/{instance}")
            if deleted.status_code == 200:
                self.counts.deleted += 1
            else:
                self.counts.refused += 1
        except (httpx.HTTPError, ValueError, KeyError):
            self.counts.errors += 1
