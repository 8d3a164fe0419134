"""A model too big for any one node, served by two: three real nodes on loopback, each limited
to advertise less memory than the model needs (``--memory-limit``). Placed single-node it is
refused with the arithmetic; placed as a two-rank pipeline on the two nodes that do not have
it, each fetches its shard's tensors from the one node that does, and the third node's API
serves it to the official ``openai`` client — the same tokens one process computes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from skulk.cluster import PlacementPolicy, model_needs
from skulk.harness import NodeProcess
from skulk.models import ensure_demo_model, local_manifest
from skulk.models._card import card_from_directory
from skulk.models._generated import ModelShape, write_generated_model
from skulk.wire.cluster import ClusterConfig, PathSource

SECRET = "7c" * 32
SHAPE = ModelShape(
    family="llama", layers=4, hidden_size=512, heads=8, kv_heads=4, intermediate_size=1536
)


def need(weight_bytes: int, kv_per_token: int, context: int, share: float) -> int:
    """The planner's admission arithmetic (skulk/cluster/_placement.py), default config."""
    policy = PlacementPolicy.from_config(ClusterConfig())
    weights = math.ceil(weight_bytes * share * policy.overhead)
    return weights + math.ceil(kv_per_token * context * share) + policy.floor_bytes


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("gen")
    demo = ensure_demo_model(root / "demo-home")
    return write_generated_model(root / "big-llama", SHAPE, demo, files=2, seed=3)


@pytest.fixture(scope="module")
def nodes(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[NodeProcess]]:
    card = card_from_directory("big-llama", model_dir, PathSource(str(model_dir)))
    needs = model_needs(card)
    single = need(card.weight_bytes, needs.kv_bytes_per_token, card.context_length, 1.0)
    half = need(card.weight_bytes, needs.kv_bytes_per_token, card.context_length, 0.5)
    limit = str((single + half) // 2)  # fits half the model, not all of it
    root = tmp_path_factory.mktemp("dist")
    env = {"SKULK_CLUSTER_SECRET": SECRET}
    started: list[NodeProcess] = []
    try:
        a = NodeProcess(root / "a", "--model", "none", "--memory-limit", limit, env=env)
        started.append(a.start(wait_ready=False))
        for name in "bc":
            node = NodeProcess(
                root / name, "--join", a.ws_url, "--model", "none", "--memory-limit", limit, env=env
            )
            started.append(node.start(wait_ready=False))
        a.wait_for(
            lambda: all(
                sum(1 for n in x.get("/v1/cluster/nodes").json()["nodes"] if n["status"] == "up")
                == 3
                for x in started
            ),
            90,
            "every node up in every node's State",
        )
        yield started
    finally:
        for node in started:
            node.stop()


def local_greedy(model_dir: Path, prompt: str, max_tokens: int) -> str:
    """What one process generates greedily for the chat ``prompt`` (mlx-lm, in-process)."""
    from mlx_lm import generate, load

    model, tokenizer = load(str(model_dir))
    messages = [{"role": "user", "content": prompt}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return str(generate(model, tokenizer, ids, max_tokens=max_tokens))


def test_a_model_no_node_fits_is_served_by_two_from_a_third_nodes_weights(
    nodes: list[NodeProcess], model_dir: Path
) -> None:
    a, b, c = nodes
    # Single-node: refused, with the arithmetic (what the closest node needs and has).
    refused = a.post("/v1/placements", json={"model": str(model_dir)})
    assert refused.status_code in (409, 507), refused.text
    error = refused.json()["error"]
    assert error["code"] == "not_enough_memory", error
    assert "need" in error["message"] and "have" in error["message"], error
    # A two-rank pipeline on B and C, which do not have the model: they fetch it from A.
    placed = a.post(
        "/v1/placements",
        json={"model": str(model_dir), "sharding": "pipeline", "nodes": [b.node_id, c.node_id]},
    )
    assert placed.status_code == 201, placed.text
    instance = placed.json()["instance"]
    assert sorted(s["node"] for s in instance["shards"]) == sorted([b.node_id, c.node_id])
    rank0 = instance["shards"][0]["node"]

    def ready() -> bool:
        for inst in a.get("/v1/instances").json()["instances"]:
            if inst["id"] == instance["id"]:
                return all(s["runner"]["phase"] == "ready" for s in inst["shards"])
        return False

    a.wait_for(ready, 180, "both ranks ready")
    # Each of B and C holds only about its own shard's share of the weights, fetched from A
    # (sparse files: the blocks on disk are what was written).
    weights = sum(f.stat().st_size for f in model_dir.glob("*.safetensors"))
    staging = "peer-" + local_manifest(model_dir).sha256  # the store's fetch staging
    for node in (b, c):
        fetched = node.home / "store" / "staging" / staging
        on_disk = sum(f.stat().st_blocks * 512 for f in fetched.glob("*.safetensors"))
        assert 0.3 * weights < on_disk < 0.75 * weights, (node.node_id, on_disk, weights)
    # Served through A's API (A runs no rank) to the official client: the tokens one process
    # computes, plain and streamed.
    client = openai.OpenAI(base_url=a.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    model_id = "big-llama"
    prompt = "Tell me about the sea"
    raw = client.chat.completions.with_raw_response.create(
        model=model_id, messages=[{"role": "user", "content": prompt}], max_tokens=12,
        temperature=0,
    )  # fmt: skip
    assert raw.headers["x-skulk-node"] == rank0
    reply: Any = raw.parse()
    expected = local_greedy(model_dir, prompt, 12)
    assert reply.choices[0].message.content == expected
    stream = client.chat.completions.create(
        model=model_id, messages=[{"role": "user", "content": prompt}], max_tokens=12,
        temperature=0, stream=True,
    )  # fmt: skip
    assert "".join(ch.choices[0].delta.content or "" for ch in stream if ch.choices) == expected
    timeline = a.get("/v1/diagnostics/cluster/timeline").json()
    assert {e["node"] for e in timeline["events"]} >= {b.node_id, c.node_id}
    assert json.dumps(timeline)
