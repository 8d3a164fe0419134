"""``python -m skulk.bench cluster``: what the cluster layer costs and how fast it heals.

* **The remote hop.** Two real nodes on loopback; the demo model runs on A. The same greedy
  streamed request goes through A's API (served in-process, no hop) and through B's (served on
  A over the federation data plane), alternately after a warm-up each; the ratios are medians of
  the per-pair ratios: ``remote_tokens_per_s_ratio`` (decode tokens/s after the first token,
  remote ÷ local) and ``remote_ttft_added_ms`` (remote TTFT - local TTFT).
* **Failover.** Three nodes (A founds with no model, B and C join); the demo model is placed on
  B; B is SIGKILLed and C is polled with one-token requests every 50 ms. ``failover_s`` is from
  the kill to C's first successful answer, split into ``detection_s`` (kill → B committed
  ``down`` in C's State), ``commit_s`` (→ the re-placed instance in C's State) and ``load_s``
  (→ it is ready and answers). It depends on ``--node-down-after`` (default here 5 s, the
  product default).
* ``placement_100_nodes_ms``: the planner on 100 simulated nodes (``bench placement``).
"""

from __future__ import annotations

import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from skulk.bench._serve import PROMPT, Run, through_api
from skulk.harness import NodeProcess

SECRET = "7c" * 32
POLL = 0.05


def _node(root: Path, models: Path, name: str, *args: str) -> NodeProcess:
    home = root / name
    home.mkdir()
    (home / "models").symlink_to(models)
    node = NodeProcess(home, "--log-level", "warning", *args, env={"SKULK_CLUSTER_SECRET": SECRET})
    return node.start(wait_ready=False)


def _until(predicate: Callable[[], bool], deadline: float, what: str) -> float:
    """Poll until ``predicate`` holds; the time it first did (perf_counter)."""
    end = time.perf_counter() + deadline
    while time.perf_counter() < end:
        try:
            if predicate():
                return time.perf_counter()
        except httpx.HTTPError:
            pass
        time.sleep(POLL)
    raise RuntimeError(f"not {what} within {deadline} s")


def _answers(node: NodeProcess) -> bool:
    body = {"model": "skulk-demo", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1}  # fmt: skip
    return httpx.post(node.url + "/v1/chat/completions", json=body, timeout=10).status_code == 200


def _state(node: NodeProcess) -> dict[str, Any]:
    body: dict[str, Any] = node.get("/v1/cluster/state").json()
    return body


def remote_hop(root: Path, models: Path, max_tokens: int, repeats: int) -> dict[str, object]:
    a = _node(root, models, "hop-a")
    b = _node(root, models, "hop-b", "--join", a.ws_url)
    try:
        _until(lambda: _answers(a) and _answers(b), 120, "serving through both nodes")
        with (
            httpx.Client(base_url=a.url, timeout=120) as via_a,
            httpx.Client(base_url=b.url, timeout=120) as via_b,
        ):
            local, remote = through_api(via_a, max_tokens), through_api(via_b, max_tokens)
            local(PROMPT, 0), remote(PROMPT, 0)  # warm-up; greedy, so the seed is unused
            pairs: list[tuple[Run, Run]] = [
                (local(PROMPT, 0), remote(PROMPT, 0)) for _ in range(repeats)
            ]
    finally:
        b.stop()
        a.stop()
    med = statistics.median
    return {
        "remote_tokens_per_s_ratio": round(
            med(r.tokens_per_s / lo.tokens_per_s for lo, r in pairs), 3
        ),
        "remote_ttft_added_ms": round(med((r.ttft_s - lo.ttft_s) * 1000 for lo, r in pairs), 2),
        "local_tokens_per_s": round(med(lo.tokens_per_s for lo, _ in pairs), 1),
        "remote_tokens_per_s": round(med(r.tokens_per_s for _, r in pairs), 1),
        "local_ttft_ms": round(med(lo.ttft_s for lo, _ in pairs) * 1000, 2),
        "remote_ttft_ms": round(med(r.ttft_s for _, r in pairs) * 1000, 2),
        "tokens": min(r.tokens for _, r in pairs),
    }


def failover(root: Path, models: Path, down_after: float) -> dict[str, object]:
    a = _node(root, models, "fo-a", "--model", "none", "--node-down-after", str(down_after))
    b = _node(root, models, "fo-b", "--join", a.ws_url, "--model", "none")
    c = _node(root, models, "fo-c", "--join", a.ws_url, "--model", "none")
    try:
        _until(lambda: sum(n["status"] == "up" for n in _state(a)["nodes"]) == 3, 90, "three up")
        placed = a.post("/v1/placements", json={"model": "skulk-demo", "nodes": [b.node_id]})
        placed.raise_for_status()
        old = placed.json()["instance"]["id"]
        _until(lambda: _answers(c), 120, "served through C")
        assert b.proc is not None
        b.proc.send_signal(signal.SIGKILL)
        killed = time.perf_counter()
        b.proc.wait(10)
        down = _until(
            lambda: {n["id"]: n["status"] for n in _state(c)["nodes"]}[b.node_id] == "down",
            60,
            "B down",
        )
        moved = _until(lambda: any(i["id"] != old for i in _state(c)["instances"]), 60, "re-placed")
        served = _until(lambda: _answers(c), 120, "served again")
    finally:
        for node in (c, b, a):
            node.stop()
    return {
        "failover_s": round(served - killed, 2),
        "failover_detection_s": round(down - killed, 2),
        "failover_commit_s": round(moved - down, 2),
        "failover_load_s": round(served - moved, 2),
        "node_down_after_s": down_after,
    }


def run(max_tokens: int, repeats: int, down_after: float) -> dict[str, object]:
    from skulk.bench._placement import run as placement
    from skulk.models import ensure_demo_model

    with tempfile.TemporaryDirectory(prefix="skulk-bench-cluster-") as tmp:
        root = Path(tmp)
        models = ensure_demo_model(root / "shared").parent
        result: dict[str, object] = {
            "benchmark": "cluster",
            "model": "skulk-demo",
            "max_tokens": max_tokens,
            "repeats": repeats,
        }
        result.update(remote_hop(root, models, max_tokens, repeats))
        result.update(failover(root, models, down_after))
    result["placement_100_nodes_ms"] = placement(100, 200)["placement_100_nodes_ms"]
    return result
