"""The embedding routes' bodies (:mod:`skulk.api._embeddings`): what is honoured, what is a 400
naming the field, and the base64 encoding the official OpenAI client decodes."""

from __future__ import annotations

import base64
import struct

import pytest

from skulk.api._embeddings import (
    MAX_INPUTS,
    base64_vector,
    openai_response,
    parse_ollama,
    parse_ollama_legacy,
    parse_openai,
)
from skulk.api._errors import ApiError
from skulk.wire.runner import TextPrompt, TokenIds
from skulk.worker import Embedding


def refused(parse: object, body: object) -> ApiError:
    assert callable(parse)
    with pytest.raises(ApiError) as err:
        parse(body)
    assert err.value.status == 400
    return err.value


def test_openai_input_shapes() -> None:
    assert parse_openai({"model": "m", "input": "hi"}) == ("m", (TextPrompt("hi"),), False)
    assert parse_openai({"model": "m", "input": ["a", "b"], "encoding_format": "base64"}) == (
        "m",
        (TextPrompt("a"), TextPrompt("b")),
        True,
    )
    assert parse_openai({"model": "m", "input": [1, 2, 3]})[1] == (TokenIds((1, 2, 3)),)
    _, inputs, _ = parse_openai({"model": "m", "input": [[1, 2], [3]], "user": "u"})
    assert inputs == (TokenIds((1, 2)), TokenIds((3,)))
    assert parse_openai({"model": "m", "input": "x", "encoding_format": None})[2] is False


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"input": "x"}, "model"),
        ({"model": "m", "input": ""}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": [[]]}, "input[0]"),
        ({"model": "m", "input": ["a", 1]}, "input[1]"),
        ({"model": "m", "input": [[1, -1]]}, "input[0][1]"),
        ({"model": "m", "input": [[1, True]]}, "input[0][1]"),
        ({"model": "m", "input": ["x"] * (MAX_INPUTS + 1)}, "input"),
        ({"model": "m", "input": "x", "dimensions": 8}, "dimensions"),
        ({"model": "m", "input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"model": "m", "input": "x", "user": 3}, "user"),
        ({"model": "m", "input": "x", "temperature": 1}, "temperature"),
    ],
)
def test_openai_refusals_name_the_field(body: dict[str, object], param: str) -> None:
    assert refused(parse_openai, body).param == param


def test_ollama_bodies() -> None:
    assert parse_ollama({"model": "m", "input": "hi"}) == ("m", (TextPrompt("hi"),), True)
    body = {"model": "m", "input": ["a"], "truncate": False, "keep_alive": "5m", "options": {}}
    assert parse_ollama(body) == ("m", (TextPrompt("a"),), False)
    assert parse_ollama_legacy({"model": "m", "prompt": "p"}) == ("m", TextPrompt("p"))
    assert refused(parse_ollama, {"model": "m", "input": "x", "dimensions": 4}).param == (
        "dimensions"
    )
    assert refused(parse_ollama, {"model": "m", "input": [1]}).param == "input[0]"
    assert refused(parse_ollama, {"model": "m", "input": "x", "truncate": 1}).param == "truncate"
    options = {"model": "m", "input": "x", "options": {"temperature": -1}}
    assert refused(parse_ollama, options).param == "options.temperature"
    assert refused(parse_ollama_legacy, {"model": "m"}).param == "prompt"


def test_base64_is_little_endian_float32() -> None:
    vector = (0.5, -0.25, 1.0)
    raw = base64.b64decode(base64_vector(vector))
    assert struct.unpack("<3f", raw) == vector
    answer = openai_response("m", Embedding((vector,), 3), as_base64=False)
    assert answer["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    assert answer["data"] == [{"object": "embedding", "index": 0, "embedding": list(vector)}]
