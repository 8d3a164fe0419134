"""One request decoded alone (:mod:`skulk.engine._single`): the warm-up and the in-process
references of tests and benchmarks run the serving loop's own single-row path — a one-row
:class:`Batch`, with speculation when asked — and give exactly the serving loop's tokens."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

import skulk.engine._speculate as speculate
from skulk.engine._batch import Batch, Row
from skulk.engine._engine import Engine, Step
from skulk.engine._single import WARM_UP, decode_alone, warm_up
from skulk.wire.runner import SamplingParams, TextPrompt
from tests.unit.test_engine_batch import GREEDY, SEEDED, alone, ids, models

__all__ = ["models"]  # the module-scoped fixture, shared


def text(steps: Sequence[Step]) -> str:
    return "".join(s.text for s in steps)


@pytest.mark.parametrize("speculative", [0, 6], ids=["plain", "speculative"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_request_alone_gives_the_serving_loops_tokens(
    models: dict[str, Engine], params: SamplingParams, speculative: int
) -> None:
    engine = models["generated"]
    tokens = ids(random.Random(6), 30)
    steps = list(decode_alone(engine, tokens, params, speculative_tokens=speculative))
    assert [t for s in steps for t in s.token_ids] == alone(engine, tokens, params)
    # the generated model never samples its end token here: max_tokens ends it, on the last
    assert params.max_tokens is not None and len(steps) == params.max_tokens
    assert [s.finish_reason for s in steps] == [None] * (len(steps) - 1) + ["length"]


@pytest.mark.parametrize("speculative", [0, 6], ids=["plain", "speculative"])
def test_a_request_alone_ends_at_max_tokens_or_at_a_stop_string(
    models: dict[str, Engine], speculative: int
) -> None:
    engine = models["demo"]
    prompt = engine.tokenize(TextPrompt("once upon a time"))
    params = SamplingParams(temperature=0.0, max_tokens=30)
    full = list(decode_alone(engine, prompt, params, speculative_tokens=speculative))
    assert len(full) == 30 and full[-1].finish_reason == "length"
    whole = text(full)
    stop = whole.split()[5]  # a word from the middle of the answer
    assert 0 < whole.index(stop)
    cut = list(
        decode_alone(
            engine,
            prompt,
            SamplingParams(temperature=0.0, max_tokens=30, stop=(stop,)),
            speculative_tokens=speculative,
        )
    )
    assert cut[-1].finish_reason == "stop" and len(cut) < 30
    assert text(cut) == whole[: whole.index(stop)]  # the stop string itself is not emitted
    short = list(decode_alone(engine, prompt, SamplingParams(temperature=0.0, max_tokens=3)))
    assert [s.token_ids for s in short] == [s.token_ids for s in full[:3]]
    assert short[-1].finish_reason == "length"


def test_the_warm_up_decodes_greedy_and_sampled_requests_through_the_batch(
    models: dict[str, Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = models["demo"]
    added: list[Row] = []
    handed_out: list[Step] = []
    real_add, real_step = Batch.add, Batch.step

    def add(batch: Batch, row: Row, cache: list[Any], first: Any) -> None:
        added.append(row)
        real_add(batch, row, cache, first)

    def step(batch: Batch) -> list[tuple[Row, Step]]:
        out = real_step(batch)
        handed_out.extend(s for _, s in out)
        return out

    monkeypatch.setattr(Batch, "add", add)
    monkeypatch.setattr(Batch, "step", step)
    warm_up(engine)
    greedy, filtered, unfiltered = WARM_UP
    assert greedy.temperature == 0.0
    assert filtered.temperature > 0 and 0 < filtered.top_p < 1 and filtered.top_k > 0
    assert unfiltered.temperature > 0 and not 0 < unfiltered.top_p < 1 and unfiltered.top_k == 0
    assert [row.sampler.greedy for row in added] == [True, False, False]
    # every warm-up request ran to its end through Batch.step
    assert all(row.finish_reason is not None for row in added)
    assert sum(s.finish_reason is not None for s in handed_out) == len(WARM_UP)


@pytest.mark.parametrize("speculative", [0, 6])
def test_the_warm_up_runs_a_verify_pass_when_speculation_is_on(
    models: dict[str, Engine], monkeypatch: pytest.MonkeyPatch, speculative: int
) -> None:
    engine = models["demo"]
    drafts: list[int] = []
    real = speculate.start_verification

    def counting(
        model: Any, cache: Any, sampler: Any, pending: Any, draft: Sequence[int], trim: Any
    ) -> speculate.Verification:
        drafts.append(len(draft))
        return real(model, cache, sampler, pending, draft, trim)

    monkeypatch.setattr(speculate, "start_verification", counting)
    warm_up(engine, speculative_tokens=speculative)
    if speculative:
        assert drafts and all(n >= 1 for n in drafts)
    else:
        assert drafts == []
