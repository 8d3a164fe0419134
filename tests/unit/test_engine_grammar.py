"""Structured output in the runner's serving loop: a constrained request decoded alone, and in a
batch beside unconstrained ones, gives a JSON document valid for its schema, ends with "stop",
and leaves the other rows' tokens exactly as they are without it."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence

import jsonschema
import pytest

from skulk.engine._engine import Engine, RequestError
from skulk.engine._grammar import request_constraint
from skulk.engine._prepare import Prepared
from skulk.engine._single import decode_alone
from skulk.grammar import schema_text, tool_call_schema
from skulk.wire.runner import Finished, Generate, Load, SamplingParams, TextPrompt
from tests.unit.test_engine_batch import Loop, ids, models

__all__ = ["models"]  # the module-scoped fixture, shared

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3},
    },
    "required": ["name", "age", "tags"],
    "additionalProperties": False,
}


class GrammarLoop(Loop):
    """:class:`Loop` whose requests get their constraint as the prompt preparer builds it."""

    def __init__(self, engine: Engine, load: Load | None = None) -> None:
        super().__init__(engine, load)
        self._engine = engine

    def submit(self, rid: str, tokens: Sequence[int], params: SamplingParams) -> None:
        self._job += 1
        self.requests.waiting[rid] = self._job
        request = Generate(rid, TextPrompt("unused"), params)
        constraint = request_constraint(self._engine.tokenizer, params)
        self.requests.start(Prepared(self._job, request, tuple(tokens), constraint=constraint))

    def text(self, rid: str) -> str:
        detok = self._engine.tokenizer
        return str(detok.decode(self.tokens().get(rid, [])))


def constrained(schema: object, **kw: object) -> SamplingParams:
    return SamplingParams(json_schema=schema_text(schema), max_tokens=200, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("model", ["demo", "generated"])
@pytest.mark.parametrize("seed", [None, 5])
def test_a_constrained_row_beside_unconstrained_ones_gives_valid_json(
    models: dict[str, Engine], model: str, seed: int | None
) -> None:
    engine = models[model]
    rng = random.Random(4)
    temperature = 0.0 if seed is None else 1.0
    mine = constrained(PERSON, temperature=temperature, seed=seed)
    others = [
        (0, "greedy", ids(rng, 30), SamplingParams(temperature=0.0, max_tokens=20)),
        (2, "seeded", ids(rng, 12), SamplingParams(temperature=0.8, seed=3, max_tokens=20)),
    ]
    prompt = ids(rng, 20)
    alone = GrammarLoop(engine)
    alone.run([(0, "json", prompt, mine)])
    loop = GrammarLoop(engine, Load("unused", "m", prefix_cache_bytes=0, speculative_tokens=4))
    together = loop.run([(1, "json", prompt, mine), *others])
    for _, rid, tokens, params in others:  # the constraint changes no other row's tokens
        assert together[rid] == Loop(engine).run([(0, rid, tokens, params)])[rid], rid
    ends = loop.ends()
    assert isinstance(ends["json"], Finished) and ends["json"].end.finish_reason == "stop"
    jsonschema.validate(json.loads(loop.text("json")), PERSON)
    if seed is not None:  # a seeded constrained request is reproducible in a batch too
        assert together["json"] == alone.tokens()["json"]


def test_a_forced_tool_call_gives_arguments_valid_for_the_tool(models: dict[str, Engine]) -> None:
    engine = models["demo"]
    tools = {
        "get_weather": {
            "type": "object",
            "properties": {"city": {"enum": ["Oslo", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        }
    }
    schema = tool_call_schema(tools)
    params = SamplingParams(json_schema=schema_text(schema), tool_call=True, max_tokens=100)
    loop = GrammarLoop(engine)
    loop.run([(0, "call", ids(random.Random(1), 10), params)])
    call = json.loads(loop.text("call"))
    assert call["name"] == "get_weather"
    jsonschema.validate(call["arguments"], tools["get_weather"])


def test_a_schema_the_grammar_refuses_fails_the_request_naming_the_keyword(
    models: dict[str, Engine],
) -> None:
    params = SamplingParams(json_schema='{"type":"string","not":{"const":"a"}}')
    with pytest.raises(RequestError) as caught:
        request_constraint(models["demo"].tokenizer, params)
    assert caught.value.reason == "invalid_request"
    assert '"not"' in caught.value.message


def test_the_preparer_turns_a_refused_schema_into_a_request_failure(
    models: dict[str, Engine],
) -> None:
    loop = Loop(models["demo"])  # the serving loop, with its real prompt preparer
    bad = SamplingParams(json_schema='{"type":"object","propertyNames":{"maxLength":2}}')
    loop.requests.accept(Generate("bad", TextPrompt("hello"), bad))
    prepared = loop.link.inbox.get(timeout=30)
    assert isinstance(prepared, Prepared) and prepared.failure is not None
    reason, message = prepared.failure
    assert reason == "invalid_request" and "propertyNames" in message


def test_a_request_decoded_alone_outside_the_loop_refuses_structured_output(
    models: dict[str, Engine],
) -> None:
    """Only the serving loop's preparer builds a row's constraint: the warm-up/test path
    (:func:`decode_alone`) must not silently ignore one; it refuses at once."""
    engine = models["demo"]
    with pytest.raises(RequestError) as caught:
        decode_alone(engine, engine.tokenize(TextPrompt("x")), constrained(PERSON))
    assert caught.value.reason == "unsupported"
