"""``python -m skulk.bench placement``: how long the planner takes for many simulated nodes.

Nodes get deterministic pseudo-random free memory (a seeded ``random.Random``); the model is
sized so that a single placement fits on one node and a pipeline needs several. Each plan is
timed ``repeats`` times with ``time.perf_counter``; the result reports medians in milliseconds.
"""

from __future__ import annotations

import random
import statistics
import time

from skulk.cluster import ModelNeeds, NodeCapacity, PlacementRequest, Plan, plan
from skulk.wire.telemetry import ComputePorts

GIB = 1 << 30


def run(nodes: int = 100, repeats: int = 200, seed: int = 0) -> dict[str, object]:
    rng = random.Random(seed)
    capacity = [
        NodeCapacity(
            f"node-{i:04d}",
            rng.random() > 0.05,
            rng.randrange(8 * GIB, 64 * GIB),
            ComputePorts(f"10.0.{i // 256}.{i % 256}", 53416, 53447),
        )
        for i in range(nodes)
    ]
    models = {
        "small": ModelNeeds("small", 4 * GIB, 32, 8192, 128 * 1024, "llama", 32, 8),
        "large": ModelNeeds("large", 400 * GIB, 80, 8192, 320 * 1024, "llama", 64, 8),
        "medium": ModelNeeds("medium", 160 * GIB, 80, 8192, 320 * 1024, "llama", 64, 8),
    }
    cases = {
        "single": PlacementRequest("small"),
        "pipeline": PlacementRequest("large", "pipeline"),
        "tensor": PlacementRequest("medium", "tensor", min_nodes=2),
    }
    result: dict[str, object] = {"nodes": nodes, "repeats": repeats}
    for name, request in cases.items():
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            got = plan(request, models, capacity)
            times.append((time.perf_counter() - start) * 1000)
        assert isinstance(got, Plan), got
        result[f"{name}_ms_median"] = round(statistics.median(times), 3)
        result[f"{name}_ms_max"] = round(max(times), 3)
        result[f"{name}_ranks"] = len(got.shards)
    result["placement_100_nodes_ms"] = max(
        v for k, v in result.items() if k.endswith("_ms_median") and isinstance(v, float)
    )
    return result
