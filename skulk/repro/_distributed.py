"""The distributed hang classes: a rank stopped or killed inside a compute group, a rank that
never joins it, and a serving node that falls silent mid-stream. Each runs a real cluster of
``python -m skulk serve`` processes (each with its own data dir and node id, one cluster secret,
``--model none``) and places the demo model on it through the API.

Deadlines and detectors, so the breakages are honest negative controls:

* a **stopped** rank never answers: only deadlines notice it — first the stopped rank's own
  node, which reads the process state (``--rank-pause-timeout``, kept under half the
  collective deadline, so that node is blamed), then rank 0's collective watchdog
  (``--collective-timeout``) and the stopped rank's progress deadline (``--progress-timeout``);
* a **killed** rank closes its sockets: its peers' next collective fails at once
  (``collective_failed``) and its node sees its runner exit (``runner_crashed``) — no deadline
  and no flag is involved. What a flag *can* take away is the recovery: the re-placement needs a
  fresh compute address on each node;
* a rank that **never joins** is noticed by the group-connect deadline on every rank
  (``--group-connect-timeout``);
* a **silent serving node** is noticed by the caller's route idle deadline
  (``--route-idle-timeout``) or its link's liveness deadline (``--link-liveness-timeout``),
  whichever is shorter.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time

from skulk.repro._client import chat_body, request, stream_chat
from skulk.repro._cluster import InstanceView
from skulk.repro._cluster_steps import (
    check_failure_logged,
    expect_gone,
    fresh_request_via,
    only_runner,
    place,
    replacement_line,
    runner_failed_line,
    start_cluster,
    strikes,
    timeline_of,
    wait_serving,
)
from skulk.repro._scenario import Break, Scenario
from skulk.repro._session import MARGIN, Node, Session

#: The token at which a fault is injected from the client's side.
FAULT_AT_TOKEN = 5
#: Tokens asked for when the stream must still be going when the fault strikes (a few ms each).
LONG_STREAM = 1500
#: A prompt of about 1100 tokens: three prefill chunks of 512.
LONG_PROMPT = " ".join(f"fox{i}" for i in range(300))
#: Shorter deadlines for every node of a distributed scenario. The progress deadline stays
#: above the collective one: a rank waiting in a collective sends no heartbeat.
CLUSTER_FLAGS = {
    "group-connect-timeout": "5",
    "collective-timeout": "5",
    "progress-timeout": "10",
    "node-down-after": "2",
}
#: Memory limits that make the placement's ranks predictable: rank 0 goes to the node with the
#: most free memory.
MEMORY = {1: {"memory-limit": "6G"}, 2: {"memory-limit": "3G"}}


def _rank_nodes(s: Session, ranks: tuple[str, ...]) -> list[Node]:
    nodes = [s.by_id(node_id) for node_id in ranks]
    s.require("every rank's node is one of ours", all(n is not None for n in nodes), str(ranks))
    return [n for n in nodes if n is not None]


_ADDRESS = re.compile(r"address='([^']+)'")


def check_fresh_addresses(s: Session, old: InstanceView, new: InstanceView) -> None:
    """The instance that replaced ``old`` (the leader's logged PlaceInstance) got a new id and
    compute addresses none of ``old``'s ranks held. ``new``, the instance serving now, may be a
    later re-placement (its first try failed: a port the OS had meanwhile lent to another
    socket, say): once ``old`` is gone its addresses are free again, so only the direct
    replacement is held to fresh addresses."""
    line = replacement_line(s.nodes, old.id)
    replacement = frozenset(_ADDRESS.findall(line or ""))
    s.check(
        "the instance that replaced it has a new id and fresh compute addresses",
        new.id != old.id and bool(replacement) and not replacement & old.addresses,
        f"{old.describe()} -> re-placed at {sorted(replacement) or 'no logged re-placement'}; "
        f"serving now: {new.describe()}",
    )


#: How a stream ends when a rank of its instance stalls: rank 0 lost its peer (the stopped
#: rank's node killed it), rank 0's collective deadline fired, or the leader re-placed the
#: instance first and rank 0 was stopped.
STALL_ERRORS = frozenset({"collective_failed", "collective_timeout", "runner_stopped"})


def _check_blamed(s: Session, old: InstanceView, culprit: Node) -> None:
    """Check that ``culprit``'s node failed its rank ``runner_paused`` and the leader struck
    that node for instance ``old`` (so a node whose ranks keep stalling is kept out)."""
    failed = runner_failed_line(culprit, "runner_paused")
    blamed = [node for node, instance, _ in strikes(s.nodes) if instance == old.id]
    s.require(
        "the leader blamed the stopped rank's node",
        bool(failed) and blamed == [culprit.node_id],
        f"{culprit.name} logged: {failed[0] if failed else 'no runner_paused failure'}; "
        f"nodes blamed: {blamed or 'none'}",
    )


def _rank_stopped_mid_decode(s: Session) -> None:
    a, b = start_cluster(s, 2)
    old = place(s, a, [a, b], "pipeline")
    old = wait_serving(s, "the pipeline instance is ready on both nodes", instance=old.id)
    first, second = _rank_nodes(s, old.nodes)
    survivor = only_runner(s, first, "rank 0")
    stopped = only_runner(s, second, "rank 1")
    stopped_at: list[float] = []

    def stop_rank_1(n: int) -> None:
        if n == FAULT_AT_TOKEN:
            os.kill(stopped, signal.SIGSTOP)
            stopped_at.append(time.monotonic())

    deadline = s.setting("collective-timeout")
    limit = deadline + MARGIN
    out = stream_chat(
        a.url, max_tokens=LONG_STREAM, budget=s.budget(limit + 5), on_token=stop_rank_1
    )
    s.watch.poll()  # now: the failed ranks leave the timeline once the instance is re-placed
    s.require(
        f"rank 1's runner (pid {stopped} on {second.name}) was SIGSTOPped mid-decode",
        bool(stopped_at),
        out.describe(),
    )
    s.require(
        "the stream ended with a typed error",
        out.error_code in STALL_ERRORS,
        out.describe(),
    )
    after = out.ended - stopped_at[0]
    s.check(
        "the error came within the collective deadline",
        after <= limit,
        f"{after:.1f}s after the SIGSTOP (allowed --collective-timeout {deadline:g}s + "
        f"{MARGIN:g}s): {out.error_code}: {out.error.get('message') if out.error else ''}",
    )
    s.check("the stream was closed by data: [DONE]", out.done, out.problem or "[DONE]")
    paused = [e.detail for e in timeline_of(s, old.id, rank=1, kind="deadline")]
    waited = [e.detail for e in timeline_of(s, old.id, rank=0, kind="deadline")]
    s.check(
        "the cluster timeline shows the deadline that fired",
        any("rank_pause_timeout" in d for d in paused)
        or any("collective_timeout" in d for d in waited),
        f"rank 1: {paused or 'no deadline'}; rank 0: {waited or 'no deadline'}",
    )
    new = wait_serving(s, "the leader re-placed the instance and it serves again", not_ids={old.id})
    check_fresh_addresses(s, old, new)
    line = replacement_line(s.nodes, old.id)
    s.check("the leader logged the re-placement", line is not None, line or "no such line")
    _check_blamed(s, old, second)
    expect_gone(
        s,
        {stopped: "the stopped rank 1", survivor: "rank 0"},
        "no runner of the old instance is left (the stopped one killed, rank 0 exited)",
    )
    fresh_request_via(s, a, "a fresh request succeeds")


def _rank_killed_mid_prefill(s: Session) -> None:
    a, b = start_cluster(s, 2, MEMORY)
    old = place(s, a, [a, b], "pipeline")
    old = wait_serving(s, "the pipeline instance is ready on both nodes", instance=old.id)
    s.require(
        "rank 1 is on node 2, whose prefill the fault slows",
        old.nodes == (a.node_id, b.node_id),
        old.describe(),
    )
    survivor = only_runner(s, a, "rank 0")
    victim = only_runner(s, b, "rank 1")
    killed_at: list[float] = []
    over = threading.Event()
    give_up = time.monotonic() + s.budget(MARGIN * 2)

    def prefilling() -> bool:
        runners = a.get("/v1/diagnostics/node").field("runners")
        for runner in runners if isinstance(runners, list) else []:
            events = runner.get("events") if isinstance(runner, dict) else None
            for e in events if isinstance(events, list) else []:
                if isinstance(e, dict) and e.get("kind") == "request.start":
                    return True
        return False

    def kill_rank_1_once_prefilling() -> None:
        # Rank 0 has the request: the prefill has begun, and rank 1 sleeps after each chunk.
        while not over.wait(0.05) and time.monotonic() < give_up:
            if prefilling():
                os.kill(victim, signal.SIGKILL)
                killed_at.append(time.monotonic())
                break
        # Rank 1's node records its exit at once; the re-placement takes it out of the
        # timeline a fraction of a second later.
        for _ in range(4):
            s.watch.poll()
            over.wait(0.05)

    killer = threading.Thread(target=kill_rank_1_once_prefilling, daemon=True)
    killer.start()
    out = stream_chat(a.url, max_tokens=8, budget=s.budget(MARGIN * 2), prompt=LONG_PROMPT)
    over.set()
    killer.join(2.0)
    s.watch.poll()
    s.require(
        f"rank 1's runner (pid {victim}) was SIGKILLed while the prompt was prefilled",
        bool(killed_at) and out.tokens == 0,
        out.describe(),
    )
    # Two ways to end it, both without a deadline, whichever comes first: rank 0's ring sees
    # the dead peer's sockets close, or rank 1's node reports its runner crashed and the leader
    # re-places the instance, which stops rank 0 (the request then says runner_stopped).
    ring = out.error_code == "collective_failed"
    s.require(
        "the request ended with a typed error: collective_failed, or runner_stopped when the "
        "re-placement stopped rank 0 before its ring noticed",
        out.error_code in ("collective_failed", "runner_stopped"),
        out.describe(),
    )
    after = out.ended - killed_at[0]
    deadline = s.setting("collective-timeout")
    s.check(
        "at once, before any deadline",
        after < deadline,
        f"{after:.2f}s after the SIGKILL (the collective deadline is {deadline:g}s), by "
        + ("rank 0's ring" if ring else "the re-placement")
        + f": {out.error.get('message') if out.error else ''}",
    )
    exits = [e.detail for e in timeline_of(s, old.id, rank=1, kind="exit")]
    started = timeline_of(s, old.id, rank=0, kind="request.start")
    prefill = [e.detail for e in timeline_of(s, old.id, rank=0, kind="collective")]
    s.check(
        "the cluster timeline shows the request on rank 0 and rank 1 killed (exit code -9)",
        bool(started) and "code -9" in exits,
        f"rank 1: exit {exits}; rank 0: request.start {len(started)}, last collectives "
        f"{[d for d in prefill if 'prefill' in d][-2:]}",
    )
    check_failure_logged(s, b, "rank 1", "runner_crashed")
    if ring:
        check_failure_logged(s, a, "rank 0", "collective_failed")
    else:
        stopping = a.log_lines(containing=f"instance {old.id} is no longer assigned here")
        s.check(
            f"{a.name} logged that it stopped rank 0 for the re-placement",
            bool(stopping),
            stopping[0] if stopping else "no such line",
        )
    new = wait_serving(s, "the leader re-placed the instance and it serves again", not_ids={old.id})
    check_fresh_addresses(s, old, new)
    expect_gone(
        s,
        {victim: "the killed rank 1", survivor: "rank 0"},
        "no runner of the old instance is left",
    )
    fresh_request_via(s, a, "a fresh request succeeds")


def _rank_never_joins(s: Session) -> None:
    memory = {1: {"memory-limit": "6G"}, 2: {"memory-limit": "5G"}, 3: {"memory-limit": "2G"}}
    a, b, c = start_cluster(s, 3, memory)
    placed_at = time.monotonic()
    first = place(s, a, [a, b], "pipeline")
    s.require(
        "rank 1 is on node 2, whose rank hangs",
        first.nodes == (a.node_id, b.node_id),
        first.describe(),
    )
    connect = s.setting("group-connect-timeout")
    # The first placement fails at the connect deadline (counted from each rank's Load) and
    # is re-placed.
    took = s.wait_until(lambda: len(s.watch.instance_ids()) > 1, connect + MARGIN)
    s.require(
        "the first placement failed and was re-placed within the connect deadline",
        took is not None,
        f"{time.monotonic() - placed_at:.1f}s after placing (allowed --group-connect-timeout "
        f"{connect:g}s + {MARGIN:g}s)"
        if took is not None
        else f"instances: {'; '.join(v.describe() for v in s.watch.instances())}",
    )
    joining = {
        e.rank: e.detail.split(":")[0]
        for e in timeline_of(s, first.id)
        if e.kind == "group" or (e.kind == "phase" and e.detail == "connecting")
    }
    s.check(
        "the cluster timeline shows rank 0 joining and node 2's rank 1 never starting to",
        joining.get(0, "").startswith("joining") and joining.get(1) == "connecting",
        f"last group step per rank of {first.id}: {joining}",
    )
    final = wait_serving(
        s,
        "an instance without node 2 serves",
        where=lambda v: b.node_id not in v.nodes,
        # Two failures blamed on node 2, and the placements that blamed no one (see the
        # strikes check): each takes a spawn and the connect deadline.
        seconds=(connect + MARGIN) * 5,
    )
    s.check("it is on nodes 1 and 3", set(final.nodes) == {a.node_id, c.node_id}, final.describe())
    check_failure_logged(s, b, "its rank (hang@connect)", "group_not_joined")
    check_failure_logged(s, a, "its rank (waiting for the group)", "group_connect_timeout")
    struck = strikes(s.nodes)
    counts = [n for node, _, n in struck if node == b.node_id]
    blamed = {instance: node for node, instance, _ in struck}
    failed = [i for i in s.watch.instance_ids() if i != final.id]
    s.check(
        "the leader blamed node 2 twice (and no one else), then kept it out",
        counts[:2] == [1, 2] and set(blamed.values()) == {b.node_id},
        f"{len(failed)} failed placements, blamed: "
        + ", ".join(f"{i}: {'node 2' if blamed.get(i) else 'no one'}" for i in failed),
    )
    seen = ", ".join(f"{f.instance}/r{f.rank} {f.reason}" for f in s.watch.failures())
    s.check(
        "no runner is left on node 2",
        not b.runner_pids(),
        f"runner pids {sorted(b.runner_pids())}; failures /v1/instances showed while they "
        f"lasted: {seen or 'none caught'}",
    )
    fresh_request_via(s, a, "a fresh request succeeds")


def _serving_node_silent(s: Session) -> None:
    a, b = start_cluster(s, 2)
    inst = place(s, a, [b], "single")
    inst = wait_serving(s, "the instance is ready on node 2", instance=inst.id)
    pid = only_runner(s, b, "its runner")
    paused_at: list[float] = []

    def pause_node_2(n: int) -> None:
        if n == FAULT_AT_TOKEN:
            b.pause()
            paused_at.append(time.monotonic())

    idle, liveness = s.setting("route-idle-timeout"), s.setting("link-liveness-timeout")
    limit = min(idle, liveness) + MARGIN
    out = stream_chat(
        a.url, max_tokens=LONG_STREAM, budget=s.budget(limit + 5), on_token=pause_node_2
    )
    s.require(
        f"the node process of node 2 was SIGSTOPped mid-stream (not its runner, pid {pid})",
        bool(paused_at),
        out.describe(),
    )
    s.require(
        "the stream ended with the typed error node_unreachable",
        out.error_code == "node_unreachable",
        out.describe(),
    )
    after = out.ended - paused_at[0]
    s.check(
        "within the route idle deadline (or the link's liveness deadline, if shorter)",
        after <= limit,
        f"{after:.1f}s after the SIGSTOP (allowed min(--route-idle-timeout {idle:g}s, "
        f"--link-liveness-timeout {liveness:g}s) + {MARGIN:g}s): "
        f"{out.error.get('message') if out.error else ''}",
    )
    s.check("the stream was closed by data: [DONE]", out.done, out.problem or "[DONE]")
    b.resume()

    took = s.wait_until(lambda: fresh_through(s, a, b), MARGIN * 3)
    s.require(
        "after SIGCONT node 2 serves again (through node 1)",
        took is not None,
        f"after {took:.1f}s" if took is not None else "no request through node 1 served",
    )
    fresh_request_via(s, b, "and through its own API", served_by=b)
    now = sorted(b.runner_pids())
    runner = b.get("/v1/diagnostics/node").field("runners")
    last = runner[-1] if isinstance(runner, list) and runner else {}
    failure = last.get("failure") if isinstance(last, dict) else None
    s.check(
        "its runner was not restarted: same pid, no failure",
        now == [pid] and failure is None,
        f"runner pids {now} (before: [{pid}]); its failure: {failure}",
    )


def fresh_through(s: Session, via: Node, serving: Node) -> bool:
    """Whether a request through ``via`` is served by ``serving`` now (no check recorded)."""
    reply = request(
        "POST", via.url + "/v1/chat/completions", budget=s.budget(MARGIN),
        body=chat_body(8, stream=False),
    )  # fmt: skip
    return reply.status == 200 and reply.node == serving.node_id


DISTRIBUTED: tuple[Scenario, ...] = (
    Scenario(
        "rank-stopped-mid-decode",
        "rank 1 of a 2-node pipeline is SIGSTOPped mid-decode: its node sees the process "
        "stopped and fails it runner_paused, the stream ends with a typed error, the leader "
        "blames that node and re-places the instance, no runner of it is left, a fresh "
        "request succeeds",
        _rank_stopped_mid_decode,
        flags=CLUSTER_FLAGS,
        budget_s=150.0,
    ),
    Scenario(
        "rank-killed-mid-prefill",
        "rank 1 of a 2-node pipeline is SIGKILLed while a long prompt is prefilled: the request "
        "fails at once (collective_failed: rank 0's ring noticed), the leader re-places, a "
        "fresh request succeeds",
        _rank_killed_mid_prefill,
        node_faults={2: "slow@prefill:1"},
        flags=CLUSTER_FLAGS,
        budget_s=150.0,
    ),
    Scenario(
        "rank-never-joins",
        "one node's rank never joins its compute group: group_not_joined there, "
        "group_connect_timeout on the other rank, re-placed; after its second failure the node "
        "is left out and the instance serves on the other two",
        _rank_never_joins,
        node_faults={2: "hang@connect"},
        flags=CLUSTER_FLAGS,
        budget_s=180.0,
    ),
    Scenario(
        "serving-node-silent",
        "the node serving a stream routed through another node is SIGSTOPped (its runner "
        "lives): the stream ends with node_unreachable within the route idle deadline; after "
        "SIGCONT it serves again with the same runner",
        _serving_node_silent,
        # The pause (the route idle deadline) outlasts the runner's progress deadline: the
        # node must not blame its runner for its own absence.
        flags={**CLUSTER_FLAGS, "node-down-after": "30", "route-idle-timeout": "4",
               "link-liveness-timeout": "5", "progress-timeout": "3"},
        budget_s=120.0,
    ),
)  # fmt: skip

DISTRIBUTED_BREAKS: tuple[Break, ...] = (
    Break(
        "collective-watchdog",
        "no collective, progress or pause deadline (--collective-timeout 0 --progress-timeout "
        "0 --rank-pause-timeout 0): a stopped rank goes unnoticed; rank-stopped-mid-decode "
        "fails",
        {"collective-timeout": "0", "progress-timeout": "0", "rank-pause-timeout": "0"},
    ),
    Break(
        "rank-pause-watch",
        "no pause deadline (--rank-pause-timeout 0): rank 0's collective deadline still ends "
        "the stream, but nobody is blamed, so a node whose ranks keep stalling is never kept "
        "out; rank-stopped-mid-decode fails",
        {"rank-pause-timeout": "0"},
    ),
    Break(
        "one-compute-port",
        "every node offers a single compute port: a re-placement finds no fresh compute "
        "address, so a failed instance is never re-placed; rank-killed-mid-prefill fails "
        "(nothing can slow its detection: a dead peer's sockets close)",
        {},
        compute_ports=1,
    ),
    Break(
        "group-connect-deadline",
        "no group-connect deadline (--group-connect-timeout 0): a rank that never joins "
        "blocks its group forever; rank-never-joins fails",
        {"group-connect-timeout": "0"},
    ),
    Break(
        "link-deadlines",
        "no route idle deadline and no link liveness deadline (--route-idle-timeout 0 "
        "--link-liveness-timeout 0): a silent serving node holds the stream forever; "
        "serving-node-silent fails",
        {"route-idle-timeout": "0", "link-liveness-timeout": "0"},
    ),
)
