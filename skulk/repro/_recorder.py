"""Watching one node from the outside while a scenario runs.

A background thread polls ``/v1/diagnostics/node`` and the node's child processes a few
times a second and keeps everything it ever saw: the last view of every runner incarnation
(diagnostics keep only the last few runners), every flight-recorder event, and every runner
pid — including a runner that died before diagnostics showed its pid. The stray-process
check and the printed timeline are built from this.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import httpx

from skulk.repro._timeline import DiagnosticsError, Event, RunnerView, merge_events, parse_runners

POLL_INTERVAL = 0.2
POLL_TIMEOUT = 3.0


def runner_children(parent: int) -> set[int]:
    """Pids of ``python -m skulk.engine`` processes whose parent is ``parent`` (Linux /proc;
    empty elsewhere)."""
    found: set[int] = set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == parent and is_runner(int(entry)):
                found.add(int(entry))
        except (OSError, ValueError, IndexError):
            continue
    return found


def is_runner(pid: int) -> bool:
    """Whether ``pid`` is (still) a ``python -m skulk.engine`` process."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"skulk.engine" in cmdline


class Recorder:
    """Polls one node; :meth:`start` it once the node listens, :meth:`stop` it before or
    after the node goes away (a dead node just stops answering).

    With ``runners=False`` it keeps only the runner pids (a node of a cluster runs runners of
    several instances, whose incarnations repeat: their events come from the cluster
    timeline instead, see :class:`~skulk.repro._cluster.ClusterWatch`)."""

    def __init__(self, node: int, url: str, node_pid: int, *, runners: bool = True) -> None:
        self.node = node
        self.keep_runners = runners
        self.url = url
        self.node_pid = node_pid
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._runners: dict[int, RunnerView] = {}
        self._events: list[Event] = []
        self._pids: set[int] = set()
        self._contract_errors: list[str] = []
        self._client = httpx.Client(timeout=POLL_TIMEOUT)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"recorder-{self.node}")
        self._thread.daemon = True
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(POLL_TIMEOUT * 3)
        self._client.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.poll()
            self._stop.wait(POLL_INTERVAL)

    def poll(self) -> bool:
        """Take one snapshot now; False if the node did not answer."""
        children = runner_children(self.node_pid)
        with self._lock:
            self._pids |= children
        try:
            r = self._client.get(self.url + "/v1/diagnostics/node")
            doc: object = r.json()
        except (httpx.HTTPError, ValueError):
            return False
        try:
            views = parse_runners(doc, self.node)
        except DiagnosticsError as exc:
            with self._lock:
                if str(exc) not in self._contract_errors:
                    self._contract_errors.append(str(exc))
            return True
        with self._lock:
            self._pids |= {v.pid for v in views if v.pid is not None}
            if not self.keep_runners:
                return True
            for v in views:
                self._runners[v.incarnation] = v
            self._events = merge_events(self._events, [e for v in views for e in v.events])
        return True

    def runners(self) -> list[RunnerView]:
        """The last view of every incarnation seen, oldest first."""
        with self._lock:
            return [self._runners[i] for i in sorted(self._runners)]

    def runner(self, incarnation: int) -> RunnerView | None:
        with self._lock:
            return self._runners.get(incarnation)

    def current(self) -> RunnerView | None:
        """The newest incarnation seen."""
        with self._lock:
            return self._runners[max(self._runners)] if self._runners else None

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def pids(self) -> set[int]:
        with self._lock:
            return set(self._pids)

    def contract_errors(self) -> list[str]:
        with self._lock:
            return list(self._contract_errors)
