"""Structured output fields of every format become the runner's schema text (or a 400)."""

from __future__ import annotations

import json

import pytest

from skulk.api._errors import ApiError
from skulk.api._openai_parse import parse_chat_completions
from skulk.api._responses_parse import parse_responses
from skulk.api._structured import CHECK_HERE_BYTES, ollama_format, openai_response_format
from skulk.grammar import JSON_OBJECT_SCHEMA
from skulk.wire.runner import GenerationEnd, Usage

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
#: What the runner gets for SCHEMA: its object closed (no additionalProperties said: none allowed).
CLOSED = {**SCHEMA, "additionalProperties": False}


def test_openai_response_format_kinds() -> None:
    assert openai_response_format(None) is None
    assert openai_response_format({"type": "text"}) is None
    assert openai_response_format({"type": "json_object"}) == JSON_OBJECT_SCHEMA
    spec = {"name": "a", "schema": SCHEMA, "strict": True}
    text = openai_response_format({"type": "json_schema", "json_schema": spec})
    assert text is not None and json.loads(text) == CLOSED
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
    req = parse_chat_completions({**body, "response_format": {"type": "json_object"}})
    assert req.params.json_schema == JSON_OBJECT_SCHEMA


@pytest.mark.parametrize(
    ("value", "param"),
    [
        (
            {"type": "json_schema", "json_schema": {"name": "a", "schema": 3}},
            "response_format.json_schema.schema",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a b"}},
            "response_format.json_schema.name",
        ),
        (
            {"type": "json_schema", "json_schema": {"name": "a", "x": 1}},
            "response_format.json_schema.x",
        ),
        ({"type": "json_object", "json_schema": {}}, "response_format.json_schema"),
        (
            {"type": "json_schema", "json_schema": {"name": "a", "strict": "yes"}},
            "response_format.json_schema.strict",
        ),
    ],
)
def test_openai_response_format_errors_name_the_field(value: object, param: str) -> None:
    with pytest.raises(ApiError) as caught:
        openai_response_format(value)
    assert caught.value.param == param


def test_responses_text_format_and_its_echo() -> None:
    fmt = {"type": "json_schema", "name": "a", "schema": SCHEMA, "strict": True}
    req = parse_responses({"model": "m", "input": "x", "text": {"format": fmt}})
    assert req.params.json_schema is not None and json.loads(req.params.json_schema) == CLOSED
    whole = req.format.renderer("m").whole("{}", GenerationEnd("stop", Usage(1, 1)))
    assert whole["text"]["format"] == fmt  # type: ignore[index]


def test_a_large_schema_is_left_to_the_runner() -> None:
    """Over CHECK_HERE_BYTES the API only caps its size; the runner's preparing thread
    compiles (and refuses) it, off the event loop."""
    big = {"type": "object", "description": "x" * CHECK_HERE_BYTES, "not": {}}
    text = ollama_format(big)
    assert text is not None and '"not"' in text
    with pytest.raises(ApiError) as caught:
        ollama_format({"type": "object", "not": {}})
    assert caught.value.param == "format" and caught.value.code == "unsupported_schema"
