"""Steps the distributed scenarios share: a cluster of real nodes, placing the demo model on
some of them, waiting until an instance serves (or is re-placed), the runner processes of a
node, and what the node logs say.

The node logs are what an operator keeps after the fact: once the leader has re-placed a failed
instance, ``/v1/instances`` and the cluster timeline no longer show the old one, so checks of
*why* it failed read the log lines (``runner skulk-demo#1 failed: REASON: …``, ``leader duty:
PlaceInstance(…, replaces='OLD')``, ``node N failed instance OLD …``) and report what the
:class:`~skulk.repro._cluster.ClusterWatch` caught of the rest.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

from skulk.harness import pid_alive
from skulk.repro._client import MODEL, Reply, chat_body, request
from skulk.repro._cluster import InstanceView, parse_instances
from skulk.repro._session import JOIN_BUDGET, MARGIN, Node, Session
from skulk.repro._timeline import DiagnosticsError, Event

#: A placement is answered 503 until every node has gossiped its compute ports: retry for this.
PLACE_BUDGET = 30.0
#: Placing, fetching nothing (the model is local), forming the group, loading and warming up.
READY_BUDGET = 45.0
#: How long the runners of a re-placed instance have to be gone (SIGTERM, grace, SIGKILL).
RUNNERS_GONE_BUDGET = 15.0


def start_cluster(
    s: Session, count: int, flags: Mapping[int, Mapping[str, str]] | None = None
) -> list[Node]:
    """Start ``count`` nodes (``flags``: extra flags by node number), the first founding the
    cluster and the others joining it; require that every node sees every node ``up``."""
    first = s.start_cluster_node(flags=(flags or {}).get(1))
    nodes = [first]
    for number in range(2, count + 1):
        nodes.append(s.start_cluster_node(join=first, flags=(flags or {}).get(number)))
    ids = {n.node_id for n in nodes}

    def everyone_sees_everyone() -> bool:
        for node in nodes:
            rows = node.get("/v1/cluster/nodes").field("nodes")
            up = {
                r.get("node_id")
                for r in (rows if isinstance(rows, list) else [])
                if isinstance(r, dict) and r.get("status") == "up"
            }
            if not ids <= up:
                return False
        return True

    took = s.wait_until(everyone_sees_everyone, JOIN_BUDGET)
    s.require(
        f"{count} nodes formed one cluster",
        took is not None,
        f"every node sees all {count} up after {took:.1f}s: " + ", ".join(n.name for n in nodes)
        if took is not None
        else f"/v1/cluster/nodes on node 1: {first.get('/v1/cluster/nodes').describe()}",
    )
    return nodes


def place(s: Session, via: Node, nodes: Sequence[Node], sharding: str) -> InstanceView:
    """Place the demo model on ``nodes`` (``POST /v1/placements`` through ``via``; retried
    while it is 503, as before every node's compute ports are known, under one idempotency
    key) and require a 201."""
    body: dict[str, object] = {
        "model": MODEL,
        "sharding": sharding,
        "nodes": [n.node_id for n in nodes],
    }
    if sharding != "single":
        body.update(min_nodes=len(nodes), max_nodes=len(nodes))
    replies: list[Reply] = []
    key = {"Idempotency-Key": uuid.uuid4().hex}  # the retries place one instance, not several

    def answered() -> bool:
        reply = request(
            "POST", via.url + "/v1/placements", budget=s.budget(10), body=body, headers=key
        )
        replies.append(reply)
        return reply.status is not None and reply.status != 503

    s.wait_until(answered, PLACE_BUDGET)
    reply = replies[-1]
    placed: InstanceView | None = None
    if reply.status == 201:
        try:
            placed = parse_instances({"instances": [reply.field("instance")]})[0]
        except DiagnosticsError as exc:
            s.require("the placement's answer has the promised shape", False, str(exc))
    names = ", ".join(n.name for n in nodes)
    s.require(
        f"a {sharding} instance of {MODEL} was placed on {names}",
        placed is not None,
        placed.describe() if placed is not None else reply.describe(),
    )
    assert placed is not None
    return placed


def wait_serving(
    s: Session,
    what: str,
    *,
    instance: str | None = None,
    not_ids: Collection[str] = (),
    where: Callable[[InstanceView], bool] = lambda _: True,
    seconds: float = READY_BUDGET,
) -> InstanceView:
    """Require that an instance of the demo model (``instance``, or any whose id is not in
    ``not_ids`` and that ``where`` accepts) has every rank ``ready``, as ``/v1/instances``
    shows it, within ``seconds``. Waiting stops early if an instance of ``not_ids`` is marked
    ``failed`` (the leader found no placement for it: it will not be re-placed)."""
    found: list[InstanceView] = []
    given_up: list[InstanceView] = []

    def ready_or_given_up() -> bool:
        for v in s.watch.instances():
            ours = v.id == instance if instance is not None else v.id not in not_ids
            if v.model == MODEL and ours and where(v) and v.ready:
                found.append(v)
                return True
            if v.id in not_ids and v.status == "failed":
                given_up.append(v)
                return True
        return False

    took = s.wait_until(ready_or_given_up, seconds)
    seen = "; ".join(v.describe() for v in s.watch.instances()) or "no instance"
    if given_up:
        detail = f"the leader marked it failed (no placement fits): {given_up[0].describe()}"
    else:
        detail = f"{found[0].describe()}, {took:.1f}s" if found else f"now: {seen}"
    s.require(what, bool(found), detail)
    return found[0]


def only_runner(s: Session, node: Node, what: str) -> int:
    """Require that ``node`` runs exactly one runner process now; its pid."""
    pids = sorted(node.runner_pids())
    s.require(f"{what} runs on {node.name} as one process", len(pids) == 1, f"runner pids {pids}")
    return pids[0]


def process_state(pid: int) -> str:
    """``gone``, or the process's state letter (``T``: stopped, ``S``: sleeping, …)."""
    if not pid_alive(pid):
        return "gone"
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


def expect_gone(s: Session, pids: Mapping[int, str], what: str) -> None:
    """Check that every process of ``pids`` (pid → what it was) is gone within
    :data:`RUNNERS_GONE_BUDGET`."""
    took = s.wait_until(lambda: not any(pid_alive(p) for p in pids), RUNNERS_GONE_BUDGET)
    states = ", ".join(f"{name} pid {pid}: {process_state(pid)}" for pid, name in pids.items())
    s.check(what, took is not None, states)


def runner_failed_line(node: Node, reason: str) -> list[str]:
    """The node's log lines saying one of its runners failed with ``reason``."""
    return [
        line
        for line in node.log_lines(containing=f" failed: {reason}: ")
        if "skulk.runner" in line and f"runner {MODEL}#" in line
    ]


def check_failure_logged(s: Session, node: Node, rank: str, reason: str) -> str | None:
    """Check that ``node``'s log says its runner (``rank``, for the check's name) failed with
    ``reason``; the first such line."""
    lines = runner_failed_line(node, reason)
    s.check(
        f"{node.name} logged {rank} failed {reason}",
        bool(lines),
        _message(lines[0]) if lines else "no such line in its log",
    )
    return lines[0] if lines else None


def replacement_line(nodes: Sequence[Node], old: str) -> str | None:
    """The leader's log line for the re-placement of instance ``old``, if any node logged one."""
    for node in nodes:
        for line in node.log_lines(containing=f"replaces='{old}'"):
            if "leader duty: PlaceInstance" in line:
                return _message(line)
    return None


_STRIKE = re.compile(r"node (\S+) failed instance (\S+) of \S+ \((\d+) time")


def strikes(nodes: Sequence[Node]) -> list[tuple[str, str, int]]:
    """``(node id, instance, count)`` of every strike the leader logged (a culprit of a failed
    pipeline/tensor instance), in log order per node."""
    found = []
    for node in nodes:
        for line in node.log_lines(containing=" failed instance "):
            if m := _STRIKE.search(line):
                found.append((m[1], m[2], int(m[3])))
    return found


def _message(line: str) -> str:
    """A log line without its timestamp."""
    return line.split(" ", 2)[-1] if line[:4].isdigit() else line


def timeline_of(
    s: Session, instance: str, *, rank: int | None = None, kind: str | None = None
) -> list[Event]:
    """The cluster-timeline events the watch caught of ``instance`` (``rank``, ``kind``)."""
    return [
        e
        for e in s.watch.events()
        if e.instance == instance
        and (rank is None or e.rank == rank)
        and (kind is None or e.kind == kind)
    ]


def fresh_request_via(s: Session, node: Node, what: str, *, served_by: Node | None = None) -> Reply:
    """Require that a non-streamed request through ``node`` is answered with its 8 tokens (by
    ``served_by``, if given)."""
    reply = request(
        "POST",
        node.url + "/v1/chat/completions",
        budget=s.budget(MARGIN * 3),
        body=chat_body(8, stream=False),
    )
    tokens = reply.field("usage", "completion_tokens")
    ok = reply.status == 200 and tokens == 8
    if served_by is not None:
        ok = ok and reply.node == served_by.node_id
    s.require(
        what,
        ok,
        f"200, {tokens} tokens, served by {reply.node}"
        if reply.status == 200
        else reply.describe(),
    )
    return reply
