"""One chaos run: start the cluster, run the load, inject the schedule's faults on time, heal,
observe, check.

The run's flags shorten the cluster's deadlines (:data:`FLAGS`) so faults are detected within
seconds, and the request deadline the ``deadlines`` checker holds every operation to is built
from them (:func:`request_deadline`). A watchdog SIGKILLs every node and exits if the run
overstays its length by :data:`OVERSTAY_S`: a chaos run can fail but never hang.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import attrs

from skulk.chaos._checks import CheckResult, check_all
from skulk.chaos._clock import set_offset
from skulk.chaos._cluster import ChaosCluster, ChaosNode
from skulk.chaos._disk import fill, free
from skulk.chaos._history import FaultRecord, History, Op
from skulk.chaos._load import MODEL, Load
from skulk.chaos._observe import Bounds, Final, kill_orphans, observe
from skulk.chaos._schedule import CLOCK_KINDS, DISK_KINDS, LINK_KINDS, FaultEvent, Schedule
from skulk.harness import LinkMode, ProxyStatistics

#: Deadlines of the nodes in a chaos run (short, so every fault is noticed within seconds).
FLAGS = {
    "progress-timeout": "5",
    "cancel-timeout": "3",
    "shutdown-grace": "1",
    "heartbeat-interval": "0.5",
    "restart-backoff": "0.2",
    "route-idle-timeout": "5",
    "link-liveness-timeout": "3",
    "node-down-after": "4",
    "warmup-timeout": "60",
    "stream-interval": "0",
}
#: What a (16-token, demo model) completion may take on a loaded 2-core machine beyond the
#: fault deadlines, and how long a node may take to start and load on one.
GENERATION_ALLOWANCE_S = 30.0
BOUNDS = Bounds(healthy=90.0, converge=30.0, strays=30.0)
FIRST_PLACEMENT_S = 120.0
OVERSTAY_S = 600.0
CHAT_WORKERS = 3


def request_deadline(flags: dict[str, str]) -> float:
    """The deadline every operation is held to: the API node's two silence deadlines (the
    link's liveness and the routed request's idle deadline), the serving runner's progress
    deadline, and :data:`GENERATION_ALLOWANCE_S`."""
    return (
        float(flags["link-liveness-timeout"])
        + float(flags["route-idle-timeout"])
        + float(flags["progress-timeout"])
        + GENERATION_ALLOWANCE_S
    )


@attrs.frozen
class RunResult:
    schedule: Schedule
    checks: tuple[CheckResult, ...]
    ops: tuple[Op, ...]
    faults: tuple[FaultRecord, ...]
    final: Final | None
    #: Seconds of load (first to last operation).
    load_s: float
    deadline: float
    problem: str = ""
    #: The tail of each node's log, for a failed run.
    logs: dict[int, list[str]] = attrs.field(factory=dict)
    #: With links: what each link proxy carried, by (dialer, target).
    links: dict[tuple[int, int], ProxyStatistics] = attrs.field(factory=dict)

    @property
    def passed(self) -> bool:
        return not self.problem and all(c.passed for c in self.checks)


def _apply(
    cluster: ChaosCluster, event: FaultEvent, history: History, log: Callable[[str], None]
) -> None:
    """Inject ``event``, wait its duration, heal it; recorded in ``history``."""
    start = time.monotonic()
    if event.kind in LINK_KINDS:
        amount = f" ({event.amount:g})" if event.amount else ""
        log(f"t+{event.at:6.1f}s  {event.kind}{amount} link {event.node}->{event.peer} "
            f"for {event.duration:.1f}s")  # fmt: skip
        mode = LinkMode(event.kind, delay_s=event.amount, bytes_per_s=event.amount or 1.0)  # type: ignore[arg-type]
        cluster.proxies.set_link(event.node, event.peer, mode)  # a link fault names both
        index = history.fault(FaultRecord(event.kind, event.node, start, None))
        time.sleep(event.duration)
        cluster.proxies.set_link(event.node, event.peer, LinkMode())
        history.heal(index, time.monotonic())
        return
    if event.kind in CLOCK_KINDS + DISK_KINDS:
        node = cluster.node(event.node)
        with node.faulted:
            _apply_to_home(node, event, history, log)
        return
    target = event.node or cluster.leader()
    if target is None:
        log(f"t+{event.at:6.1f}s  {event.kind} the leader: no node names one; skipped")
        history.fault(FaultRecord(event.kind, 0, start, start, "no leader to fault"))
        return
    node = cluster.node(target)
    with node.faulted:  # a restart may outlast its scheduled heal: the next fault waits
        _apply_to_process(cluster, node, event, history, log)


def _apply_to_process(
    cluster: ChaosCluster,
    node: ChaosNode,
    event: FaultEvent,
    history: History,
    log: Callable[[str], None],
) -> None:
    """A kill or a pause of ``node``'s process, healed (restarted or continued)."""
    start = time.monotonic()
    problem = ""
    target = node.index
    who = f"node {target}" + ("" if event.node else " (the leader)")
    log(f"t+{event.at:6.1f}s  {event.kind} {who} for {event.duration:.1f}s")
    if event.kind == "kill":
        node.kill()
    else:
        node.pause()
    index = history.fault(FaultRecord(event.kind, target, start, None))
    time.sleep(event.duration)
    try:
        if event.kind == "kill":
            cluster.restart(node)
        else:
            node.resume()
    except AssertionError as exc:  # the restart never listened
        problem = str(exc)[-6000:]
    history.heal(index, time.monotonic(), problem)


def _apply_to_home(
    node: ChaosNode, event: FaultEvent, history: History, log: Callable[[str], None]
) -> None:
    """A clock or disk fault: it acts on the node's data dir, the process runs on."""
    start = time.monotonic()
    if event.kind == "clock":
        log(f"t+{event.at:6.1f}s  clock of node {node.index} jumps {event.amount:+g}s "
            f"for {event.duration:.1f}s")  # fmt: skip
        set_offset(node.home, event.amount)
    else:
        filled = fill(node.home)
        log(f"t+{event.at:6.1f}s  disk of node {node.index} full for {event.duration:.1f}s "
            f"({filled / 2**20:.0f} MiB written to fill it)")  # fmt: skip
    index = history.fault(FaultRecord(event.kind, node.index, start, None))
    time.sleep(event.duration)
    if event.kind == "clock":
        set_offset(node.home, 0.0)
    else:
        free(node.home)
    history.heal(index, time.monotonic())


def execute(
    schedule: Schedule, *, home: Path | None = None, log: Callable[[str], None] = print
) -> RunResult:
    """Run ``schedule`` against a fresh cluster of ``schedule.nodes`` nodes; ``home`` is a data
    dir whose ``models/`` (the demo model) is shared (default: a temporary one)."""
    from skulk.models import ensure_demo_model

    root = Path(tempfile.mkdtemp(prefix="skulk-chaos-"))
    models = ensure_demo_model(home or root / "shared").parent
    cluster = ChaosCluster(root, models, schedule.nodes, FLAGS, links=schedule.links,
                           clock=schedule.clock, disks=schedule.disks)  # fmt: skip
    history = History()
    deadline = request_deadline(FLAGS)
    watchdog = threading.Timer(schedule.seconds + OVERSTAY_S, _stuck, (cluster,))
    watchdog.daemon = True
    watchdog.start()
    load = Load(history, lambda: [n.url for n in cluster.nodes], seed=schedule.seed,
                chat_workers=CHAT_WORKERS, client_timeout=deadline * 2)  # fmt: skip
    final: Final | None = None
    problem = ""
    logs: dict[int, list[str]] = {}
    try:
        log(f"chaos: seed {schedule.seed}, {schedule.nodes} nodes, {schedule.seconds:g}s, "
            f"{len(schedule.events)} faults; data in {root}")  # fmt: skip
        cluster.start()
        if not load.place_first(FIRST_PLACEMENT_S):
            problem = "the first placement was never acknowledged"
        else:
            t0 = time.monotonic()
            load.start()
            injectors = []
            for event in schedule.events:  # each fault in its own thread: they may overlap
                time.sleep(max(0.0, t0 + event.at - time.monotonic()))
                injector = threading.Thread(target=_apply, args=(cluster, event, history, log),
                                            daemon=True)  # fmt: skip
                injector.start()
                injectors.append(injector)
            for injector in injectors:
                injector.join()
            time.sleep(max(0.0, t0 + schedule.seconds - time.monotonic()))
            log("chaos: load stopping; observing the cluster")
            load.stop()
            final = observe(cluster, BOUNDS, MODEL)
    except AssertionError as exc:  # a node never listened at the start
        problem = str(exc)[-1000:]
    finally:
        load.stop()
        checks: tuple[CheckResult, ...] = ()
        if final is not None:
            checks = tuple(check_all(history.ops(), history.faults(), final, deadline=deadline,
                                     converge_bound=BOUNDS.converge,
                                     healthy_bound=BOUNDS.healthy))  # fmt: skip
        if problem or not all(c.passed for c in checks):
            logs = {n.index: n.log_tail() for n in cluster.nodes}
        links = cluster.proxies.statistics() if schedule.links else {}
        cluster.stop()
        if final is not None:
            kill_orphans(final.orphans)
        watchdog.cancel()
        shutil.rmtree(root, ignore_errors=True)
    ops = history.ops()
    span = (max(op.end for op in ops) - min(op.start for op in ops)) if ops else 0.0
    return RunResult(schedule, checks, tuple(ops), tuple(history.faults()), final, span,
                     deadline, problem, logs, links)  # fmt: skip


def _stuck(cluster: ChaosCluster) -> None:
    print("chaos: the run overstayed its limit; killing every node", file=sys.stderr)
    for node in cluster.nodes:
        node.resume()
        if (pid := node.pid) is not None:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    os._exit(3)
