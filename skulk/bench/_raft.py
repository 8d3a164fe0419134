"""``python -m skulk.bench raft``: Raft commit latency, throughput and failover vs pysyncobj.

Each system runs as three replica processes on loopback (:mod:`skulk.bench._raftnode`), with
fsync on, replicating the same counter with exactly-once sessions; the client side is the
same for both (the replicas' JSON control protocol, one TCP connection per client task):

* **sequential**: one client, ``sequential`` commands one at a time to the leader: commit
  latency p50/p99 with no load (``idle_commit_*``);
* **concurrent**: ``clients`` tasks each submitting one command at a time to the leader for
  ``duration`` s: committed commands/s and commit latency p50/p99 under that load
  (``commit_*``, ``commits_per_s``);
* **failover** (``trials`` times): kill -9 the leader, then submit to the survivors (0.2 s per
  attempt, same (client, seq) until one commits): the time from the kill to that commit, in
  election timeouts (``election_ticks * tick``; both systems use the same timeout range
  ``[T, 2T)``). The killed replica is restarted and caught up before the next trial.

Ratios are ours / pysyncobj's for throughput (> 1: we commit more per second) and latency
(< 1: we are faster).

``rounds`` > 1 measures each system that many times, alternating which goes first, and
reports the median of each figure and the median of the per-round ratios (a shared machine's
load drifts: pairing neighbouring runs cancels most of it). ``levels`` measures several client
counts in one run (``levels`` in the result, one entry per count).
"""

from __future__ import annotations

import math
import os
import secrets
import signal
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import attrs
import trio

from ._raftnode import Json, read_json, write_json

NAMES = ("n1", "n2", "n3")


@attrs.frozen
class Settings:
    clients: int = 128
    duration: float = 5.0
    sequential: int = 200
    trials: int = 10
    tick: float = 0.05
    election_ticks: int = 10
    baseline_fsync: bool = True
    rounds: int = 1
    levels: tuple[int, ...] = ()
    """Client counts to measure (empty: just ``clients``)."""

    @property
    def election_timeout(self) -> float:
        return self.tick * self.election_ticks


#: Replica ports are drawn from here: below every kernel's ephemeral range, so no outgoing
#: connection (the benchmark's own status polls, the replicas' dials) can be given one as its
#: source port between the draw and the replica's bind.
PORTS = range(20000, 32000)
#: Seconds a killed replica has to exit before its restart gives up.
EXIT_DEADLINE = 30.0


def _free_port(taken: set[int]) -> int:
    """A port of :data:`PORTS` free now (bound once to check) and not in ``taken`` (the ports
    drawn before it, free until their replicas bind them); adds it to ``taken``."""
    for _ in range(100):
        port = PORTS.start + secrets.randbelow(len(PORTS))
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            taken.add(port)
            return port
    raise OSError(f"no free port in {PORTS.start}-{PORTS.stop - 1}")


class Client:
    """One control connection to a replica."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._buffer = bytearray()

    @classmethod
    async def connect(cls, port: int) -> Client:
        return cls(await trio.open_tcp_stream("127.0.0.1", port))

    async def request(self, value: Json) -> Json:
        await write_json(self._stream, value)
        reply = await read_json(self._stream, self._buffer)
        if reply is None:
            raise trio.BrokenResourceError("replica closed the control connection")
        return reply

    async def submit(self, client: str, seq: int, budget: float) -> Json:
        """Submit one command; the replica gives up after ``budget`` seconds."""
        return await self.request({"op": "submit", "client": client, "seq": seq, "timeout": budget})

    async def aclose(self) -> None:
        await self._stream.aclose()


class Cluster:
    """Three replica processes of one system, each in its own process group."""

    def __init__(self, system: str, root: Path, settings: Settings) -> None:
        self.system = system
        self.root = root
        self.settings = settings
        taken: set[int] = set()
        self.peer_ports = {n: _free_port(taken) for n in NAMES}
        self.control = {n: _free_port(taken) for n in NAMES}
        self.procs: dict[str, trio.Process] = {}
        #: Killed incarnations by replica, until reaped.
        self.dead: dict[str, list[trio.Process]] = {}
        self.env = dict(os.environ, SKULK_CLUSTER_SECRET=secrets.token_hex(32))

    async def start(self, name: str) -> None:
        # A killed incarnation holds its ports until it has exited, which SIGKILL does not make
        # instant (a process waiting on an fsync exits when the fsync ends).
        try:
            with trio.fail_after(EXIT_DEADLINE):
                for old in self.dead.get(name, ()):
                    await old.wait()
        except trio.TooSlowError:
            raise RuntimeError(
                f"{self.system} replica {name}: killed, still running after {EXIT_DEADLINE:g} s"
            ) from None
        nodes = ",".join(f"{n}=127.0.0.1:{p}" for n, p in self.peer_ports.items())
        command = [
            sys.executable, "-m", "skulk.bench._raftnode", "--system", self.system,
            "--id", name, "--nodes", nodes, "--control", str(self.control[name]),
            "--dir", str(self.root / name), "--tick", str(self.settings.tick),
            "--election-ticks", str(self.settings.election_ticks),
        ]  # fmt: skip
        if self.system == "pysyncobj" and not self.settings.baseline_fsync:
            command.append("--no-fsync")
        log = open(self.root / f"{name}.log", "ab")  # noqa: ASYNC230 - a local file, once
        try:
            self.procs[name] = await trio.lowlevel.open_process(
                command, stdout=log, stderr=log, env=self.env, start_new_session=True
            )
        finally:
            log.close()

    def kill(self, name: str) -> None:
        """kill -9 the replica's process group (it is reaped by :meth:`reap`)."""
        proc = self.procs.pop(name, None)
        if proc is not None:
            self.dead.setdefault(name, []).append(proc)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    async def reap(self) -> None:
        for name in list(self.procs):
            self.kill(name)
        with trio.move_on_after(10, shield=True):
            for procs in self.dead.values():
                for proc in procs:
                    await proc.wait()

    async def status(self, name: str) -> Json | None:
        try:
            with trio.fail_after(1.0):
                client = await Client.connect(self.control[name])
                try:
                    return await client.request({"op": "status"})
                finally:
                    await client.aclose()
        except (OSError, trio.TooSlowError, trio.BrokenResourceError):
            return None

    async def wait_agreed(self, limit: float = 30.0) -> str:
        """Wait until every running replica names the same leader and has applied as much as
        it; return the leader. A replica that exited, or no agreement within ``limit``
        seconds, raises with what each replica said and the tail of each one's log."""
        deadline = trio.current_time() + limit
        while True:
            found = {n: await self.status(n) for n in self.procs}
            leaders = {s.get("leader") for s in found.values() if s is not None}
            if None not in found.values() and len(leaders) == 1 and None not in leaders:
                commits = {s["commit"] for s in found.values() if s is not None}
                if len(commits) == 1:
                    leader = leaders.pop()
                    assert isinstance(leader, str)
                    return leader
            exited = [n for n, p in self.procs.items() if p.returncode is not None]
            if exited or trio.current_time() > deadline:
                why = f"{', '.join(exited)} exited" if exited else f"no agreement in {limit:g} s"
                raise RuntimeError(f"{self.system} replicas: {why}; status {found}\n{self.logs()}")
            await trio.sleep(0.05)

    def logs(self, tail: int = 2000) -> str:
        """The end of each replica's log."""
        out = []
        for name in NAMES:
            path = self.root / f"{name}.log"
            text = path.read_text(errors="replace")[-tail:] if path.exists() else "(no log)"
            out.append(f"--- {name} ---\n{text}")
        return "\n".join(out)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


async def _sequential(cluster: Cluster, leader: str, count: int) -> list[float]:
    client = await Client.connect(cluster.control[leader])
    latencies = []
    try:
        for seq in range(1, count + 1):
            started = time.perf_counter()
            reply = await client.submit("seq-client", seq, 5.0)
            latencies.append(time.perf_counter() - started)
            if not reply["ok"]:
                raise RuntimeError(f"{cluster.system}: sequential submit failed: {reply}")
    finally:
        await client.aclose()
    return latencies


async def _concurrent(
    cluster: Cluster, leader: str, settings: Settings
) -> tuple[int, float, list[float]]:
    latencies: list[float] = []
    failures = 0
    clients = [await Client.connect(cluster.control[leader]) for _ in range(settings.clients)]
    stop = time.perf_counter() + settings.duration

    async def worker(k: int, client: Client) -> None:
        nonlocal failures
        seq = 0
        while time.perf_counter() < stop:
            seq += 1
            started = time.perf_counter()
            reply = await client.submit(f"load-{k}", seq, 5.0)
            if reply["ok"]:
                latencies.append(time.perf_counter() - started)
            else:
                failures += 1

    began = time.perf_counter()
    try:
        async with trio.open_nursery() as nursery:
            for k, client in enumerate(clients):
                nursery.start_soon(worker, k, client)
    finally:
        for client in clients:
            await client.aclose()
    return failures, time.perf_counter() - began, latencies


async def _failover(cluster: Cluster, trial: int) -> float:
    leader = await cluster.wait_agreed()
    survivors = [n for n in NAMES if n != leader]
    cluster.kill(leader)
    killed = time.perf_counter()
    with trio.fail_after(60):
        attempt = 0
        while True:
            target = survivors[attempt % 2]
            attempt += 1
            try:
                client = await Client.connect(cluster.control[target])
                try:
                    reply = await client.submit(f"failover-{trial}", 1, 0.2)
                finally:
                    await client.aclose()
                if reply["ok"]:
                    elapsed = time.perf_counter() - killed
                    break
            except (OSError, trio.BrokenResourceError):
                await trio.sleep(0.01)
    await cluster.start(leader)
    await cluster.wait_agreed(60)
    return elapsed


@contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="skulk-raft-bench-") as tmp:
        yield Path(tmp)


async def measure(system: str, settings: Settings) -> dict[str, Any]:
    """Run every phase against a fresh three-replica cluster of ``system``."""
    with _workdir() as root:
        cluster = Cluster(system, root, settings)
        try:
            for name in NAMES:
                await cluster.start(name)
            leader = await cluster.wait_agreed(60)
            await _sequential(cluster, leader, 20)  # warm-up
            idle = await _sequential(cluster, leader, settings.sequential)
            failures, elapsed, loaded = await _concurrent(cluster, leader, settings)
            elections = [await _failover(cluster, t) for t in range(settings.trials)]
        finally:
            await cluster.reap()
    timeout = settings.election_timeout
    result: dict[str, Any] = {
        "idle_commit_p50_ms": round(statistics.median(idle) * 1000, 2),
        "idle_commit_p99_ms": round(_percentile(idle, 0.99) * 1000, 2),
        "commit_p50_ms": round(statistics.median(loaded) * 1000, 2),
        "commit_p99_ms": round(_percentile(loaded, 0.99) * 1000, 2),
        "commits_per_s": round(len(loaded) / elapsed, 1),
        "failed_submits": failures,
    }
    if elections:
        result["election_p50_timeouts"] = round(statistics.median(elections) / timeout, 2)
        result["election_p99_timeouts"] = round(_percentile(elections, 0.99) / timeout, 2)
        result["election_p50_ms"] = round(statistics.median(elections) * 1000, 1)
    return result


def _medians(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each figure's median over ``runs`` (failed submissions: their sum)."""
    out: dict[str, Any] = {}
    for key in runs[0]:
        values = [r[key] for r in runs if key in r]
        if key == "failed_submits":
            out[key] = sum(values)
        else:
            out[key] = round(statistics.median(values), 2)
    return out


def _ratio(ours: list[dict[str, Any]], theirs: list[dict[str, Any]], key: str) -> float:
    """The median over rounds of ours / theirs for ``key`` (runs paired by round)."""
    ratios = [o[key] / t[key] for o, t in zip(ours, theirs, strict=True) if t[key] > 0]
    return round(statistics.median(ratios), 3) if ratios else math.nan


def _summary(ours: list[dict[str, Any]], theirs: list[dict[str, Any]]) -> dict[str, Any]:
    result = _medians(ours)
    if theirs:
        result["throughput_ratio_vs_pysyncobj"] = _ratio(ours, theirs, "commits_per_s")
        result["commit_p50_ratio_vs_pysyncobj"] = _ratio(ours, theirs, "commit_p50_ms")
        result["idle_commit_p50_ratio_vs_pysyncobj"] = _ratio(ours, theirs, "idle_commit_p50_ms")
        result["pysyncobj"] = _medians(theirs)
    return result


def run(settings: Settings, *, baseline: bool = True) -> dict[str, object]:
    systems = ("skulk", "pysyncobj") if baseline else ("skulk",)
    summaries = []
    for clients in settings.levels or (settings.clients,):
        level = attrs.evolve(settings, clients=clients)
        runs: dict[str, list[dict[str, Any]]] = {system: [] for system in systems}
        for round_ in range(max(1, settings.rounds)):
            for system in systems if round_ % 2 == 0 else systems[::-1]:
                runs[system].append(trio.run(measure, system, level))
        summaries.append((clients, _summary(runs["skulk"], runs.get("pysyncobj", []))))
    result: dict[str, object] = {
        "benchmark": "raft",
        "replicas": 3,
        "fsync": True,
        "pysyncobj_fsync": settings.baseline_fsync,
        "clients": settings.clients,
        "duration_s": settings.duration,
        "election_timeout_ms": round(settings.election_timeout * 1000, 1),
        "trials": settings.trials,
        "rounds": max(1, settings.rounds),
    }
    if settings.levels:
        result["levels"] = [{"clients": clients, **summary} for clients, summary in summaries]
    else:
        result.update(summaries[0][1])
    return result


def table(result: dict[str, Any]) -> str:
    if "levels" in result:
        rows: list[tuple[str, ...]] = [("clients", "skulk/s", "pysyncobj/s", "ratio", "idle p50")]
        for level in result["levels"]:
            theirs = level.get("pysyncobj", {})
            rows.append(
                (
                    str(level["clients"]),
                    str(level["commits_per_s"]),
                    str(theirs.get("commits_per_s", "-")),
                    str(level.get("throughput_ratio_vs_pysyncobj", "-")),
                    str(level["idle_commit_p50_ms"]),
                )
            )
        return "\n".join(f"{a:<8} {b:>10} {c:>12} {d:>8} {e:>12}" for a, b, c, d, e in rows)
    theirs = result.get("pysyncobj", {})
    pairs = [("", "skulk", "pysyncobj")]
    for key in (
        "commits_per_s",
        "commit_p50_ms",
        "commit_p99_ms",
        "idle_commit_p50_ms",
        "idle_commit_p99_ms",
        "election_p50_timeouts",
        "election_p99_timeouts",
    ):
        pairs.append((key, str(result.get(key, "-")), str(theirs.get(key, "-"))))
    return "\n".join(f"{a:<24} {b:>10} {c:>10}" for a, b, c in pairs)
