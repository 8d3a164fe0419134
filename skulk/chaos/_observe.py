"""What the cluster looks like once the faults healed: the observations the checkers judge.

Each wait is bounded and polls: :func:`observe` waits up to ``bounds.healthy`` for every node's
``/health`` to answer 200, up to ``bounds.converge`` for every node's ``GET /v1/cluster/state``
to show the same applied index and the same State (compared as canonical JSON less
``applied``), and up to ``bounds.strays`` for each node's runner processes to match what the
State assigns it. What it found when a bound ran out is what it reports: the checkers decide.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

import attrs
import httpx

from skulk.chaos._cluster import ChaosCluster
from skulk.repro import is_runner, runner_children

POLL = 0.25


@attrs.frozen
class Bounds:
    """Seconds after the last fault healed within which each property must hold."""

    healthy: float
    converge: float
    strays: float


@attrs.frozen
class NodeFinal:
    index: int
    running: bool
    #: Seconds from the start of :func:`observe` until ``/health`` answered 200 (None: never).
    healthy_after: float | None
    applied: int | None
    state_hash: str | None
    #: Runner processes of the node, and the ranks the State assigns it (placed instances).
    runners: int
    assigned: int


@attrs.frozen
class Final:
    nodes: tuple[NodeFinal, ...]
    #: Seconds until every running node had the same applied index and State (None: never).
    converged_after: float | None
    #: The demo model's instance ids in the final State (of the node asked last).
    instances: tuple[str, ...]
    #: Runner pids seen during the run, still alive, whose node is not their parent now.
    orphans: tuple[int, ...]
    #: What runners produced, by request id: the whole text of each runner that sent any
    #: chunk for it (see :func:`read_produced`).
    produced: Mapping[str, tuple[str, ...]] = attrs.field(factory=dict)


def _get(url: str) -> httpx.Response | None:
    try:
        return httpx.get(url, timeout=5.0)
    except httpx.HTTPError:
        return None


def _state(url: str) -> tuple[int, str, dict[str, object]] | None:
    r = _get(url + "/v1/cluster/state")
    if r is None or r.status_code != 200:
        return None
    try:
        body = r.json()
        applied = int(body.pop("applied"))
    except (ValueError, KeyError, TypeError):
        return None
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return applied, digest, body


def _until(predicate: Callable[[], bool], bound: float) -> float | None:
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start >= bound:
            return None
        time.sleep(POLL)


def _assigned(state: dict[str, object], node_id: str) -> int:
    instances = state.get("instances")
    if not isinstance(instances, list):
        return 0
    return sum(
        1
        for inst in instances
        if isinstance(inst, dict) and inst.get("status") == "placed"
        for shard in inst.get("shards", [])
        if isinstance(shard, dict) and shard.get("node") == node_id
    )


def observe(cluster: ChaosCluster, bounds: Bounds, model: str) -> Final:
    """Wait for health, convergence and matching runners (each within its bound) and report
    what was found."""
    running = [n for n in cluster.nodes if n.serving]
    start = time.monotonic()
    healthy: dict[int, float | None] = {}
    for node in running:
        left = max(0.0, bounds.healthy - (time.monotonic() - start))
        took = _until(lambda n=node: (r := _get(n.url + "/health")) is not None  # type: ignore[misc]
                      and r.status_code == 200, left)  # fmt: skip
        healthy[node.index] = None if took is None else time.monotonic() - start
    seen: dict[int, tuple[int, str, dict[str, object]] | None] = {}

    def agree() -> bool:
        for n in running:
            seen[n.index] = _state(n.url)
        views = list(seen.values())
        return (
            all(v is not None for v in views)
            and len({(v[0], v[1]) for v in views if v is not None}) == 1
        )

    converged = _until(agree, bounds.converge)
    last = next((v for v in reversed(list(seen.values())) if v is not None), None)
    final_state = last[2] if last is not None else {}

    def counts() -> dict[int, tuple[int, int]]:
        out = {}
        for n in running:
            view = seen.get(n.index)
            state = view[2] if view is not None else final_state
            pid = n.pid
            procs = len(runner_children(pid)) if pid is not None else 0
            out[n.index] = (procs, _assigned(state, n.node_id))
        return out

    found: dict[int, tuple[int, int]] = {}

    def matched() -> bool:
        found.update(counts())
        return all(procs <= assigned for procs, assigned in found.values())

    _until(matched, bounds.strays)
    cluster.sample()
    parents = {n.pid for n in cluster.nodes if n.pid is not None}
    orphans = sorted(
        pid
        for pids in cluster.runner_pids().values()
        for pid in pids
        if is_runner(pid) and _parent(pid) not in parents
    )
    instances = final_state.get("instances", [])
    ids = tuple(
        sorted(
            str(i["id"])
            for i in (instances if isinstance(instances, list) else [])
            if isinstance(i, dict) and i.get("model") == model
        )
    )
    nodes = []
    for n in cluster.nodes:
        view = seen.get(n.index)
        procs, assigned = found.get(n.index, (0, 0))
        nodes.append(
            NodeFinal(
                n.index,
                n.serving,
                healthy.get(n.index),
                view[0] if view is not None else None,
                view[1] if view is not None else None,
                procs,
                assigned,
            )
        )
    return Final(tuple(nodes), converged, ids, tuple(orphans),
                 read_produced(cluster.produced_files()))  # fmt: skip


def read_produced(paths: Iterable[Path]) -> dict[str, tuple[str, ...]]:
    """The nodes' records of what their runners produced (:mod:`skulk.runner._produced`) as
    request id → the text of each runner (a node's file and pid) that produced any, its chunks
    joined in the order they were written. A missing file is an empty record; a torn last
    line (a write cut short) is skipped."""
    texts: dict[str, dict[tuple[int, int], list[str]]] = {}
    for f, path in enumerate(paths):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                item = json.loads(line)
                rid, runner, text = str(item["id"]), int(item["runner"]), str(item["text"])
            except (ValueError, KeyError, TypeError):
                continue
            texts.setdefault(rid, {}).setdefault((f, runner), []).append(text)
    return {rid: tuple("".join(chunks) for chunks in by.values()) for rid, by in texts.items()}


def _parent(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def kill_orphans(pids: tuple[int, ...]) -> None:
    """SIGKILL stray runners the checks found (so a failed run leaves nothing behind)."""
    for pid in pids:
        if is_runner(pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
