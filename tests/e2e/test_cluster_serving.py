"""Three real nodes on loopback serving as one: a model placed on one node is served through
every node's API (the official ``openai`` client), a leader kill is invisible, a serving node's
death ends its streams with a typed error and the instance moves, and a stopped node is removed.
Every node shows every node's health and the runners it serves (``GET /v1/cluster/nodes``); a
killed node's row says ``down`` until it is removed.

The tests share one cluster and run in order (each leaves it as the next expects): A founds the
cluster with no model (``--model none``), B and C join; the demo model is placed on B.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from skulk.harness import NodeProcess

SECRET = "6b" * 32
MODEL = "skulk-demo"
DOWN_AFTER = "2"  # --node-down-after, seconds: the test waits this plus a load
STREAM_DEADLINE = 15.0  # a lost serving node ends a stream within this (docs/operations.md)


class Cluster:
    def __init__(self, root: Path, skulk_home: Path) -> None:
        self.root = root
        self.skulk_home = skulk_home
        self.nodes: dict[str, NodeProcess] = {}

    def start(self, name: str, *args: str) -> NodeProcess:
        home = self.nodes[name].home if name in self.nodes else self.root / name
        if not home.exists():
            home.mkdir()
            (home / "models").symlink_to(self.skulk_home / "models")  # one demo model for all
        node = NodeProcess(home, *args, env={"SKULK_CLUSTER_SECRET": SECRET})
        self.nodes[name] = node.start(wait_ready=False)
        return node

    def live(self) -> list[NodeProcess]:
        return [n for n in self.nodes.values() if n.proc is not None and n.proc.poll() is None]

    def leader(self) -> str | None:
        for node in self.live():
            try:
                raft = node.get("/v1/cluster/raft").json()
            except httpx.HTTPError:
                continue
            if raft.get("role") == "leader":
                return str(raft["node_id"])
        return None

    def by_id(self, node_id: str) -> NodeProcess:
        return next(n for n in self.nodes.values() if n.node_id == node_id)


def client(node: NodeProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.url + "/v1", api_key="unused", max_retries=0, timeout=30)


def instances(node: NodeProcess) -> list[dict[str, Any]]:
    body: list[dict[str, Any]] = node.get("/v1/instances").json()["instances"]
    return body


def ready_on(node: NodeProcess) -> str | None:
    """The node id of the ready demo instance, as ``node`` sees the State."""
    for inst in instances(node):
        rank0 = inst["shards"][0]
        if inst["model"] == MODEL and rank0["runner"]["phase"] == "ready":
            return str(rank0["node"])
    return None


def ask(node: NodeProcess, text: str = "Hello", max_tokens: int = 8) -> tuple[str, str]:
    """One chat completion through ``node``: (text, serving node id from the header)."""
    raw = client(node).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": text}], max_tokens=max_tokens
    )
    reply = raw.parse()
    return reply.choices[0].message.content or "", raw.headers["x-skulk-node"]


def served_by(node: NodeProcess) -> str | None:
    """The serving node of one request through ``node``, or None while it cannot be served."""
    try:
        return ask(node)[1]
    except openai.APIError:
        return None


@pytest.fixture(scope="module")
def cluster(skulk_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"), skulk_home)
    try:
        a = c.start("a", "--model", "none", "--node-down-after", DOWN_AFTER)
        json_logs = ("--log-format", "json")  # A writes text lines, B and C JSON lines
        c.start("b", "--join", a.ws_url, "--model", "none", *json_logs)
        c.start("c", "--join", a.ws_url, "--model", "none", *json_logs)
        a.wait_for(
            lambda: all(
                len([n for n in x.get("/v1/cluster/nodes").json()["nodes"] if n["status"] == "up"])
                == 3
                for x in c.live()
            ),
            90,
            "every node up in every node's State",
        )
        yield c
    finally:
        for node in c.nodes.values():
            node.stop()


def test_a_model_placed_on_b_is_served_through_every_node(cluster: Cluster) -> None:
    a, b, c = (cluster.nodes[n] for n in "abc")
    # "B" is the serving node; the next test kills the leader, which must not be B.
    if cluster.leader() == b.node_id:
        cluster.nodes["b"], cluster.nodes["c"] = c, b
        b, c = c, b
    dry = a.post("/v1/placements", json={"model": MODEL, "nodes": [b.node_id], "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert [s["node"] for s in dry.json()["plan"]["shards"]] == [b.node_id]
    assert instances(a) == []  # a dry run commits nothing
    tensor = {"model": MODEL, "sharding": "tensor", "min_nodes": 2, "dry_run": True}
    planned = a.post("/v1/placements", json=tensor)
    assert planned.status_code == 200, planned.text
    addresses = [s["address"] for s in planned.json()["plan"]["shards"]]
    assert len(addresses) == 2 and all(addresses) and len(set(addresses)) == 2
    assert instances(a) == []
    missing = a.post("/v1/placements", json={"model": "no-such-model"})
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "unknown_model"
    # Placed with the client CLI, which follows the runner to ready: not on a terminal, one
    # line per phase on stderr, the ready instance on stdout.
    placed = subprocess.run(
        [sys.executable, "-m", "skulk", "place", MODEL, "--nodes", b.node_id, "--wait",
         "--timeout", "120", "--api", a.url],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert placed.returncode == 0, placed.stderr
    first, _, table = placed.stdout.partition("\n")
    assert first.startswith("ready ") and first.endswith(f": {MODEL} (single)"), placed.stdout
    instance_id = first.split()[1].rstrip(":")
    cells = table.splitlines()[1].split()  # RANK NODE LAYERS ADDRESS RUNNER
    assert (cells[:2], cells[-1]) == (["0", b.node_id], "ready"), placed.stdout
    assert placed.stderr.splitlines()[-1] == f"{instance_id}: rank 0 ready", placed.stderr
    a.wait_for(lambda: all(ready_on(n) == b.node_id for n in cluster.live()), 120, "ready on B")
    for node in (a, b, c):
        text, served_by = ask(node)
        assert served_by == b.node_id and isinstance(text, str)
        models = client(node).models.list()
        assert [m.id for m in models.data] == [MODEL]
    # Streamed through C: the headers say B, every chunk arrives.
    with client(c).chat.completions.with_streaming_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Tell me"}], max_tokens=12, stream=True
    ) as response:
        assert response.headers["x-skulk-node"] == b.node_id
        chunks = list(response.parse())
    assert chunks and chunks[-1].choices[0].finish_reason in ("stop", "length")
    # The client CLI over any node's API shows the same instance, where it runs.
    ps = subprocess.run(
        [sys.executable, "-m", "skulk", "ps", "--api", c.url, "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    shown = json.loads(ps.stdout)["instances"]
    assert [i["shards"][0]["node"] for i in shown] == [b.node_id]
    table = subprocess.run(
        [sys.executable, "-m", "skulk", "ps", "--api", a.url],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    assert shown[0]["id"] in table and b.node_id in table
    # One frame of `top` through C: the instance, ready on B, and every node.
    frame = subprocess.run(
        [sys.executable, "-m", "skulk", "top", "--once", "--api", c.url],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout  # fmt: skip
    rows = [line.split() for line in frame.splitlines() if line.startswith(instance_id)]
    assert len(rows) == 1, frame
    row = rows[0]
    assert row[1:5] == [MODEL, "single", "ready", b.node_id], frame
    for node in (a, b, c):
        assert any(line.split()[:2] == [node.node_id, "up"] for line in frame.splitlines())


def nodes_view(node: NodeProcess) -> dict[str, dict[str, Any]]:
    """``GET /v1/cluster/nodes`` through ``node``, by node id."""
    return {r["node_id"]: r for r in node.get("/v1/cluster/nodes").json()["nodes"]}


def test_every_node_shows_each_nodes_health_and_what_it_serves(cluster: Cluster) -> None:
    a, b, c = (cluster.nodes[n] for n in "abc")
    instance = instances(a)[0]["id"]
    asked = [0.0]

    def busy_b_seen_from_c() -> bool:
        """B's runner, as C learns it by gossip, generating and with a first-token time."""
        if time.monotonic() - asked[0] > 1.0:  # keep tokens flowing through A, a request a second
            ask(a, "Count with me", max_tokens=16)
            asked[0] = time.monotonic()
        runners = nodes_view(c)[b.node_id]["serving"]
        return any(r["tokens_per_s"] > 0 and r["ttft_p50_s"] is not None for r in runners)

    c.wait_for(busy_b_seen_from_c, 60, "B's tokens/s and TTFT shown through C")

    def all_ok_everywhere() -> bool:
        for x in cluster.live():
            rows = nodes_view(x)
            if set(rows) != {a.node_id, b.node_id, c.node_id}:
                return False
            if any(r["health"] != {"level": "ok", "reasons": []} for r in rows.values()):
                return False
            if rows[a.node_id]["serving"] or rows[c.node_id]["serving"]:
                return False
            served = rows[b.node_id]["serving"]
            if [(s["instance_id"], s["model"], s["rank"], s["phase"]) for s in served] != [
                (instance, MODEL, 0, "ready")
            ]:
                return False
            s = served[0]  # its KV budget comes with the runner's first heartbeat once ready
            if not 0 <= s["kv_used_bytes"] <= s["kv_capacity_bytes"] or not s["kv_capacity_bytes"]:
                return False
            assert s["running"] >= 0 and s["waiting"] >= 0
        return True

    a.wait_for(all_ok_everywhere, 60, "every node ok, B serving the instance, in every view")


def scrape(node: NodeProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """``node``'s ``/metrics``, parsed by ``prometheus_client``: (name, labels) → value."""
    response = node.get("/metrics")
    assert response.status_code == 200
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def summed(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str,
           **labels: str) -> float:  # fmt: skip
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= ls)


def test_metrics_count_a_routed_request_where_received_and_where_served(
    cluster: Cluster,
) -> None:
    """A request through A served on B: A counts it (``route="remote"``), B counts having
    served a routed request and its prefix cache saw the prompt; B's own count is unchanged."""
    a, b = cluster.nodes["a"], cluster.nodes["b"]
    before_a, before_b = scrape(a), scrape(b)
    raw = client(a).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Count me"}], max_tokens=6
    )
    reply = raw.parse()
    assert raw.headers["x-skulk-node"] == b.node_id and reply.usage is not None
    after_a, after_b = scrape(a), scrape(b)

    def grew(after: dict[Any, float], before: dict[Any, float], name: str, **kw: str) -> float:
        return summed(after, name, **kw) - summed(before, name, **kw)

    remote = {"model": MODEL, "route": "remote"}
    finish = reply.choices[0].finish_reason
    assert grew(after_a, before_a, "skulk:request_success_total", **remote,
                finish_reason=finish) == 1  # fmt: skip
    assert grew(after_a, before_a, "skulk:prompt_tokens_total", **remote) == (
        reply.usage.prompt_tokens
    )
    assert grew(after_a, before_a, "skulk:generation_tokens_total", **remote) == (
        reply.usage.completion_tokens
    )
    assert grew(after_b, before_b, "skulk:request_success_total") == 0  # counted once: on A
    assert grew(after_b, before_b, "skulk:routed_requests_served_total") == 1
    assert grew(after_b, before_b, "skulk:prefix_cache_queries_total", model=MODEL) == (
        reply.usage.prompt_tokens
    )
    assert summed(after_a, "skulk:prefix_cache_queries_total") == 0  # A runs no instance
    for samples in (after_a, after_b):
        assert summed(samples, "skulk:link_state", state="up") == 2  # linked to both others
        assert summed(samples, "skulk:cluster_nodes", status="up") == 3
    leaders = [summed(scrape(n), "skulk:raft_role", role="leader") for n in cluster.live()]
    assert sorted(leaders) == [0, 0, 1]

def json_lines(node: NodeProcess) -> list[dict[str, Any]]:
    """The node's log lines that are JSON objects (its --log-format json lines)."""
    out = []
    for line in list(node.output):
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def test_one_request_is_followed_across_the_nodes(cluster: Cluster) -> None:
    """A request with x-request-id through A, served on B: the id comes back, B's log lines
    carry it, and any node (C) shows its timeline from both nodes."""
    a, b, c = (cluster.nodes[n] for n in "abc")
    rid = f"e2e-follow.{time.time_ns()}"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Follow me"}]}
    ours = {"x-request-id": rid}
    r = a.post("/v1/chat/completions", json={**chat, "max_tokens": 6}, headers=ours)
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == rid and r.headers["x-skulk-node"] == b.node_id
    # Streamed, the header is there too; without one, the node names the request itself.
    streamed = {**chat, "max_tokens": 4, "stream": True}
    with httpx.stream("POST", a.url + "/v1/chat/completions", json=streamed, timeout=30) as s:
        assert s.status_code == 200 and s.headers["x-request-id"].startswith("req-")
        s.read()
    # Every error body carries the id, in each format's place for it.
    bad = {"x-request-id": rid + ".bad"}
    openai_err = a.post("/v1/chat/completions", json={"model": MODEL}, headers=bad)
    assert openai_err.status_code == 400 and openai_err.headers["x-request-id"] == rid + ".bad"
    assert openai_err.json()["error"]["request_id"] == rid + ".bad"
    anthropic_err = a.post("/v1/messages", json={"model": MODEL}, headers=bad)
    assert anthropic_err.json()["error"]["request_id"] == rid + ".bad"
    ollama_err = a.post("/api/chat", json={"model": MODEL, "messages": "no"}, headers=bad)
    assert ollama_err.status_code == 400 and ollama_err.json()["request_id"] == rid + ".bad"
    # One request's timeline, asked of the third node: A's hop and B's serving, merged.
    wanted = {
        (a.node_id, "request.received"), (a.node_id, "request.routed"), (a.node_id, "route.hop"),
        (b.node_id, "route.arrived"), (b.node_id, "request.start"),
        (b.node_id, "request.admitted_kv"), (b.node_id, "request.prefill"),
        (b.node_id, "request.first_token"), (b.node_id, "request.finish"),
        (a.node_id, "request.done"),
    }  # fmt: skip

    def timeline() -> dict[str, Any]:
        answer = c.get(f"/v1/requests/{rid}")
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    c.wait_for(
        lambda: wanted <= {(e["node_id"], e["kind"]) for e in timeline()["events"]},
        15,
        "the request's events from A and B",
    )
    body = timeline()
    assert body["request_id"] == rid
    times = [e["at"] for e in body["events"]]
    assert times == sorted(times)
    assert {e["instance"] for e in body["events"] if e["node_id"] == b.node_id} == {
        instances(c)[0]["id"]
    }
    # B wrote JSON lines that name the request, the node and the instance; A's text lines
    # show the id in brackets.
    b.wait_for(lambda: any(line.get("request_id") == rid for line in json_lines(b)), 10, "B's line")
    mine = [line for line in json_lines(b) if line.get("request_id") == rid]
    assert {line["node"] for line in mine} == {b.node_id}
    assert all(line["instance"] and line["level"] and line["timestamp"] for line in mine)
    assert f"[{rid}]" in a.log()
    # Adversarial ids: refused with a 400 naming the header, under a fresh id of the node's.
    for wrong in ("x" * 129, "two words", "tab\there", "caf\u00e9"):
        refused = a.post(
            "/v1/chat/completions", json=chat, headers={"x-request-id": wrong.encode("latin-1")}
        )
        assert refused.status_code == 400, wrong
        error = refused.json()["error"]
        assert error["param"] == "x-request-id"
        assert error["request_id"] == refused.headers["x-request-id"] != wrong
    twice = a.post(
        "/v1/chat/completions", json=chat, headers=[("x-request-id", "a"), ("x-request-id", "b")]
    )
    assert twice.status_code == 400 and twice.json()["error"]["param"] == "x-request-id"
    unknown = c.get("/v1/requests/never-sent-" + rid)
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "request_not_found"
    for malformed in ("two%20words", "x" * 129):
        answer = c.get("/v1/requests/" + malformed)
        assert answer.status_code == 400 and answer.json()["error"]["param"] == "request_id"


def runner_pid(node: NodeProcess) -> int:
    pid: int = node.runner()["pid"]
    return pid


def test_killing_the_leader_mid_stream_is_invisible(cluster: Cluster) -> None:
    b, c = cluster.nodes["b"], cluster.nodes["c"]
    leader_id = cluster.leader()
    assert leader_id is not None
    assert leader_id != b.node_id  # B was chosen as a follower
    leader = cluster.by_id(str(leader_id))
    through = c if leader is not c else cluster.nodes["a"]
    pid = runner_pid(b)
    with client(through).chat.completions.with_streaming_response.create(
        model=MODEL, messages=[{"role": "user", "content": "Go on"}], max_tokens=64, stream=True
    ) as response:
        chunks = response.parse()
        first = next(iter(chunks))
        leader.signal(signal.SIGKILL)
        leader.wait_exit(10)
        rest = list(chunks)
    assert first is not None and rest[-1].choices[0].finish_reason in ("stop", "length")
    through.wait_for(lambda: cluster.leader() not in (None, leader_id), 30, "a new leader elected")
    assert runner_pid(b) == pid  # a leader change never restarts a runner
    for node in cluster.live():
        assert ask(node)[1] == b.node_id
    # The old leader comes back as the member it was (its data dir holds its Raft log).
    name = next(k for k, v in cluster.nodes.items() if v is leader)
    back = cluster.start(name, "--join", through.ws_url, "--model", "none")
    back.wait_for(lambda: served_by(back) == b.node_id, 90, "the old leader serving again")


def test_killing_the_serving_node_fails_its_streams_fast_and_the_instance_moves(
    cluster: Cluster,
) -> None:
    b, c = cluster.nodes["b"], cluster.nodes["c"]
    with client(c).chat.completions.with_streaming_response.create(
        model=MODEL, messages=[{"role": "user", "content": "More"}], max_tokens=2000, stream=True
    ) as response:
        chunks = iter(response.parse())
        next(chunks)
        b.signal(signal.SIGKILL)
        killed = time.monotonic()
        with pytest.raises(openai.APIError) as failure:
            for _ in chunks:
                pass
        assert time.monotonic() - killed < STREAM_DEADLINE
    assert "node_unreachable" in str(failure.value.body or failure.value)
    b.wait_exit(10)
    c.wait_for(lambda: ready_on(c) not in (None, b.node_id), 120, "the instance moved and ready")
    assert ask(c)[1] != b.node_id
    state = c.get("/v1/cluster/state").json()
    assert {n["id"]: n["status"] for n in state["nodes"]}[b.node_id] == "down"


def test_a_killed_member_keeps_an_error_row_until_it_is_removed(cluster: Cluster) -> None:
    b = cluster.nodes["b"]  # SIGKILLed by the test before, still a member (committed down)
    for node in cluster.live():

        def down_row(node: NodeProcess = node) -> bool:
            row = nodes_view(node).get(b.node_id)
            if row is None or row["health"]["level"] != "error":
                return False
            reasons = row["health"]["reasons"]
            assert [r["code"] for r in reasons] == ["down"] and reasons[0]["remedy"]
            return row["serving"] == [] and row["status"] == "down"

        node.wait_for(down_row, 30, "the killed node's row error/down")


def test_a_stopped_node_is_removed_from_state_and_membership(cluster: Cluster) -> None:
    b, c = cluster.nodes["b"], cluster.nodes["c"]
    r = c.delete(f"/v1/cluster/nodes/{b.node_id}")
    assert r.status_code == 200, r.text
    state = c.get("/v1/cluster/state").json()
    assert b.node_id not in {n["id"] for n in state["nodes"]}
    raft = c.get("/v1/cluster/raft").json()
    assert b.node_id not in raft["voters"] + raft["learners"]
    again = c.delete(f"/v1/cluster/nodes/{b.node_id}")
    assert again.status_code == 404 and again.json()["error"]["code"] == "unknown_node"
    c.wait_for(lambda: b.node_id not in nodes_view(c), 30, "the removed node's row gone")
    # Started again (its old data and all), it links up and is added back like a new node.
    name = next(k for k, v in cluster.nodes.items() if v is b)
    back = cluster.start(name, "--join", c.ws_url, "--model", "none")

    def member_again() -> bool:
        raft = c.get("/v1/cluster/raft").json()
        nodes = {n["id"]: n["status"] for n in c.get("/v1/cluster/state").json()["nodes"]}
        return back.node_id in raft["voters"] + raft["learners"] and nodes.get(back.node_id) == "up"

    c.wait_for(member_again, 60, "the removed node a member again")


def test_a_crash_looping_runner_makes_the_leader_move_its_instance(cluster: Cluster) -> None:
    c = cluster.nodes["c"]
    d = cluster.start(
        "d", "--join", c.ws_url, "--model", "none",
        "--runner-faults", "crash@hello", "--restart-limit", "1", "--restart-backoff", "0.05",
        "--crash-loop-cooldown", "3600",
    )  # fmt: skip
    c.wait_for(
        lambda: any(n["node_id"] == d.node_id and n["status"] == "up"
                    for n in c.get("/v1/cluster/nodes").json()["nodes"]),
        60, "D up in the State",
    )  # fmt: skip
    r = c.post("/v1/placements", json={"model": MODEL, "nodes": [d.node_id]})
    assert r.status_code == 201, r.text
    doomed = r.json()["instance"]["id"]

    def moved() -> bool:
        mine = [i for i in instances(c) if i["id"] == doomed]
        others = [i for i in instances(c) if i["id"] != doomed]
        return (
            not mine
            and len(others) == 2
            and all(
                i["shards"][0]["node"] != d.node_id and i["shards"][0]["runner"]["phase"] == "ready"
                for i in others
            )
        )

    c.wait_for(moved, 120, "the crash-looping instance moved off D and ready elsewhere")
    assert d.diagnostics()["instances"] == {}  # D stopped its runner: nothing assigned there
