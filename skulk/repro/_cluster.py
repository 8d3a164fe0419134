"""Watching a cluster from the outside while a distributed scenario runs.

A background thread polls the cluster through any node that answers: ``GET /v1/instances``
ten times a second and ``GET /v1/diagnostics/cluster/timeline`` a few times a second, and keeps
everything it ever saw — every instance id, every runner failure ``/v1/instances`` showed, and
every flight-recorder event of every rank. That matters: the leader re-places a failed instance
within a fraction of a second, and from then on neither route shows the old instance (only the
node logs keep why it failed), so a check that looked only afterwards would find nothing.
:meth:`ClusterWatch.poll` takes a snapshot at once (a script calls it the moment it sees a
failure).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import attrs
import httpx

from skulk.repro._timeline import (
    DiagnosticsError,
    Event,
    _field,
    _int,
    _list,
    _number,
    _obj,
    _str,
)

INSTANCES_INTERVAL = 0.1
#: The timeline is asked every this many instance polls.
TIMELINE_EVERY = 3
POLL_TIMEOUT = 3.0
#: Each timeline poll asks for events since the newest seen less this (a rank's collective
#: entries arrive with its next heartbeat, stamped with the runner's earlier time).
TIMELINE_OVERLAP = 10.0
TIMELINE_LIMIT = 2000


@attrs.frozen
class ShardView:
    """One rank of an instance as ``/v1/instances`` showed it."""

    rank: int
    node: str
    address: str | None
    phase: str
    failure: str | None


@attrs.frozen
class InstanceView:
    id: str
    model: str
    sharding: str
    status: str
    shards: tuple[ShardView, ...]

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(s.node for s in self.shards)

    @property
    def addresses(self) -> frozenset[str]:
        return frozenset(s.address for s in self.shards if s.address)

    @property
    def ready(self) -> bool:
        return bool(self.shards) and all(s.phase == "ready" for s in self.shards)

    def describe(self) -> str:
        ranks = ", ".join(
            f"r{s.rank} {s.node} {s.address or '-'} {s.phase}"
            + (f" ({s.failure})" if s.failure else "")
            for s in self.shards
        )
        return f"{self.sharding} {self.id} [{ranks}]"


@attrs.frozen
class SeenFailure:
    """A rank's runner failure ``/v1/instances`` showed (``at``: ``time.monotonic()``)."""

    instance: str
    rank: int
    node: str
    reason: str
    at: float


def _opt_str(value: object, path: str) -> str | None:
    return None if value is None else _str(value, path)


def parse_instances(doc: object) -> list[InstanceView]:
    """The instances of a ``/v1/instances`` document (:class:`DiagnosticsError` naming the
    ``$.path`` of anything of another shape)."""
    items = _list(_field(_obj(doc, "$"), "instances", "$"), "$.instances")
    views = []
    for i, raw in enumerate(items):
        path = f"$.instances[{i}]"
        inst = _obj(raw, path)
        shards = []
        for j, sraw in enumerate(_list(_field(inst, "shards", path), path + ".shards")):
            sp = f"{path}.shards[{j}]"
            shard = _obj(sraw, sp)
            runner = _obj(_field(shard, "runner", sp), sp + ".runner")
            shards.append(
                ShardView(
                    rank=_int(_field(shard, "rank", sp), sp + ".rank"),
                    node=_str(_field(shard, "node", sp), sp + ".node"),
                    address=_opt_str(_field(shard, "address", sp), sp + ".address"),
                    phase=_str(_field(runner, "phase", sp), sp + ".runner.phase"),
                    failure=_opt_str(_field(runner, "failure", sp), sp + ".runner.failure"),
                )
            )
        views.append(
            InstanceView(
                id=_str(_field(inst, "id", path), path + ".id"),
                model=_str(_field(inst, "model", path), path + ".model"),
                sharding=_str(_field(inst, "sharding", path), path + ".sharding"),
                status=_str(_field(inst, "status", path), path + ".status"),
                shards=tuple(shards),
            )
        )
    return views


@attrs.frozen
class _Raw:
    """One cluster-timeline event as the route gives it."""

    at: float
    node: str
    instance: str
    rank: int
    incarnation: int
    kind: str
    detail: str
    request_id: str | None


def parse_timeline(doc: object) -> list[_Raw]:
    """The events of a ``/v1/diagnostics/cluster/timeline`` document."""
    events = _list(_field(_obj(doc, "$"), "events", "$"), "$.events")
    out = []
    for i, raw in enumerate(events):
        path = f"$.events[{i}]"
        e = _obj(raw, path)
        out.append(
            _Raw(
                at=_number(_field(e, "at", path), path + ".at"),
                node=_str(_field(e, "node", path), path + ".node"),
                instance=_str(_field(e, "instance", path), path + ".instance"),
                rank=_int(_field(e, "rank", path), path + ".rank"),
                incarnation=_int(_field(e, "incarnation", path), path + ".incarnation"),
                kind=_str(_field(e, "kind", path), path + ".kind"),
                detail=_str(_field(e, "detail", path), path + ".detail"),
                request_id=_opt_str(e.get("request_id"), path + ".request_id"),
            )
        )
    return out


class ClusterWatch:
    """Polls a cluster through ``urls()`` (the API URLs of the nodes that can answer now: the
    first that does is asked); ``index_of(node_id)`` is the scenario's number for a node.
    :meth:`start` once the first node listens (again: no-op); :meth:`stop` before the nodes
    go."""

    def __init__(self, urls: Callable[[], list[str]], index_of: Callable[[str], int]) -> None:
        self._urls = urls
        self._index_of = index_of
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client = httpx.Client(timeout=POLL_TIMEOUT)
        self._instances: list[InstanceView] = []
        self._ids: list[str] = []
        self._failures: dict[tuple[str, int], SeenFailure] = {}
        self._events: dict[_Raw, None] = {}
        self._newest = 0.0
        self._errors: list[str] = []

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="cluster-watch", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(POLL_TIMEOUT * 3)
            self._thread = None

    def _loop(self) -> None:
        n = 0
        while not self._stop.is_set():
            self.poll(timeline=n % TIMELINE_EVERY == 0)
            n += 1
            self._stop.wait(INSTANCES_INTERVAL)

    def poll(self, *, timeline: bool = True) -> None:
        """Take a snapshot now: the instances, and (unless ``timeline=False``) the new
        timeline events."""
        with self._poll_lock:
            for url in self._urls():
                if self._poll_instances(url):
                    if timeline:
                        self._poll_timeline(url)
                    return

    def _get(self, url: str) -> object:
        r = self._client.get(url)
        r.raise_for_status()
        return r.json()

    def _poll_instances(self, url: str) -> bool:
        try:
            doc = self._get(url + "/v1/instances")
        except (httpx.HTTPError, ValueError):
            return False
        try:
            views = parse_instances(doc)
        except DiagnosticsError as exc:
            self._error(str(exc))
            return True
        now = time.monotonic()
        with self._lock:
            self._instances = views
            for v in views:
                if v.id not in self._ids:
                    self._ids.append(v.id)
                for s in v.shards:
                    if s.failure is not None and (v.id, s.rank) not in self._failures:
                        self._failures[(v.id, s.rank)] = SeenFailure(
                            v.id, s.rank, s.node, s.failure, now
                        )
        return True

    def _poll_timeline(self, url: str) -> None:
        since = max(0.0, self._newest - TIMELINE_OVERLAP)
        query = f"?since={since:.3f}&limit={TIMELINE_LIMIT}"
        try:
            doc = self._get(url + "/v1/diagnostics/cluster/timeline" + query)
        except (httpx.HTTPError, ValueError):
            return
        try:
            raws = parse_timeline(doc)
        except DiagnosticsError as exc:
            self._error(str(exc))
            return
        with self._lock:
            for e in raws:
                self._events.setdefault(e, None)
                self._newest = max(self._newest, e.at)

    def _error(self, message: str) -> None:
        with self._lock:
            if message not in self._errors:
                self._errors.append(message)

    def instances(self) -> list[InstanceView]:
        """The instances as last seen."""
        with self._lock:
            return list(self._instances)

    def instance_ids(self) -> list[str]:
        """Every instance id seen, in the order first seen."""
        with self._lock:
            return list(self._ids)

    def failures(self) -> list[SeenFailure]:
        """Every rank failure ``/v1/instances`` showed, in the order seen."""
        with self._lock:
            return sorted(self._failures.values(), key=lambda f: f.at)

    def contract_errors(self) -> list[str]:
        with self._lock:
            return list(self._errors)

    def events(self) -> list[Event]:
        """Every timeline event seen, oldest first, as repro events: ``node`` is the
        scenario's number, ``since_spawn`` counts from the runner's first event seen (its
        spawn, normally)."""
        with self._lock:
            raws = sorted(self._events, key=lambda e: e.at)
        spawned: dict[tuple[str, str, int, int], float] = {}
        for e in raws:
            spawned.setdefault((e.node, e.instance, e.rank, e.incarnation), e.at)
        return [
            Event(
                node=self._index_of(e.node),
                incarnation=e.incarnation,
                at=e.at,
                since_spawn=e.at - spawned[(e.node, e.instance, e.rank, e.incarnation)],
                kind=e.kind,
                detail=e.detail,
                request_id=e.request_id,
                instance=e.instance,
                rank=e.rank,
            )
            for e in raws
        ]
