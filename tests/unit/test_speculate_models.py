"""Speculative decoding is lossless on real models: the demo model and a generated llama give
the same tokens with and without speculation, greedy and seeded."""

from __future__ import annotations

import random
from pathlib import Path
from typing import cast

import mlx.core as mx
import pytest

from skulk.bench._spec import COPY_PROMPT, plain_tokens, prefill, run, speculative_tokens, table
from skulk.engine._engine import Engine
from skulk.engine._speculate import NGramProposer, SpeculativeDecoder, speculative_step
from skulk.models import ensure_demo_model
from skulk.models._generated import ModelShape, write_generated_model
from skulk.wire.runner import SamplingParams, TextPrompt

FREE_PROMPT = "The weather today"
GREEDY = SamplingParams(temperature=0.0, max_tokens=96)
SEEDED = [
    SamplingParams(temperature=1.0, seed=3, max_tokens=96),
    SamplingParams(temperature=0.6, top_p=0.9, top_k=40, seed=8, max_tokens=96),
]


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Engine]:
    demo = Path(ensure_demo_model(tmp_path_factory.mktemp("home")))
    llama = write_generated_model(tmp_path_factory.mktemp("llama"), ModelShape(), demo, seed=5)
    return {
        "demo": Engine.load(demo, lambda done, total: None),
        "llama": Engine.load(llama, lambda done, total: None),
    }


@pytest.mark.parametrize("model", ["demo", "llama"])
@pytest.mark.parametrize("prompt", [COPY_PROMPT, FREE_PROMPT], ids=["copy", "free"])
def test_greedy_output_is_identical(engines: dict[str, Engine], model: str, prompt: str) -> None:
    engine = engines[model]
    tokens = engine.tokenize(TextPrompt(prompt))
    plain = plain_tokens(engine, tokens, GREEDY)
    spec, stats = speculative_tokens(engine, tokens, GREEDY, max_draft=6)
    assert spec == plain
    assert stats.verify_steps > 0  # it did speculate


def test_drafts_are_accepted_where_the_answer_repeats(engines: dict[str, Engine]) -> None:
    engine = engines["demo"]  # greedy, it falls into a loop the proposer drafts
    _, stats = speculative_tokens(engine, engine.tokenize(TextPrompt(COPY_PROMPT)), GREEDY, 6)
    assert stats.acceptance_rate > 0.5
    assert stats.tokens >= 2 * (stats.verify_steps + stats.plain_steps)


@pytest.mark.parametrize("model", ["demo", "llama"])
@pytest.mark.parametrize("params", SEEDED, ids=["temperature", "top_p-top_k"])
def test_a_seeded_request_gives_the_same_tokens(
    engines: dict[str, Engine], model: str, params: SamplingParams
) -> None:
    engine = engines[model]
    tokens = engine.tokenize(TextPrompt(COPY_PROMPT))
    plain = plain_tokens(engine, tokens, params)
    spec, stats = speculative_tokens(engine, tokens, params, max_draft=6)
    assert spec == plain
    assert stats.verify_steps > 0


@pytest.mark.parametrize("model", ["demo", "llama"])
@pytest.mark.parametrize("params", [GREEDY, *SEEDED], ids=["greedy", "temperature", "filtered"])
def test_any_draft_verifies_to_the_plain_tokens(
    engines: dict[str, Engine], model: str, params: SamplingParams
) -> None:
    """A loop of speculative_step with drafts of random lengths that are right, wrong at a
    random position, or the proposer's (else random tokens): accepting some and rejecting at
    every position still gives the plain tokens, as verification never trusts the draft."""
    engine = engines[model]
    tokens = engine.tokenize(TextPrompt(FREE_PROMPT))
    plain = plain_tokens(engine, tokens, params)
    cache, sampler, pending = prefill(engine, tokens, params)
    out = [int(cast(int, pending.item()))]
    proposer = NGramProposer([*tokens, *out])
    rng = random.Random(model + str(params.seed))
    kept = rejected = 0
    while len(out) < len(plain):
        k, kind = rng.randint(1, 6), rng.randrange(3)
        draft = plain[len(out) : len(out) + k]  # the right answer (the oracle)
        if kind == 2 or len(draft) < k:
            draft = proposer.propose(k) or [rng.randrange(engine.vocab_size) for _ in range(k)]
        elif kind == 1:
            draft[rng.randrange(k)] = rng.randrange(engine.vocab_size)
        accepted, nxt = speculative_step(engine.model, cache, sampler, out[-1], draft)
        kept += len(accepted)
        rejected += len(accepted) < len(draft)
        out += [*accepted, nxt]
        proposer.extend([*accepted, nxt])
        assert cache[0].offset == len(tokens) + len(out) - 1  # all but the pending token
    assert len(plain) >= 24  # long enough to mean something
    assert out[: len(plain)] == plain
    assert kept > 0 and rejected > 0


def test_block_logits_equal_one_token_logits(engines: dict[str, Engine]) -> None:
    """What greedy identity rests on: a position's logits are the same to the bit whether it is
    computed alone or inside a verify block (true on the CPU backend)."""
    engine = engines["llama"]
    tokens = engine.tokenize(TextPrompt(FREE_PROMPT))
    block_cache, _, _ = prefill(engine, tokens, GREEDY)
    step_cache, _, _ = prefill(engine, tokens, GREEDY)
    draft = [5, 17, 300, 42, 9, 77, 1000]
    together = engine.model(mx.array(draft)[None], cache=block_cache)[0]
    alone = [engine.model(mx.array([[t]]), cache=step_cache)[0, -1] for t in draft]
    assert mx.array_equal(together, mx.stack(alone)).item()


@pytest.mark.parametrize("params", [GREEDY, SEEDED[0]], ids=["greedy", "seeded"])
@pytest.mark.parametrize("after", [1, 2, 5, 9])
def test_plain_decoding_takes_over_after_detach(
    engines: dict[str, Engine], params: SamplingParams, after: int
) -> None:
    """A second request joins: the decoder hands its state back mid-way (a verify pass may be
    in flight) and plain steps continue to the very tokens plain decoding gives."""
    engine = engines["demo"]
    tokens = engine.tokenize(TextPrompt(COPY_PROMPT))
    plain = plain_tokens(engine, tokens, params)
    cache, sampler, first = prefill(engine, tokens, params)
    decoder = SpeculativeDecoder(engine.model, cache, sampler, first, tokens, len(plain))
    out: list[int] = []
    for _ in range(after):
        out += decoder.step()
    more, pending = decoder.detach()
    out += more
    while pending is not None and len(out) < len(plain):
        out.append(int(cast(int, pending.item())))
        pending = sampler(engine.model(pending[None], cache=cache)[:, -1, :])
    assert decoder.statistics().verify_steps > 0 or after == 1
    assert out[: len(plain)] == plain


def test_the_benchmark_runs_and_reports_each_case(tmp_path: Path) -> None:
    result = run(max_tokens=12, rounds=1, max_draft=4, home=tmp_path)
    cases = result["cases"]
    assert isinstance(cases, dict)
    assert set(cases) == {"copy_greedy", "free_greedy", "free_sampled"}
    assert all(case["identical_tokens"] for case in cases.values())
    assert all(case["ratio"] > 0 and case["cpu_ratio"] > 0 for case in cases.values())
    assert "copy_greedy" in table(result)
