"""The cluster hang classes of the control plane and the links: the Raft leader lost while a
placement is in flight, and the API node cut off one way from the node that serves its
request. Each runs three real ``python -m skulk serve`` nodes (``--model none``; node 1
founds the cluster and leads it).

Detectors, so the breakages are honest negative controls:

* a **lost leader** is replaced by an election among the survivors
  (``--election-timeout``); the placement in flight is answered by the follower that took it
  (it retries the ask on the new leader until its own deadline, then answers a typed 503), and
  the client's retry under the same ``Idempotency-Key`` finds the instance the key placed (the
  key is committed with the placement, in the State). Break: followers that wait an hour
  before they call an election;
* a **one-way cut** between the API node and the serving node is noticed by the API node's
  route idle deadline (``--route-idle-timeout``) or its link's liveness deadline
  (``--link-liveness-timeout``); the link's closing makes later requests fail at once. Every
  link between those two nodes passes a :class:`~skulk.harness.Proxies` proxy: each of them
  listens on loopback and ``--advertise``\\ s its proxy's address, so gossip dials it through
  the proxy in either direction. Break: ``link-deadlines`` (both deadlines off).
"""

from __future__ import annotations

import re
import threading
import time
import uuid

from skulk.harness import LinkMode, Proxies
from skulk.repro._client import MODEL, Reply, chat_body, request, stream_chat
from skulk.repro._cluster_steps import (
    PLACE_BUDGET,
    fresh_request_via,
    place,
    start_cluster,
    wait_serving,
)
from skulk.repro._distributed import FAULT_AT_TOKEN, LONG_STREAM
from skulk.repro._node_faults import NODE_FLAGS, check_converged
from skulk.repro._scenario import Break, Scenario
from skulk.repro._session import JOIN_BUDGET, MARGIN, Node, Session, free_port_range

#: The follower retries a forwarded ask for 5 s (its submit timeout) and waits up to 5 s to see
#: the committed instance: a placement is answered within this, plus slack.
PLACE_DEADLINE = 10.0 + MARGIN
#: The whole-node deadlines, a route idle deadline above the link's liveness one, and the
#: default election timeout spelled out (the scenario's bound on an election).
CONTROL_FLAGS = {**NODE_FLAGS, "route-idle-timeout": "4", "election-timeout": "0.5"}
#: How often the killer polls the leader's Raft log while the placement is in flight.
KILL_POLL = 0.005


def raft_of(node: Node) -> dict[str, object]:
    """``GET /v1/cluster/raft`` of ``node`` (empty when it does not answer)."""
    body = node.get("/v1/cluster/raft", budget=2.0).body
    return body if isinstance(body, dict) else {}


def check_one_instance(s: Session, instance: str) -> None:
    """The model has exactly ``instance`` now, and no other instance was ever seen (no retry
    placed a second one), once one shows."""

    def now() -> list[str]:
        return [v.id for v in s.watch.instances() if v.model == MODEL]

    s.wait_until(lambda: bool(now()), MARGIN)
    ids, ever = now(), [i for i in s.watch.instance_ids() if i]
    s.check(
        "exactly one instance exists, and no other was ever seen",
        ids == [instance] and ever == [instance],
        f"now {ids}; ever seen {ever}",
    )


def require_voters(s: Session, leader: Node, nodes: list[Node]) -> None:
    """Require that ``leader`` leads and every node of ``nodes`` is a voter (so the others
    keep a quorum when it goes)."""
    ids = {n.node_id for n in nodes}

    def all_vote() -> bool:
        raft = raft_of(leader)
        voters = raft.get("voters")
        return (
            raft.get("leader") == leader.node_id
            and isinstance(voters, list)
            and (ids <= set(voters))
        )

    took = s.wait_until(all_vote, JOIN_BUDGET)
    s.require(
        f"{leader.name} leads and all {len(nodes)} nodes vote",
        took is not None,
        f"after {took:.1f}s" if took is not None else f"raft: {raft_of(leader)}",
    )


def _post_placement(s: Session, via: Node, target: Node, key: str) -> Reply:
    body = {"model": MODEL, "sharding": "single", "nodes": [target.node_id]}
    return request(
        "POST", via.url + "/v1/placements", budget=s.budget(PLACE_DEADLINE), body=body,
        headers={"Idempotency-Key": key},
    )  # fmt: skip


def typed_answer(reply: Reply) -> bool:
    """A 201, or a 503 whose error names its code."""
    if reply.status == 201:
        return isinstance(reply.field("instance", "id"), str)
    return reply.status == 503 and isinstance(reply.field("error", "code"), str)


def _leader_lost_mid_placement(s: Session) -> None:
    a, b, c = start_cluster(s, 3)
    require_voters(s, a, [a, b, c])
    # A dry run first: it registers the model and proves the placement fits (every node's
    # compute ports are known), so the placement below is one Raft entry.
    dry = s.wait_until(
        lambda: request(
            "POST", b.url + "/v1/placements", budget=s.budget(10),
            body={"model": MODEL, "sharding": "single", "nodes": [b.node_id], "dry_run": True},
        ).status == 200,
        PLACE_BUDGET,
    )  # fmt: skip
    s.require("a dry run through node 2 plans the placement", dry is not None)
    before = raft_of(a).get("last_index")
    s.require("node 1's Raft log index is readable", isinstance(before, int), str(before))
    assert isinstance(before, int)
    killed: list[tuple[float, object]] = []
    sent = threading.Event()
    over = threading.Event()

    def kill_when_appended() -> None:
        # The leader appends the placement's entry, replicates it and commits it within
        # milliseconds: kill it the moment its log grows, mid-placement.
        sent.wait(PLACE_DEADLINE)
        while not over.is_set():
            index = raft_of(a).get("last_index")
            if isinstance(index, int) and index > before:
                a.kill()
                killed.append((time.monotonic(), index))
                return
            time.sleep(KILL_POLL)

    killer = threading.Thread(target=kill_when_appended, daemon=True)
    killer.start()
    key = uuid.uuid4().hex
    sent.set()
    started = time.monotonic()
    first = _post_placement(s, b, b, key)
    answered = time.monotonic()
    took = answered - started
    over.set()
    killer.join(2.0)
    s.require(
        "node 1 (the leader) was SIGKILLed while the placement through node 2 was in flight",
        bool(killed),
        f"log index {killed[0][1]} appended (was {before})" if killed else first.describe(),
    )
    s.check(
        "the client got a typed answer (201, or 503 with an error code) within its deadline",
        typed_answer(first),
        f"{first.describe()} after {took:.1f}s (deadline {PLACE_DEADLINE:g}s), "
        + (
            f"{answered - killed[0][0]:.2f}s after the kill"
            if answered >= killed[0][0]
            else "before the kill reached it"
        ),
    )
    leaders: list[object] = []

    def new_leader() -> bool:
        seen = {raft_of(n).get("leader") for n in (b, c)}
        leaders[:] = sorted(str(x) for x in seen)
        return len(seen) == 1 and seen.pop() in (b.node_id, c.node_id)

    bound = s.setting("election-timeout") * 2 + MARGIN
    elected = s.wait_until(new_leader, bound)
    s.require(
        "a new leader was elected among the survivors",
        elected is not None,
        f"node 2 and 3 follow {leaders} after {elected:.1f}s"
        if elected is not None
        else f"node 2 and 3 see leader {leaders} (election timeout "
        f"{s.setting('election-timeout'):g}s, waited {bound:g}s)",
    )
    retry = _post_placement(s, c, b, key)
    retried = retry.field("instance", "id")
    s.require(
        "a retry under the same Idempotency-Key (through node 3) is a 201",
        retry.status == 201 and isinstance(retried, str),
        retry.describe(),
    )
    ours = first.field("instance", "id") if first.status == 201 else retried
    s.check(
        "it names the instance the first try placed",
        retried == ours,
        f"first try {ours}, retry {retried}",
    )
    assert isinstance(retried, str)
    check_one_instance(s, retried)
    wait_serving(s, "the instance serves on node 2", instance=retried)
    fresh_request_via(s, c, "a fresh request through node 3 succeeds")
    check_converged(s, [b, c])


def _api_node_partitioned(s: Session) -> None:
    proxies = Proxies()
    s.defer(proxies.stop)
    listen = {n: free_port_range(1)[0] for n in (2, 3)}
    # Proxy (a, b): node a dials node b through it (so does anyone else who dials b).
    ports = proxies.start({(3, 2): listen[2], (2, 3): listen[3]})
    via = {2: ports[(3, 2)], 3: ports[(2, 3)]}
    flags = {
        n: {"listen": f"127.0.0.1:{listen[n]}", "advertise": f"ws://127.0.0.1:{via[n]}"}
        for n in (2, 3)
    }
    a, b, c = start_cluster(s, 3, flags=flags)
    inst = place(s, a, [b], "single")
    inst = wait_serving(s, "the instance is ready on node 2", instance=inst.id)
    linked = s.wait_until(lambda: _proxied(proxies) > 0, JOIN_BUDGET)
    s.require(
        "the link between node 2 and node 3 passes the proxy",
        linked is not None,
        f"proxy connections: {_proxy_counts(proxies)}",
    )
    found = a.get("/v1/cluster/links").field("links")
    rows = found if isinstance(found, list) else []
    proxied = [
        f"{r.get('peer_id')} at {r.get('address')}"
        for r in rows
        if isinstance(r, dict)
        and any(re.search(rf":{port}(?!\d)", str(r.get("address"))) for port in via.values())
    ]
    s.require(
        "node 1's links to nodes 2 and 3 bypass the proxies (the cut is between 2 and 3 only)",
        not proxied,
        f"node 1 dialed through a proxy: {proxied}" if proxied else f"{len(rows)} links",
    )
    fresh_request_via(s, c, "a request through node 3 is served by node 2", served_by=b)
    cut_at: list[float] = []

    def cut(n: int) -> None:
        if n == FAULT_AT_TOKEN:
            proxies.set_link(2, 3, LinkMode("oneway"))  # node 3 hears nothing from node 2
            cut_at.append(time.monotonic())

    deadline = min(s.setting("route-idle-timeout"), s.setting("link-liveness-timeout"))
    out = stream_chat(
        c.url, max_tokens=LONG_STREAM, budget=s.budget(deadline + MARGIN + 5), on_token=cut
    )
    s.require(
        "the link node 2 -> node 3 was cut one way mid-stream (node 3 still reaches node 2)",
        bool(cut_at),
        out.describe(),
    )
    s.require(
        "the stream ended with the typed error node_unreachable",
        out.error_code == "node_unreachable",
        out.describe(),
    )
    after = out.ended - cut_at[0]
    s.check(
        "within the API node's deadline",
        after <= deadline + MARGIN,
        f"{after:.1f}s after the cut (allowed min(--route-idle-timeout, "
        f"--link-liveness-timeout) {deadline:g}s + {MARGIN:g}s)",
    )
    s.check("the stream was closed by data: [DONE]", out.done, out.problem or "[DONE]")
    started = time.monotonic()
    during = request(
        "POST", c.url + "/v1/chat/completions", budget=s.budget(deadline + MARGIN),
        body=chat_body(8, stream=False),
    )  # fmt: skip
    took = time.monotonic() - started
    s.check(
        "while cut, a request through node 3 ends typed (or served elsewhere), not hung",
        during.status == 200 or isinstance(during.field("error", "code"), str),
        f"{during.describe()} after {took:.1f}s",
    )
    fresh_request_via(s, a, "the serving node still serves through node 1", served_by=b)
    proxies.set_link(2, 3, LinkMode("up"))
    healed: list[Reply] = []

    def served_through_3() -> bool:
        reply = request(
            "POST", c.url + "/v1/chat/completions", budget=s.budget(MARGIN),
            body=chat_body(8, stream=False),
        )  # fmt: skip
        healed.append(reply)
        return reply.status == 200 and reply.node == b.node_id

    took_heal = s.wait_until(served_through_3, JOIN_BUDGET)
    s.require(
        "after healing, a request through node 3 is served by node 2 again",
        took_heal is not None,
        f"after {took_heal:.1f}s" if took_heal is not None else healed[-1].describe(),
    )
    same = [v.id for v in s.watch.instances() if v.model == MODEL]
    s.check(
        "the instance was never moved (the leader reaches node 2 throughout)",
        same == [inst.id],
        f"instances now {same}, placed {inst.id}",
    )
    check_converged(s, [a, b, c])


def _proxy_counts(proxies: Proxies) -> dict[str, int]:
    return {f"{x}->{y}": st.connections for (x, y), st in proxies.statistics().items()}


def _proxied(proxies: Proxies) -> int:
    return sum(_proxy_counts(proxies).values())


CONTROL_FAULTS: tuple[Scenario, ...] = (
    Scenario(
        "leader-lost-mid-placement",
        "the Raft leader is SIGKILLed the moment it appends a placement sent through a "
        "follower: the client gets a typed answer in time, a new leader is elected, a retry "
        "under the same Idempotency-Key names the same single instance, it serves, and the "
        "survivors' State converges",
        _leader_lost_mid_placement,
        flags=CONTROL_FLAGS,
        budget_s=120.0,
    ),
    Scenario(
        "api-node-partitioned",
        "the link from the serving node to the API node is cut one way mid-stream (a proxy "
        "on loopback): the stream ends with node_unreachable within the API node's deadline, "
        "requests through it fail typed meanwhile, the serving node serves on, and after "
        "healing requests through the API node are served again",
        _api_node_partitioned,
        flags=CONTROL_FLAGS,
        budget_s=120.0,
    ),
)

CONTROL_BREAKS: tuple[Break, ...] = (
    Break(
        "election",
        "the followers wait an hour before they call an election (--election-timeout 3600 "
        "on nodes 2 and 3): a lost leader is never replaced; leader-lost-mid-placement fails, "
        "and so does raft-storage-full-leader (the full leader stops leading, nobody takes over)",
        {},
        node_flags={2: {"election-timeout": "3600"}, 3: {"election-timeout": "3600"}},
    ),
)
