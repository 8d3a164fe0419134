"""The cluster hang classes of a whole node: the node that serves a stream lost mid-stream, and
a node paused past ``--node-down-after`` and then resumed. Each runs three real ``python -m
skulk serve`` nodes (``--model none``; node 1 founds the cluster and leads it) and places one
single instance of the demo model on node 2, a follower.

Detectors, so the breakages are honest negative controls:

* a **killed** node closes its sockets: the API node's stream ends at once (its link drops),
  and the node's runner ends on its own (its parent-pid watchdog). What a flag can take away
  is the recovery: the leader commits the node ``down`` only after ``--node-down-after``, and
  only then moves its instances;
* a **paused** node keeps its sockets open: only the links' liveness deadline
  (``--link-liveness-timeout``) makes the leader find it unreachable, and ``--node-down-after``
  later it is ``down`` and its instance moves. Resumed, it must rejoin as it is — the same
  process, the same State as every other node — and stop the runner the State no longer
  assigns to it.
"""

from __future__ import annotations

import time

from skulk.repro._client import stream_chat
from skulk.repro._cluster import InstanceView
from skulk.repro._cluster_steps import (
    RUNNERS_GONE_BUDGET,
    expect_gone,
    fresh_request_via,
    only_runner,
    place,
    process_state,
    start_cluster,
    wait_serving,
)
from skulk.repro._distributed import CLUSTER_FLAGS, FAULT_AT_TOKEN, LONG_STREAM
from skulk.repro._scenario import Break, Scenario
from skulk.repro._session import JOIN_BUDGET, MARGIN, Node, Session


def _serving_node_lost_mid_stream(s: Session) -> None:
    a, b, c = start_cluster(s, 3)
    inst = wait_serving(
        s, "the instance is ready on node 2", instance=place(s, a, [b], "single").id
    )
    pid = only_runner(s, b, "its runner")
    killed_at: list[float] = []

    def kill_node_2(n: int) -> None:
        if n == FAULT_AT_TOKEN:
            b.kill()
            killed_at.append(time.monotonic())

    liveness = s.setting("link-liveness-timeout")
    out = stream_chat(
        a.url, max_tokens=LONG_STREAM, budget=s.budget(liveness + MARGIN + 5),
        on_token=kill_node_2,
    )  # fmt: skip
    s.require(
        f"the node process of node 2 was SIGKILLed mid-stream (not its runner, pid {pid})",
        bool(killed_at),
        out.describe(),
    )
    s.require(
        "the stream ended with the typed error node_unreachable",
        out.error_code == "node_unreachable",
        out.describe(),
    )
    after = out.ended - killed_at[0]
    s.check(
        "within the link's liveness deadline",
        after <= liveness + MARGIN,
        f"{after:.1f}s after the SIGKILL (allowed --link-liveness-timeout {liveness:g}s + "
        f"{MARGIN:g}s; its sockets closed, so no deadline was needed)",
    )
    s.check("the stream was closed by data: [DONE]", out.done, out.problem or "[DONE]")
    expect_gone(s, {pid: "node 2's runner"}, "node 2's runner ended on its own (parent watchdog)")
    _moved_away(s, inst, b)
    fresh_request_via(s, a, "a fresh request through node 1 succeeds")
    fresh_request_via(s, c, "and through node 3")
    check_converged(s, [a, c])


def _node_paused_past_down(s: Session) -> None:
    a, b, c = start_cluster(s, 3)
    inst = wait_serving(
        s, "the instance is ready on node 2", instance=place(s, a, [b], "single").id
    )
    pid = only_runner(s, b, "its runner")
    b.pause()
    state = s.wait_until(lambda: process_state(b.pid) == "T", MARGIN)
    s.require(
        f"node 2's node process was SIGSTOPped (not its runner, pid {pid})",
        state is not None,
        f"node process: {process_state(b.pid)}, runner: {process_state(pid)}",
    )
    _moved_away(s, inst, b)
    b.resume()
    took = s.wait_until(lambda: _all_up(s, [a, b, c]), JOIN_BUDGET)
    s.require(
        "after SIGCONT node 2 rejoins: every node sees all 3 up",
        took is not None,
        f"after {took:.1f}s" if took is not None else f"node 1: {statuses(a)}",
    )
    gone = s.wait_until(lambda: not b.runner_pids(), RUNNERS_GONE_BUDGET)
    s.check(
        "node 2 stopped the runner the State no longer assigns to it",
        gone is not None,
        f"its runner (pid {pid}) gone after {gone:.1f}s" if gone is not None
        else f"runner pids {sorted(b.runner_pids())}",
    )  # fmt: skip
    fresh_request_via(s, b, "a fresh request through node 2 succeeds")
    check_converged(s, [a, b, c])


def _moved_away(s: Session, old: InstanceView, lost: Node) -> InstanceView:
    """Require that the leader committed ``lost`` down and the model serves again elsewhere,
    within the scenario's liveness and down deadlines plus a margin for the new runner."""
    # The scenario's own deadlines bound the wait (a breakage changes the setting, not what
    # the scenario expects).
    bound = float(NODE_FLAGS["link-liveness-timeout"]) + float(NODE_FLAGS["node-down-after"])
    return wait_serving(
        s,
        f"the leader committed node {lost.index} down and its instance serves elsewhere",
        not_ids={old.id},
        where=lambda v: lost.node_id not in v.nodes,
        seconds=bound + MARGIN * 3,
    )


def statuses(node: Node) -> dict[str, object]:
    rows = node.get("/v1/cluster/nodes").field("nodes")
    return {
        str(r.get("node_id")): r.get("status")
        for r in (rows if isinstance(rows, list) else [])
        if isinstance(r, dict)
    }


def _all_up(s: Session, nodes: list[Node]) -> bool:
    ids = {n.node_id for n in nodes}
    return all({k for k, v in statuses(n).items() if v == "up"} >= ids for n in nodes if n.serving)


def check_converged(s: Session, nodes: list[Node]) -> None:
    """Check that ``nodes`` show the same applied index and the same State within
    :data:`MARGIN` (the State's own encoding, whole, is the hash)."""
    seen: list[list[object]] = []

    def same() -> bool:
        bodies = [n.get("/v1/cluster/state").body for n in nodes]
        seen.append(bodies)
        return all(isinstance(b, dict) for b in bodies) and all(b == bodies[0] for b in bodies)

    took = s.wait_until(same, MARGIN)
    last = seen[-1] if seen else []
    applied = [b.get("applied") if isinstance(b, dict) else b for b in last]
    s.check(
        "the State converged: every live node shows the same State at the same applied index",
        took is not None,
        f"applied {applied} after {took:.1f}s" if took is not None else f"applied {applied}",
    )


#: Shorter deadlines for a whole node's faults (on top of the distributed scenarios').
NODE_FLAGS = {**CLUSTER_FLAGS, "link-liveness-timeout": "3"}

NODE_FAULTS: tuple[Scenario, ...] = (
    Scenario(
        "serving-node-lost-mid-stream",
        "the node serving a stream routed through another node is SIGKILLed: the stream ends "
        "with node_unreachable at once, its runner ends on its own, the leader commits the "
        "node down and re-places its instance, fresh requests succeed, the State converges",
        _serving_node_lost_mid_stream,
        flags=NODE_FLAGS,
        budget_s=150.0,
    ),
    Scenario(
        "node-paused-past-down",
        "a node is SIGSTOPped past --node-down-after (its runner lives): the leader commits it "
        "down and re-places its instance; after SIGCONT the same node process rejoins, stops "
        "the runner no longer assigned to it, serves, and shows the same State as the others",
        _node_paused_past_down,
        flags=NODE_FLAGS,
        budget_s=150.0,
    ),
)

NODE_BREAKS: tuple[Break, ...] = (
    Break(
        "node-down-verdict",
        "the leader waits an hour before it commits an unreachable node down "
        "(--node-down-after 3600): a killed node's instance is never moved; "
        "serving-node-lost-mid-stream fails",
        {"node-down-after": "3600"},
    ),
    Break(
        "link-liveness",
        "no link liveness deadline (--link-liveness-timeout 0): a paused node's open sockets "
        "keep it reachable, so it is never committed down; node-paused-past-down fails",
        {"link-liveness-timeout": "0"},
    ),
)
