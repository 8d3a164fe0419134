"""Models from the Hub in a real cluster: three ``serve`` processes on loopback, each with its
own Hugging Face cache, pointed at the tests' local Hub endpoint (``tests/hubserver.py``),
which counts the bytes it sends.

* A pull through C downloads every weight file from the endpoint exactly once (one node
  downloads; the others fetch it over the cluster's links), and all three nodes end as
  holders, with the download's progress visible meanwhile.
* A pipeline on B and C of the pulled model serves the same text as a single instance on A.
* A model no node has room for is ``disk_full`` before any weight byte moves (a node with a
  small ``--store-budget``).
* The Hub gone mid-download: the download fails with a typed reason on the node that ran it,
  the leader re-places it on another node, and the pull ends with the typed error (nothing
  waits forever). Last in the module: the endpoint stays gone.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from skulk.harness import NodeProcess
from skulk.models import ModelShape, ensure_demo_model, local_manifest, write_generated_model
from tests.hubserver import HubServer, repo_files, running_hub

SECRET = "3d" * 32
REPO = "org/tiny"
GONE = "org/gone"
PROMPT = "Say something about foxes."


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hub-cluster-model")
    demo = ensure_demo_model(root / "demo-home")
    return write_generated_model(root / "tiny", ModelShape(layers=4), demo, files=2, seed=11)


@pytest.fixture(scope="module")
def hub(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    root = tmp_path_factory.mktemp("hub-cluster-gone")
    demo = ensure_demo_model(root / "demo-home")
    gone = write_generated_model(root / "gone", ModelShape(layers=2), demo, files=1, seed=12)
    with running_hub() as server:
        server.add_repo(REPO, repo_files(model_dir))
        server.add_repo(GONE, repo_files(gone))
        yield server


def node_env(hub: HubServer, home: Path) -> dict[str, str]:
    return {
        "SKULK_CLUSTER_SECRET": SECRET,
        "HF_ENDPOINT": hub.url,
        "HF_HOME": str(home / "hf"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }


def up_with_stores(node: NodeProcess, n: int) -> bool:
    nodes = node.get("/v1/cluster/nodes").json()["nodes"]
    return sum(1 for e in nodes if e["status"] == "up" and e.get("store") is not None) >= n


@pytest.fixture(scope="module")
def cluster(
    hub: HubServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[NodeProcess]]:
    root = tmp_path_factory.mktemp("hub-cluster")
    started: list[NodeProcess] = []
    try:
        for name in "abc":
            join = ("--join", started[0].ws_url) if started else ()
            home = root / name
            node = NodeProcess(home, "--model", "none", *join, env=node_env(hub, home))
            started.append(node.start(wait_ready=False))
        for node in started:
            node.wait_for(lambda n=node: up_with_stores(n, 3), 90, "3 nodes up with stores")
        yield started
    finally:
        for node in started:
            node.stop()


def card_of(node: NodeProcess, model: str) -> dict[str, Any] | None:
    state = node.get("/v1/cluster/state").json()
    return next((m for m in state["models"] if m["id"] == model), None)


def test_a_pull_through_c_downloads_each_file_once_and_every_node_holds_it(
    cluster: list[NodeProcess], hub: HubServer, model_dir: Path
) -> None:
    a, b, c = cluster
    with httpx.stream(
        "POST", f"{c.url}/v1/pulls", json={"model": REPO, "stream": True}, timeout=300
    ) as reply:
        assert reply.status_code == 200, reply.read()
        lines = [json.loads(line) for line in reply.iter_lines() if line.strip()]
    assert lines and "error" not in lines[-1], lines[-3:]
    assert lines[-1]["phase"] == "done"
    assert any(line["phase"] in ("downloading", "spreading") for line in lines)
    for name, body in repo_files(model_dir).items():
        if name.endswith(".safetensors"):  # each weight byte left the Hub once
            assert hub.served_bytes(REPO, name) == len(body), name
    card = card_of(a, REPO)
    assert card is not None
    assert sorted(card["holders"]) == sorted(n.node_id for n in cluster)
    assert card["manifest_sha256"] == local_manifest(model_dir).sha256
    assert card["source"]["repo"] == REPO and len(card["source"]["commit"]) == 40
    # Every node's store has it, under its name; the cluster view lists every holder.
    for node in cluster:
        store = node.get("/v1/store").json()
        assert any(card["manifest_sha256"] == m["sha256"] for m in store["store"]["stored"])
    # A second pull moves nothing.
    again = b.post("/v1/pulls", json={"model": REPO, "stream": False}, timeout=60)
    assert again.status_code == 200, again.text
    weights = sum(len(v) for k, v in repo_files(model_dir).items() if k.endswith(".safetensors"))
    assert sum(hub.served_bytes(REPO, k) for k in repo_files(model_dir)) <= weights + 2**20


def greedy(node: NodeProcess, model: str) -> str:
    """The greedy answer through ``node`` (its router may see the new instance ready a moment
    after the State does: ``model_not_ready`` is asked again)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 16,
        "temperature": 0,
    }
    replies: list[httpx.Response] = []

    def answered() -> bool:
        reply = node.post("/v1/chat/completions", json=body, timeout=120)
        replies.append(reply)
        return reply.status_code != 503

    node.wait_for(answered, 60, "an answer")
    reply = replies[-1]
    assert reply.status_code == 200, reply.text
    return str(reply.json()["choices"][0]["message"]["content"])


def place(node: NodeProcess, body: dict[str, Any]) -> str:
    placed = node.post("/v1/placements", json=body, timeout=120)
    assert placed.status_code in (200, 201), placed.text
    instance = placed.json()["instance"]
    instance_id = str(instance["id"])

    def ready() -> bool:
        for inst in node.get("/v1/instances").json()["instances"]:
            if inst["id"] == instance_id:
                return all(s["runner"]["phase"] == "ready" for s in inst["shards"])
        return False

    node.wait_for(ready, 180, f"instance {instance_id} ready")
    return instance_id


def test_a_pipeline_on_b_and_c_serves_what_a_single_instance_serves(
    cluster: list[NodeProcess],
) -> None:
    a, b, c = cluster
    assert card_of(a, REPO) is not None  # pulled by the test above
    single = place(a, {"model": REPO, "nodes": [a.node_id]})
    expected = greedy(b, REPO)
    assert a.delete(f"/v1/instances/{single}").status_code == 200
    place(a, {"model": REPO, "sharding": "pipeline", "nodes": [b.node_id, c.node_id]})
    assert greedy(a, REPO) == expected


def test_a_model_no_node_has_room_for_is_disk_full_before_any_byte(
    hub: HubServer, tmp_path: Path
) -> None:
    home = tmp_path / "small"
    env = node_env(hub, home)
    node = NodeProcess(home, "--model", "none", "--store-budget", "64K", env=env)
    try:
        node.start(wait_ready=False)
        node.wait_for(lambda: up_with_stores(node, 1), 60, "the node up with its store")
        before = {k: hub.served_bytes(GONE, k) for k in ("model.safetensors",)}
        reply = node.post("/v1/pulls", json={"model": GONE, "stream": False}, timeout=60)
        assert reply.status_code == 507, reply.text
        assert reply.json()["error"]["code"] == "disk_full"
        assert {k: hub.served_bytes(GONE, k) for k in before} == before  # no weight byte
    finally:
        node.stop()


def test_the_hub_gone_mid_download_fails_typed_and_the_download_is_re_placed(
    cluster: list[NodeProcess], hub: HubServer
) -> None:
    a, _, c = cluster
    size = len(hub.repos[GONE].files["model.safetensors"].data)
    hub.cut_once(GONE, "model.safetensors", size // 2, then_gone=True)
    reply = c.post("/v1/pulls", json={"model": GONE, "stream": False}, timeout=600)
    assert reply.status_code == 502, reply.text
    assert reply.json()["error"]["code"] == "hub_unreachable"
    downloads = a.get("/v1/downloads").json()
    failed = [d for d in downloads["downloads"] if d["model"] == GONE]
    assert len(failed) >= 2, failed  # re-placed away from the first node that failed
    assert all(d["status"] == "failed" and d["reason"] == "hub_unreachable" for d in failed)
    assert len({d["node"] for d in failed}) == len(failed)
    assert card_of(a, GONE) is None
