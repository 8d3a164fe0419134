"""Three real nodes on loopback serving as one: a model placed on one node is served through
every node's API (the official ``openai`` client), a leader kill is invisible, a serving node's
death ends its streams with a typed error and the instance moves, and a stopped node is removed.

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
        c.start("b", "--join", a.ws_url, "--model", "none")
        c.start("c", "--join", a.ws_url, "--model", "none")
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
