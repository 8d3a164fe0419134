"""A pipeline rank waiting for the other rank sleeps (the doorbell, skulk.engine._doorbell)
instead of spinning in mlx's receive.

The other rank is made slow at every decode step (the ``slow@decode`` fault hook, on that
rank's runner only), so for most of a request the rank under test waits: rank 0 for rank 1's
half of the pass, or rank 1 for rank 0's next message. While it waits its threads are sampled
from ``/proc``: with the doorbell, the samples find no thread of the waiting rank running or
runnable (state ``R``) — every one is blocked in the kernel; without it (``SKULK_RING_DOORBELL
=off``, the baseline), mlx's socket thread polls and the samples find it running. The tokens
are those one process generates (greedy), with the doorbell and without.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio

from skulk.engine import DOORBELL_ENV
from skulk.models import ensure_demo_model
from skulk.models._generated import write_generated_model
from skulk.runner import Runner, loopback_hosts, open_local_group, shard_specs
from skulk.wire.runner import Finished, SamplingParams, TextPrompt, TokenChunk
from tests.integration.test_runner_distributed import CONFIG, LAYERS, LLAMA, reference

SLOW = 0.25  # seconds the other rank sleeps at every decode step
PROMPT = TextPrompt("The quick brown fox")
PARAMS = SamplingParams(temperature=0.0, max_tokens=8)
SAMPLES = 40


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("models")
    return write_generated_model(root / "llama", LLAMA, ensure_demo_model(root / "home"), seed=7)


def thread_states(pid: int) -> list[str]:
    """The scheduler state (``R``, ``S``, ``D``, …) of every thread of process ``pid``."""
    states = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
    return states


@contextmanager
def doorbell(on: bool) -> Iterator[None]:
    """The runners started inside inherit ``SKULK_RING_DOORBELL`` (off: the baseline)."""
    old = os.environ.pop(DOORBELL_ENV, None)
    if not on:
        os.environ[DOORBELL_ENV] = "off"
    try:
        yield
    finally:
        os.environ.pop(DOORBELL_ENV, None)
        if old is not None:
            os.environ[DOORBELL_ENV] = old


async def sample_while_generating(
    runner: Runner, pid: int, started: trio.Event
) -> tuple[list[int], list[list[str]]]:
    """Run the request on ``runner``; once its first token is out, sample ``pid``'s threads."""
    tokens: list[int] = []
    samples: list[list[str]] = []

    async def sample() -> None:
        await started.wait()
        for _ in range(SAMPLES):
            samples.append(thread_states(pid))
            await trio.sleep(SLOW / 10)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        async with runner.open_request("r", PROMPT, PARAMS) as events:
            async for event in events:
                if isinstance(event, TokenChunk):
                    tokens += event.token_ids
                    started.set()
                elif isinstance(event, Finished):
                    assert event.end.finish_reason == "length"
        started.set()
    return tokens, samples


async def run(model: Path, waiting: int, on: bool) -> tuple[list[int], list[list[str]]]:
    """The request's tokens and the waiting rank's thread samples (the other rank slow)."""
    other = 1 - waiting
    specs = shard_specs("pipeline", loopback_hosts(2), LAYERS)
    with doorbell(on), trio.fail_after(120):
        async with open_local_group(
            "llama", str(model), specs, CONFIG, faults={other: f"slow@decode:{SLOW}"}
        ) as group:
            pid = group.runners[waiting].statistics().pid
            assert pid is not None
            return await sample_while_generating(group.runners[0], pid, trio.Event())


@pytest.mark.parametrize("waiting", [0, 1], ids=["rank0-waits", "rank1-waits"])
async def test_a_waiting_rank_sleeps_with_the_doorbell_and_spins_without(
    model: Path, waiting: int
) -> None:
    want = reference(model, PROMPT, PARAMS)  # what one process generates
    tokens, samples = await run(model, waiting, on=True)
    assert tokens == want
    asleep = sum("R" not in s for s in samples)
    # Most of the time the rank waits, asleep (a sample may catch it at work between waits).
    assert asleep > len(samples) // 2, samples

    tokens, samples = await run(model, waiting, on=False)
    assert tokens == want
    spinning = sum("R" in s for s in samples)
    assert spinning > len(samples) // 2, samples  # the baseline: a thread polls throughout
