"""Fan-out of a pulled model over real nodes (part of ``python -m skulk.bench models``).

Per round, a fresh cluster of ``n`` nodes on loopback (every node ``--model none``; the local
Hub endpoint in a subprocess); the generated repo is pulled through the last node
(``POST /v1/pulls``). From the moment the card is registered (its first holder: the node that
downloaded it from the Hub) to the moment ``n`` nodes hold it, as the State says. With 2 nodes
that is one peer fetch (``one_fetch_s``); with 4, the fan-out (``fanout_4_nodes_s``): a tree
(holders serve the next wave) takes about two fetch times, a star three.
"""

from __future__ import annotations

import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from skulk.bench._models import REPO, hub_process
from skulk.harness import NodeProcess

SECRET = "5e" * 32
POLL = 0.05
DEADLINE = 600.0


def _holders(node: NodeProcess) -> tuple[int, ...] | None:
    """The holders of :data:`REPO`'s card in ``node``'s State (``None``: no card yet)."""
    try:
        state = node.get("/v1/cluster/state", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None
    card = next((m for m in state.get("models", ()) if m.get("id") == REPO), None)
    return None if card is None else tuple(card.get("holders", ()))


def _round(root: Path, url: str, n: int) -> float:
    """Seconds from the card's registration to ``n`` holders, on a fresh ``n``-node cluster."""
    env = {"SKULK_CLUSTER_SECRET": SECRET, "HF_ENDPOINT": url, "HF_HUB_DISABLE_TELEMETRY": "1"}
    nodes: list[NodeProcess] = []
    try:
        for i in range(n):
            home = root / f"node-{i}"
            home.mkdir()
            join = ("--join", nodes[0].ws_url) if nodes else ()
            args = ("--log-level", "warning", "--model", "none", *join)
            nodes.append(NodeProcess(home, *args, env=env).start(wait_ready=False))
        last = nodes[-1]
        # Every node in the State and publishing its store (the leader chooses by it).
        last.wait_for(lambda: _ready(last, n), 120, f"{n} nodes with stores")
        answers: list[httpx.Response] = []
        pulling = threading.Thread(
            target=lambda: answers.append(
                last.post("/v1/pulls", json={"model": REPO, "stream": False}, timeout=DEADLINE)
            ),
            daemon=True,
        )
        pulling.start()  # the pull answers once every node holds the model: watch meanwhile
        end = time.perf_counter() + DEADLINE
        registered: float | None = None
        while time.perf_counter() < end:
            holders = _holders(last)
            now = time.perf_counter()
            if holders is not None and registered is None:
                registered = now
            if holders is not None and len(holders) >= n:
                break
            time.sleep(POLL)
        else:
            raise AssertionError(f"{n} nodes did not hold {REPO} in time")
        pulling.join(DEADLINE)
        assert answers and answers[0].status_code == 200, answers and answers[0].text
        assert registered is not None
        return now - registered
    finally:
        for node in nodes:
            node.stop()


def _ready(node: NodeProcess, n: int) -> bool:
    try:
        nodes = node.get("/v1/cluster/nodes", timeout=5).json().get("nodes", ())
    except (httpx.HTTPError, ValueError):
        return False
    return sum(1 for e in nodes if e.get("store") is not None) >= n


def run(mib: int, rounds: int) -> dict[str, Any]:
    from skulk.bench._transfer import write_model

    with tempfile.TemporaryDirectory(prefix="skulk-bench-fanout-") as tmp:
        root = Path(tmp)
        directory = write_model(root / "model", mib)
        one: list[float] = []
        four: list[float] = []
        with hub_process(directory, root) as url:
            for i in range(rounds):
                for n, times in ((2, one), (4, four)) if i % 2 == 0 else ((4, four), (2, one)):
                    work = root / f"round-{i}-{n}"
                    work.mkdir()
                    times.append(_round(work, url, n))
    one_s, four_s = statistics.median(one), statistics.median(four)
    return {
        "rounds": rounds,
        "one_fetch_s": round(one_s, 3),
        "fanout_4_nodes_s": round(four_s, 3),
        "fanout_ratio": round(four_s / one_s, 3),
        "one_fetch_runs_s": [round(t, 3) for t in one],
        "fanout_4_runs_s": [round(t, 3) for t in four],
    }
