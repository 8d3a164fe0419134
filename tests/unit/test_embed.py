"""Embeddings and token counting on the runner (:mod:`skulk.engine._embed`, the ``Embed`` and
``Tokenize`` requests of the serving loop) and the frames that carry them."""

from __future__ import annotations

import math
import queue
import time

import pytest

from skulk.engine._embed import (
    MAX_EMBED_FLOATS,
    EmbedJob,
    check_inputs,
    embed_group,
    groups,
    hidden_size,
    input_tokens,
)
from skulk.engine._engine import Engine, RequestError
from skulk.engine._prepare import Prepared, PromptPreparer
from skulk.engine._scheduler import Scheduler
from skulk.engine._stops import StopMatcher
from skulk.engine.faults import Faults
from skulk.engine.protocol import FROM_RUNNER, TO_RUNNER
from skulk.wire import Codec
from skulk.wire.routing import RouteAnswer, RouteAsk, RouteEmbed, RouteEmbedded, RouteEnd
from skulk.wire.runner import (
    ChatMessage,
    ChatPrompt,
    Embed,
    Embedded,
    Finished,
    FromRunner,
    GenerationEnd,
    Load,
    RequestFailed,
    TextPrompt,
    TokenIds,
    Tokenize,
    Tokenized,
    ToRunner,
    Usage,
)
from tests.unit import test_engine_batch
from tests.unit.test_engine_batch import FakeLink

#: The demo model and a generated llama (random weights), loaded once for the module.
models = test_engine_batch.models

INPUTS = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [40, 41, 42, 43], [7]]


@pytest.mark.parametrize("model", ["demo", "generated"])
def test_pooling_is_deterministic_normalised_and_batch_equals_one_by_one(
    models: dict[str, Engine], model: str
) -> None:
    engine = models[model]
    size = hidden_size(engine)
    assert size is not None and size > 0
    batch = embed_group(engine, INPUTS)
    again = embed_group(engine, INPUTS)
    assert batch == again  # same input, same vector
    for ids, vector in zip(INPUTS, batch, strict=True):
        assert len(vector) == size
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-4)
        (alone,) = embed_group(engine, [ids])
        # right padding after an input cannot change it (causal attention): equal up to rounding
        assert max(abs(a - b) for a, b in zip(alone, vector, strict=True)) < 1e-4
    # different inputs, different vectors
    assert max(abs(a - b) for a, b in zip(batch[0], batch[1], strict=True)) > 1e-3


def test_groups_bound_the_padded_tokens_of_one_forward() -> None:
    inputs = [[1] * 3, [1] * 5, [1] * 2, [1] * 9, [1] * 1]
    got = groups(inputs, budget=10)
    assert [list(r) for r in got] == [[0, 1], [2], [3], [4]]
    for r in got:
        assert len(r) == 1 or len(r) * max(len(inputs[i]) for i in r) <= 10
    assert groups([]) == []


def test_embed_job_runs_a_group_per_turn(models: dict[str, Engine]) -> None:
    engine = models["demo"]
    job = EmbedJob(engine, "e", [[1, 2, 3]] * 3)
    assert job.prompt_tokens == 9
    assert job.advance() == 9 and job.done
    assert len(job.vectors) == 3


def test_inputs_are_checked_and_truncated(models: dict[str, Engine]) -> None:
    engine = models["demo"]
    with pytest.raises(RequestError) as bad:
        input_tokens(engine, TokenIds((1, engine.vocab_size)), truncate=False)
    assert bad.value.reason == "invalid_request"
    too_long = TokenIds(tuple([3] * (engine.context_length + 5)))
    with pytest.raises(RequestError) as long:
        input_tokens(engine, too_long, truncate=False)
    assert long.value.reason == "prompt_too_long"
    assert len(input_tokens(engine, too_long, truncate=True)) == engine.context_length
    assert input_tokens(engine, TextPrompt("hello"), truncate=False)
    with pytest.raises(RequestError) as empty:
        input_tokens(engine, TokenIds(()), truncate=False)
    assert empty.value.reason == "empty_prompt"


def test_an_answer_too_large_for_one_frame_is_refused(models: dict[str, Engine]) -> None:
    engine = models["demo"]
    size = hidden_size(engine)
    assert size is not None
    check_inputs(engine, MAX_EMBED_FLOATS // size)
    with pytest.raises(RequestError) as err:
        check_inputs(engine, MAX_EMBED_FLOATS // size + 1)
    assert err.value.reason == "invalid_request"


def _serve_until(requests: Scheduler, link: FakeLink, n: int) -> None:
    """Feed prepared jobs back and advance until ``n`` frames were sent."""
    deadline = time.monotonic() + 60
    while len(link.sent) < n:
        assert time.monotonic() < deadline, link.sent
        try:
            item = link.inbox.get(timeout=0.05)
        except queue.Empty:
            requests.advance()
            continue
        assert isinstance(item, Prepared)
        requests.start(item)


def test_the_serving_loop_answers_embed_and_tokenize(models: dict[str, Engine]) -> None:
    engine = models["demo"]
    link = FakeLink()
    load = Load("unused", "m", prefix_cache_bytes=0, speculative_tokens=0)
    requests = Scheduler(link, engine, Faults(), load)  # type: ignore[arg-type]
    chat = ChatPrompt((ChatMessage("user", "hello there"),))
    requests.accept(Tokenize("t", chat))
    requests.accept(Embed("e", (TextPrompt("hello"), TokenIds((5, 6, 7)))))
    requests.accept(Embed("bad", (TokenIds((engine.vocab_size + 1,)),)))
    _serve_until(requests, link, 3)
    by_id = {f.request_id: f for f in link.sent}  # type: ignore[union-attr]
    counted = by_id["t"]
    assert isinstance(counted, Tokenized)
    assert counted.prompt_tokens == len(engine.tokenize(chat))
    embedded = by_id["e"]
    assert isinstance(embedded, Embedded)
    assert len(embedded.vectors) == 2
    assert embedded.prompt_tokens == len(engine.tokenize(TextPrompt("hello"))) + 3
    assert embedded.vectors[1] == tuple(embed_group(engine, [[5, 6, 7]])[0])
    failed = by_id["bad"]
    assert isinstance(failed, RequestFailed) and failed.reason == "invalid_request"
    assert not requests.busy  # nothing left running, no KV memory taken
    assert requests.budget.used == 0


def test_an_embed_is_cancelled_like_any_request(models: dict[str, Engine]) -> None:
    engine = models["demo"]
    link = FakeLink()
    load = Load("unused", "m", prefix_cache_bytes=0, speculative_tokens=0)
    requests = Scheduler(link, engine, Faults(), load)  # type: ignore[arg-type]
    requests.embeds.append(EmbedJob(engine, "e", [[1, 2]]))
    requests.cancel("e")
    assert link.sent == [Finished("e", GenerationEnd("cancelled", Usage(2, 0)))]
    assert not requests.busy


def test_the_preparer_refuses_embed_without_an_embedder() -> None:
    inbox: queue.Queue[object] = queue.Queue()
    preparer = PromptPreparer(lambda prompt: [1], inbox)
    preparer.submit(Embed("e", (TextPrompt("x"),)))
    result = inbox.get(timeout=10)
    assert isinstance(result, Prepared)
    assert result.failure is not None and result.failure[0] == "unsupported"


def test_frames_round_trip() -> None:
    to: Codec[ToRunner] = TO_RUNNER
    frm: Codec[FromRunner] = FROM_RUNNER
    for frame in (
        Embed("a", (TextPrompt("hi"), TokenIds((1, 2, 3))), truncate=True),
        Tokenize("b", ChatPrompt((ChatMessage("user", "x"),))),
    ):
        assert to.decode(to.encode(frame)) == frame
    for answer in (
        Embedded("a", ((0.5, -0.25), (1.0, 0.0)), 5),
        Tokenized("b", 7),
        Finished("c", GenerationEnd("stop", Usage(1, 2), stop_sequence="##")),
    ):
        assert frm.decode(frm.encode(answer)) == answer
    ask: Codec[RouteAsk] = Codec(RouteAsk)
    routed = RouteEmbed("r", "i", (TokenIds((4,)),), False)
    assert ask.decode(ask.encode(routed)) == routed
    answers: Codec[RouteAnswer] = Codec(RouteAnswer)
    assert answers.decode(answers.encode(RouteEmbedded(((1.0,),), 1))) == RouteEmbedded(
        ((1.0,),), 1
    )
    item: Codec[RouteEnd] = Codec(RouteEnd)
    end = RouteEnd(GenerationEnd("stop", Usage(1, 1), "END"))
    assert item.decode(item.encode(end)) == end


def test_the_stop_matcher_names_the_stop_that_cut() -> None:
    matcher = StopMatcher(("c", "DcD", "zz"))
    assert matcher.feed("DD") == ("D", False)
    assert matcher.feed("cD") == ("D", True)  # "DD" in all: "c" completes first
    assert matcher.matched == "c"
    other = StopMatcher(("END",))
    assert other.feed("abc") == ("abc", False) and other.matched is None
    assert other.feed("xEN") == ("x", False)
    assert other.feed("D!") == ("", True)
    assert other.matched == "END"


def test_a_turn_computes_at_most_its_budget_and_a_long_input_goes_in_chunks(
    models: dict[str, Engine],
) -> None:
    engine = models["demo"]
    long = list(range(3, 43))  # 40 tokens
    short = [[5, 6, 7], [8, 9]]
    job = EmbedJob(engine, "e", [short[0], long, short[1]])
    computed = []
    while not job.done:
        computed.append(job.advance(16))
    # the first short input alone (the long one does not fit beside it), the long one in
    # chunks of 16, 16 and 8 through a cache, then the last
    assert computed == [3, 16, 16, 8, 2]
    assert job.advance(16) == 0
    whole = embed_group(engine, [long])[0]
    assert max(abs(a - b) for a, b in zip(job.vectors[1], whole, strict=True)) < 1e-4
    assert job.vectors[0] == embed_group(engine, [short[0]])[0]
    assert math.isclose(math.sqrt(sum(x * x for x in job.vectors[1])), 1.0, rel_tol=1e-4)
