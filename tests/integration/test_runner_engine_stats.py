"""A real runner process reports its engine counters to the node: speculation drafts and
acceptance on a copy prompt, prefix-cache hits on a repeated chat (``EngineStats``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from skulk.bench._spec import COPY_PROMPT
from skulk.models import ensure_demo_model
from skulk.runner import Runner, RunnerConfig
from skulk.wire.runner import (
    ChatMessage,
    ChatPrompt,
    EngineStats,
    Finished,
    Prompt,
    SamplingParams,
    TextPrompt,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("home"))


async def finish(runner: Runner, rid: str, prompt: Prompt, params: SamplingParams) -> Finished:
    async with runner.open_request(rid, prompt, params) as channel:
        events = [e async for e in channel]
    assert isinstance(events[-1], Finished), events[-1]
    return events[-1]


async def settled(runner: Runner, done: Callable[[EngineStats], bool]) -> EngineStats:
    """The node's view once it shows no request running and ``done`` holds. The runner sends
    its counters with a heartbeat when they changed, so this waits; a runner that never
    reports them fails the test at its deadline."""
    while True:
        stats = runner.engine_statistics()
        if stats is not None and stats.running == 0 and done(stats):
            return stats
        await trio.sleep(0.05)


async def test_speculation_and_prefix_hits_reach_the_node(model_dir: Path) -> None:
    runner = Runner("skulk-demo", str(model_dir), RunnerConfig(heartbeat_interval=0.1))
    greedy = SamplingParams(temperature=0.0, max_tokens=96)
    system = ChatMessage("system", "You are a terse assistant who answers in one line. " * 8)
    chat = ChatPrompt((system, ChatMessage("user", "hello")))
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            # Greedy, the demo model falls into a loop the n-gram proposer drafts.
            await finish(runner, "copy", TextPrompt(COPY_PROMPT), greedy)
            copied = await settled(runner, lambda s: s.speculation_drafted > 0)
            ends = [
                await finish(runner, rid, chat, SamplingParams(temperature=0, max_tokens=8))
                for rid in ("a", "b")
            ]
            hits = copied.prefix_hits + sum(1 for e in ends if e.end.usage.cached_tokens > 0)
            stats = await settled(runner, lambda s: s.prefix_hits == hits)
            nursery.cancel_scope.cancel()
    # A frame sent once the copy request left: its whole speculation is in the totals.
    assert 0 < copied.speculation_accepted <= copied.speculation_drafted
    assert copied.speculation_verify_steps > 0
    assert copied.acceptance_rate is not None and copied.acceptance_rate > 0
    # The repeated chat reused its first turn's KV state, and the node sees it.
    assert ends[1].end.usage.cached_tokens == ends[1].end.usage.prompt_tokens - 1
    assert hits > copied.prefix_hits
    reused = sum(e.end.usage.cached_tokens for e in ends)
    assert stats.prefix_reused_tokens - copied.prefix_reused_tokens == reused
    assert stats.prefix_entries >= 1 and stats.prefix_bytes > 0
    assert stats.kv_capacity_bytes > 0 and stats.kv_reserved_bytes == 0 and stats.queued == 0
    # Counters only grow: the copy request's speculation stays in the totals.
    assert stats.speculation_drafted >= copied.speculation_drafted
