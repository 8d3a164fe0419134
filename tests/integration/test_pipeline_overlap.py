"""A pipeline's micro-batches overlap: with several requests running, rank 0 computes one
micro-batch's layers while rank 1 computes another's (skulk.engine._sharded_forward,
**Overlap**), and every request gives what one process gives alone, greedy and seeded.

The last rank is 10 ms slow at every decode step (a fault) so the requests run together. Rank 0's
trace notes the most passes in flight when a pass completed (``in flight 2``); with
``SKULK_PIPELINE_OVERLAP=off`` (one batch, the ranks taking turns) it never has two.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import trio

from skulk.engine import OVERLAP_ENV
from skulk.runner import loopback_hosts, open_local_group, shard_specs
from skulk.wire.runner import Finished, Prompt, SamplingParams, TextPrompt
from tests.integration.test_runner_distributed import (
    CONFIG,
    GREEDY,
    LAYERS,
    PROMPTS,
    SAMPLED,
    generate,
    models,
    reference,
)

__all__ = ["models"]  # the module-scoped model fixture, shared

REQUESTS: tuple[tuple[str, Prompt, SamplingParams], ...] = (
    ("g0", PROMPTS[0], attrs.evolve(GREEDY, max_tokens=24)),
    ("s0", PROMPTS[1], attrs.evolve(SAMPLED, seed=31, max_tokens=24)),
    ("g1", TextPrompt("Once upon a time"), attrs.evolve(GREEDY, max_tokens=20)),
    ("s1", PROMPTS[0], attrs.evolve(SAMPLED, seed=32, max_tokens=28)),
)


async def serve_together(model: Path, world: int) -> tuple[dict[str, list[int]], list[str]]:
    """Every request of :data:`REQUESTS` at once on a pipeline of ``world`` ranks; their
    tokens, and rank 0's traced details of completed passes."""
    specs = shard_specs("pipeline", loopback_hosts(world), LAYERS)
    results: dict[str, list[int]] = {}
    with trio.fail_after(180):
        async with open_local_group(
            "llama", str(model), specs, CONFIG, faults={world - 1: "slow@decode:0.01"}
        ) as group:
            rank0 = group.runners[0]

            async def one(rid: str, prompt: Prompt, params: SamplingParams) -> None:
                tokens, last = await generate(rank0, rid, prompt, params)
                assert isinstance(last, Finished), (rid, last)
                results[rid] = tokens

            async with trio.open_nursery() as nursery:
                for request in REQUESTS:
                    nursery.start_soon(one, *request)
            await trio.sleep(3 * CONFIG.heartbeat_interval)  # the trace rides the heartbeats
            details = [
                e.detail
                for e in rank0.flight_events()
                if e.kind == "collective" and "in flight" in e.detail
            ]
    assert all(r.failure is None for r in group.runners)
    return results, details


@pytest.mark.parametrize(
    ("world", "overlap"),
    [(2, True), (2, False), (3, True)],
    ids=["pipeline-2-overlap", "pipeline-2-turns", "pipeline-3-overlap"],
)
async def test_micro_batches_overlap_and_give_one_process_tokens(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, world: int, overlap: bool
) -> None:
    if not overlap:
        monkeypatch.setenv(OVERLAP_ENV, "off")
    model = models["llama"]
    results, details = await serve_together(model, world)
    for rid, prompt, params in REQUESTS:
        want = reference(model, prompt, params)
        assert len(want) >= 8
        assert results[rid] == want, rid
    # Two passes (or more: one micro-batch per rank) were in flight at once, or never.
    assert any("in flight" in d for d in details) == overlap, details
