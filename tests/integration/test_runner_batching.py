"""A real runner process serving concurrent requests: the KV budget and the prefix cache."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from skulk.engine._engine import Engine
from skulk.models import ensure_demo_model
from skulk.runner import Runner, RunnerConfig
from skulk.wire.runner import (
    ChatMessage,
    ChatPrompt,
    Finished,
    Prompt,
    RequestFailed,
    SamplingParams,
    TextPrompt,
    TokenChunk,
)

Events = list[TokenChunk | Finished | RequestFailed]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("home"))


async def collect(runner: Runner, rid: str, prompt: Prompt, params: SamplingParams) -> Events:
    async with runner.open_request(rid, prompt, params) as channel:
        return [e async for e in channel]


def tokens(events: Events) -> list[int]:
    return [t for e in events if isinstance(e, TokenChunk) for t in e.token_ids]


async def test_requests_beyond_the_kv_budget_wait_then_overflow_is_refused(
    model_dir: Path,
) -> None:
    engine = Engine.load(model_dir, lambda n, total: None)
    prompt = TextPrompt("once upon a time")
    params = SamplingParams(temperature=0, max_tokens=20)
    need = (len(engine.tokenize(prompt)) + 20) * engine.kv_bytes_per_token
    # Room for two requests, two more may wait; each decode step is slowed so that all six
    # are in the runner long before the first two finish.
    config = RunnerConfig(
        kv_cache_bytes=2 * need + need // 2, kv_waiting=2, faults="slow@decode:0.05"
    )
    runner = Runner("skulk-demo", str(model_dir), config)
    results: dict[str, Events] = {}

    async def one(rid: str) -> None:
        results[rid] = await collect(runner, rid, prompt, params)

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            solo = await collect(runner, "solo", prompt, params)
            async with trio.open_nursery() as requests:
                for i in range(6):
                    requests.start_soon(one, f"r{i}")
            nursery.cancel_scope.cancel()
    ends = [events[-1] for events in results.values()]
    refused = [e for e in ends if isinstance(e, RequestFailed)]
    assert [e.reason for e in refused] == ["kv_cache_full"] * 2
    finished = [rid for rid, events in results.items() if isinstance(events[-1], Finished)]
    assert len(finished) == 4
    assert isinstance(solo[-1], Finished) and tokens(solo)
    for rid in finished:
        assert tokens(results[rid]) == tokens(solo), rid
    assert runner.failure is None


@pytest.mark.parametrize("prefix_bytes", [None, 0])
async def test_a_repeated_chat_prefix_is_reused_and_reported(
    model_dir: Path, prefix_bytes: int | None
) -> None:
    runner = Runner("skulk-demo", str(model_dir), RunnerConfig(prefix_cache_bytes=prefix_bytes))
    system = ChatMessage("system", "You are a terse assistant who answers in one line. " * 8)
    params = SamplingParams(temperature=0.5, seed=2, max_tokens=12)
    first_turn = ChatPrompt((system, ChatMessage("user", "hello")))
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            first = await collect(runner, "a", first_turn, params)
            again = await collect(runner, "b", first_turn, params)
            other = ChatPrompt((system, ChatMessage("user", "what is a fox?")))
            third = await collect(runner, "c", other, params)
            nursery.cancel_scope.cancel()
    ends = [first[-1], again[-1], third[-1]]
    assert all(isinstance(e, Finished) for e in ends), ends
    a, b, c = (e.end.usage for e in ends if isinstance(e, Finished))
    assert tokens(first) == tokens(again)
    assert a.cached_tokens == 0
    if prefix_bytes == 0:
        assert b.cached_tokens == c.cached_tokens == 0
    else:
        assert b.cached_tokens == b.prompt_tokens - 1  # all but the token that gives logits
        assert 0 < c.cached_tokens < c.prompt_tokens
