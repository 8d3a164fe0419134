"""Log-probabilities of sampled tokens in the runner: single-row, batched and speculative paths.

Values are the log-softmax of the logits handed to the sampler (before temperature, top-p and
top-k): checked against the model run from scratch on the same tokens, for greedy tokens (the
maximum) and sampled ones; a row that asks beside one that does not changes nothing for the
other; speculation (drafts accepted) reports the same entries as plain decoding.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from pathlib import Path

import attrs
import mlx.core as mx
import pytest

from skulk.engine._engine import Engine
from skulk.engine._logprobs import LOGPROB_FLOOR, pending_logprobs
from skulk.engine._sampling import Sampler
from skulk.engine._single import decode_alone
from skulk.engine._speculate import SpeculativeDecoder
from skulk.models import ensure_demo_model
from skulk.models._generated import ModelShape, write_generated_model
from skulk.wire.runner import (
    Load,
    SamplingParams,
    TextPrompt,
    TokenChunk,
    TokenLogprob,
)
from tests.unit.test_engine_batch import Loop, ids

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=5)
SEEDED = SamplingParams(temperature=0.8, top_p=0.9, top_k=40, seed=5, max_tokens=12, logprobs=3)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    root = tmp_path_factory.mktemp("models")
    demo = ensure_demo_model(root / "home")
    path = write_generated_model(root / "gen", ModelShape(), demo, files=1, seed=7)
    return Engine.load(Path(path), lambda n, total: None)


def reference(engine: Engine, tokens: Sequence[int]) -> list[float]:
    """The model's log-softmax after ``tokens``, run from scratch (no KV cache)."""
    logits = engine.model(mx.array(list(tokens))[None])[0, -1, :].astype(mx.float32)
    return list((logits - mx.logsumexp(logits)).tolist())


def entries(loop: Loop, rid: str) -> list[TokenLogprob]:
    out: list[TokenLogprob] = []
    for frame in loop.link.sent:
        if isinstance(frame, TokenChunk) and frame.request_id == rid:
            assert len(frame.logprobs) in (0, len(frame.token_ids))
            out += frame.logprobs
    return out


def check_against_model(
    engine: Engine, prompt: list[int], tokens: list[int], got: list[TokenLogprob], top: int
) -> None:
    assert [e.token_id for e in got] == tokens
    for i, entry in enumerate(got):
        ref = reference(engine, prompt + tokens[:i])
        assert entry.logprob == pytest.approx(ref[entry.token_id], abs=2e-3)
        assert len(entry.top) == top
        values = [t.logprob for t in entry.top]
        assert values == sorted(values, reverse=True)
        best = sorted(range(len(ref)), key=lambda j: -ref[j])[:top]
        assert [ref[t.token_id] for t in entry.top] == pytest.approx(
            [ref[j] for j in best], abs=2e-3
        )


def test_greedy_tokens_get_the_maximum_of_the_log_softmax(engine: Engine) -> None:
    rng = random.Random(1)
    prompt = ids(rng, 20)
    loop = Loop(engine)
    tokens = loop.run([(0, "g", prompt, GREEDY)])["g"]
    got = entries(loop, "g")
    assert tokens and len(got) == len(tokens)
    check_against_model(engine, prompt, tokens, got, 5)
    for entry in got:  # greedy: the sampled token is the most likely one, and in the top list
        assert entry.top[0].token_id == entry.token_id
        assert entry.logprob == pytest.approx(entry.top[0].logprob)


def test_sampled_tokens_report_the_distribution_before_temperature_and_filters(
    engine: Engine,
) -> None:
    rng = random.Random(2)
    prompt = ids(rng, 15)
    loop = Loop(engine)
    tokens = loop.run([(0, "s", prompt, SEEDED)])["s"]
    check_against_model(engine, prompt, tokens, entries(loop, "s"), 3)
    # the same seed without logprobs samples the very same tokens
    plain = Loop(engine).run([(0, "s", prompt, attrs.evolve(SEEDED, logprobs=None))])["s"]
    assert plain == tokens


def test_a_row_without_logprobs_is_unchanged_beside_one_with(engine: Engine) -> None:
    rng = random.Random(3)
    mine, other = ids(rng, 30), ids(rng, 25)
    without = attrs.evolve(SEEDED, logprobs=None, max_tokens=16)
    alone = Loop(engine).run([(0, "plain", other, without)])["plain"]
    loop = Loop(engine)
    together = loop.run([(0, "plain", other, without), (1, "lp", mine, GREEDY)])
    assert together["plain"] == alone
    assert entries(loop, "plain") == []
    check_against_model(engine, mine, together["lp"], entries(loop, "lp"), 5)


@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_speculatively_accepted_tokens_get_the_same_logprobs(
    engine: Engine, params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    phrase = ids(random.Random(21), 12)
    prompt = [*phrase * 6, *phrase[:5]]  # an answer that copies: drafts are accepted
    params = attrs.evolve(params, max_tokens=40)
    plain = Loop(engine, Load("unused", "m", prefix_cache_bytes=0, speculative_tokens=0))
    expected = plain.run([(0, "x", prompt, params)])["x"]
    per_step: list[int] = []  # tokens each speculative step handed out
    real_step = SpeculativeDecoder.step

    def step(decoder: SpeculativeDecoder) -> list[int]:
        out = real_step(decoder)
        per_step.append(len(out))
        return out

    monkeypatch.setattr(SpeculativeDecoder, "step", step)
    spec = Loop(engine, Load("unused", "m", prefix_cache_bytes=0, speculative_tokens=6))
    assert spec.run([(0, "x", prompt, params)])["x"] == expected
    assert per_step and (params.temperature > 0 or max(per_step) > 1)  # greedy: drafts accepted
    want, got = entries(plain, "x"), entries(spec, "x")
    assert [e.token_id for e in got] == [e.token_id for e in want] == expected
    for a, b in zip(got, want, strict=True):
        assert a.logprob == pytest.approx(b.logprob, abs=2e-3)
        assert [t.token_id for t in a.top] == [t.token_id for t in b.top] or all(
            x.logprob == pytest.approx(y.logprob, abs=2e-3)
            for x, y in zip(a.top, b.top, strict=True)
        )


def test_single_row_generation_reports_logprobs(engine: Engine) -> None:
    prompt = engine.tokenize(TextPrompt("hello there"))
    steps = list(decode_alone(engine, prompt, attrs.evolve(GREEDY, logprobs=0)))
    assert steps[-1].finish_reason is not None
    assert sum(len(s.logprobs) for s in steps) > 0
    for step in steps:
        assert len(step.logprobs) == len(step.token_ids)
        for entry in step.logprobs:
            assert entry.top == () and LOGPROB_FLOOR <= entry.logprob <= 0


def test_token_bytes_spell_the_text(engine: Engine) -> None:
    loop = Loop(engine)
    loop.run([(0, "t", ids(random.Random(4), 10), GREEDY)])
    text = "".join(f.text for f in loop.link.sent if isinstance(f, TokenChunk))
    spelled = b"".join(e.token for e in entries(loop, "t")).decode("utf-8", "replace")
    assert spelled.strip() == text.strip()


def test_sampler_records_only_when_asked_and_commit_keeps_the_accepted_rows() -> None:
    logits = mx.array([[0.0, 1.0, 2.0, 3.0], [3.0, 2.0, 1.0, 0.0], [1.0, 1.0, 1.0, 5.0]])
    quiet = Sampler(SamplingParams(temperature=0.0), 4)
    quiet(logits[:1])
    assert quiet.pop_logprobs() is None
    sampler = Sampler(SamplingParams(temperature=0.0, logprobs=2), 4)
    assert sampler.sample_ahead(logits).tolist() == [3, 0, 3]
    assert sampler.pop_logprobs() is None  # nothing kept before commit
    sampler.commit(2)
    first, second = sampler.pop_logprobs(), sampler.pop_logprobs()
    assert first is not None and second is not None and sampler.pop_logprobs() is None
    entry = second.resolve(0, lambda t: bytes([65 + t]))
    lsm = [3.0 - math.log(sum(math.exp(v) for v in (0, 1, 2, 3))) - d for d in range(4)]
    assert entry.logprob == pytest.approx(lsm[0], abs=1e-5)
    assert [t.token_id for t in entry.top] == [0, 1] and entry.token == b"A"


def test_masked_tokens_are_floored_and_top_is_capped_by_the_vocabulary() -> None:
    logits = mx.array([[0.0, -float("inf"), 1.0]])
    entry = pending_logprobs(logits, mx.array([2]), 20).resolve(2, lambda t: b"x")
    assert len(entry.top) == 3
    assert entry.top[-1].token_id == 1 and entry.top[-1].logprob == LOGPROB_FLOOR


def test_out_of_range_logprobs_are_refused(engine: Engine) -> None:
    from skulk.engine._engine import RequestError

    with pytest.raises(RequestError, match="logprobs must be from 0 to 20"):
        engine.check_params(SamplingParams(logprobs=21))
