"""Every feature of the one scheduler on sharded instances of real runner processes, against one
runner process holding the whole model (issue 20: one engine for every instance).

A sharded instance runs the single-process scheduler on its rank 0; only its forward pass is
distributed (:mod:`skulk.engine._sharded_forward`). So the same requests sent to a pipeline or
tensor group and to one runner must give the same tokens with logprobs (seeded sampling), JSON-
schema output, a forced tool call read by the model's own tool parser, n-gram speculation (on by
default: a lone request speculates), a prefix-cache hit (its tokens those of the cold run) and
embeddings, and ``Tokenize`` is answered.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import pytest
import trio

from skulk.grammar import schema_text, tool_call_schema
from skulk.models import ensure_demo_model
from skulk.models._generated import write_generated_model
from skulk.runner import Runner, loopback_hosts, open_local_group, shard_specs
from skulk.wire.runner import (
    ChatMessage,
    ChatPrompt,
    Embed,
    Embedded,
    Finished,
    GenerationEnd,
    Prompt,
    SamplingParams,
    TextPrompt,
    TokenChunk,
    Tokenize,
    Tokenized,
    TokenLogprob,
)
from tests.integration.test_runner_distributed import CONFIG, LAYERS, LLAMA
from tests.integration.test_runner_distributed import QWEN2 as QWEN2_TIED
from tests.unit.test_runner_tool_parse import with_parser

QWEN2 = attrs.evolve(QWEN2_TIED, tie_word_embeddings=False)

CHAT = ChatPrompt((ChatMessage("user", "hello there, how are you?"),))
AGAIN = ChatPrompt((ChatMessage("user", "tell me about the weather today, please"),))
COPY = TextPrompt("one two three four five six " * 6)
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
    "required": ["name", "age"],
}
CITY = {
    "type": "object",
    "properties": {"city": {"enum": ["Oslo", "Bergen"]}},
    "required": ["city"],
}
TOOLS = [{"type": "function", "function": {"name": "weather", "parameters": CITY}}]
TOOL_SCHEMA = tool_call_schema({"weather": CITY})
REQUESTS: tuple[tuple[str, Prompt, SamplingParams], ...] = (
    (
        "logprobs",
        TextPrompt("The quick brown fox"),
        SamplingParams(temperature=1.0, top_p=0.95, seed=7, max_tokens=12, logprobs=3),
    ),
    (
        "schema",
        CHAT,
        SamplingParams(temperature=0.0, max_tokens=80, json_schema=schema_text(SCHEMA)),
    ),
    (
        "tool",
        ChatPrompt((ChatMessage("user", "weather in Oslo?"),), tools=json.dumps(TOOLS)),
        SamplingParams(
            temperature=0.0,
            max_tokens=120,
            json_schema=schema_text(TOOL_SCHEMA, "tools"),
            tool_call=True,
        ),
    ),
    ("copy", COPY, SamplingParams(temperature=0.0, max_tokens=40)),
    ("cold", AGAIN, SamplingParams(temperature=0.0, max_tokens=16)),
    ("hit", AGAIN, SamplingParams(temperature=0.0, max_tokens=16)),  # the same prompt again
)


@attrs.frozen
class Answer:
    tokens: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...]
    end: GenerationEnd


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sharded-features")
    demo = ensure_demo_model(root / "home")
    llama = write_generated_model(root / "llama", LLAMA, demo, files=2, seed=7)
    qwen2 = write_generated_model(root / "qwen2", QWEN2, demo, files=1, seed=8)
    return {
        "llama": with_parser(llama, root / "llama-tools", "json_tools"),
        "qwen2": with_parser(qwen2, root / "qwen2-tools", "json_tools"),
    }


async def answer(runner: Runner, rid: str, prompt: Prompt, params: SamplingParams) -> Answer:
    tokens: list[int] = []
    logprobs: list[TokenLogprob] = []
    last: object = None
    async with runner.open_request(rid, prompt, params) as events:
        async for event in events:
            if isinstance(event, TokenChunk):
                tokens += event.token_ids
                logprobs += event.logprobs
            last = event
    assert isinstance(last, Finished), (rid, last)
    return Answer(tuple(tokens), tuple(logprobs), last.end)


async def serve_all(runner: Runner) -> dict[str, Answer | Embedded | Tokenized]:
    """Every request, one after the other (a lone request speculates), then an embedding and a
    count."""
    out: dict[str, Answer | Embedded | Tokenized] = {}
    for rid, prompt, params in REQUESTS:
        out[rid] = await answer(runner, rid, prompt, params)
    embed = Embed("embed", (TextPrompt("hello world"), TextPrompt("a longer text to embed here")))
    embedded = await runner.ask(embed)
    assert isinstance(embedded, Embedded), embedded
    out["embed"] = embedded
    counted = await runner.ask(Tokenize("count", CHAT))
    assert isinstance(counted, Tokenized), counted
    out["count"] = counted
    return out


async def single(model: Path) -> dict[str, Answer | Embedded | Tokenized]:
    runner = Runner("m", str(model), CONFIG)
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        try:
            return await serve_all(runner)
        finally:
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("family", "sharding", "world"),
    [
        ("llama", "pipeline", 2),
        ("llama", "tensor", 2),
        ("llama", "pipeline", 3),
        ("qwen2", "tensor", 3),
    ],
)
async def test_every_feature_on_a_sharded_instance_matches_one_process(
    models: dict[str, Path], family: str, sharding: str, world: int
) -> None:
    model = models[family]
    # Float sums in another order on a tensor group (each rank's slice, then all_sum): logits
    # differ in their last bits, so log-probabilities are compared to 1e-3; tokens exactly.
    tolerance = 0.0 if sharding == "pipeline" else 1e-3
    with trio.fail_after(240):
        want = await single(model)
        specs = shard_specs(sharding, loopback_hosts(world), LAYERS)  # type: ignore[arg-type]
        async with open_local_group("m", str(model), specs, CONFIG) as group:
            rank0 = group.runners[0]
            got = await serve_all(rank0)
            while (stats := rank0.engine_statistics()) is None or stats.prefix_hits < 1:  # noqa: ASYNC110 - stats come with heartbeats
                await trio.sleep(0.05)
    for rid, _, _ in REQUESTS:
        mine, theirs = got[rid], want[rid]
        assert isinstance(mine, Answer) and isinstance(theirs, Answer)
        assert mine.tokens == theirs.tokens, rid
        assert mine.end.finish_reason == theirs.end.finish_reason, rid
        assert mine.end.tool_calls == theirs.end.tool_calls, rid
        assert len(mine.logprobs) == len(theirs.logprobs), rid
        for a, b in zip(mine.logprobs, theirs.logprobs, strict=True):
            assert a.token_id == b.token_id
            assert abs(a.logprob - b.logprob) <= tolerance
            assert [t.token_id for t in a.top] == [t.token_id for t in b.top]
    logprobs, schema, tool, hit, cold = (
        got["logprobs"], got["schema"], got["tool"], got["hit"], got["cold"],
    )  # fmt: skip
    assert isinstance(logprobs, Answer) and len(logprobs.logprobs) == len(logprobs.tokens) > 0
    assert all(len(entry.top) == 3 for entry in logprobs.logprobs)
    assert isinstance(schema, Answer) and schema.end.finish_reason == "stop"
    assert isinstance(tool, Answer) and [c.name for c in tool.end.tool_calls] == ["weather"]
    # The same prompt again reuses all of it but its last token (a chat template's opening
    # may already have been kept by the earlier requests), and gives the cold run's tokens.
    assert isinstance(cold, Answer) and isinstance(hit, Answer)
    reused = hit.end.usage.cached_tokens
    assert reused == hit.end.usage.prompt_tokens - 1 > cold.end.usage.cached_tokens
    assert hit.tokens == cold.tokens
    # The copy prompt drafted: speculation's verify passes went through the ranks.
    assert stats.speculation_drafted > 0 and stats.speculation_verify_steps > 0
    mine_vectors, their_vectors = got["embed"], want["embed"]
    assert isinstance(mine_vectors, Embedded) and isinstance(their_vectors, Embedded)
    for u, v in zip(mine_vectors.vectors, their_vectors.vectors, strict=True):
        assert max(abs(a - b) for a, b in zip(u, v, strict=True)) <= max(tolerance, 1e-5)
    count = got["count"]
    assert isinstance(count, Tokenized) and count == want["count"]
