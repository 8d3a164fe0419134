"""Client schemas become closed grammars (skulk.grammar.closed_objects): an object schema that
lists properties and does not mention additionalProperties admits no other key, at every level;
an explicit true or sub-schema is honoured. Checked on llguidance's byte tokenizer (no mlx)."""

from __future__ import annotations

import json

import llguidance
import pytest

from skulk.api._openai_parse import parse_chat_completions
from skulk.grammar import closed_objects, grammar_for, schema_text

BYTES = llguidance.LLTokenizer("byte")
CITY = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}


def accepts(schema: dict[str, object], text: str) -> bool:
    """Whether the grammar the runner would build for ``schema`` produces exactly ``text``."""
    matcher = llguidance.LLMatcher(BYTES, grammar_for(schema_text(schema)), log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.consume_tokens(BYTES.tokenize_str(text)) and matcher.is_accepting()


def test_without_additional_properties_an_extra_key_is_refused() -> None:
    assert accepts(CITY, '{"city": "Oslo", "days": 3}')
    assert not accepts(CITY, '{"city": "Oslo", "days": 3, "mood": "sunny"}')


def test_an_explicit_true_allows_other_keys() -> None:
    schema = {**CITY, "additionalProperties": True}
    assert accepts(schema, '{"city": "Oslo", "days": 3, "mood": "sunny"}')


def test_a_sub_schema_constrains_other_keys() -> None:
    schema = {**CITY, "additionalProperties": {"type": "integer"}}
    assert accepts(schema, '{"city": "Oslo", "days": 3, "hours": 4}')
    assert not accepts(schema, '{"city": "Oslo", "days": 3, "mood": "sunny"}')
    # ... and an object inside the sub-schema is closed in its turn.
    inner = {**CITY, "additionalProperties": {"type": "object", "properties": {"x": {}}}}
    assert accepts(inner, '{"city": "Oslo", "days": 3, "o": {"x": 1}}')
    assert not accepts(inner, '{"city": "Oslo", "days": 3, "o": {"x": 1, "y": 2}}')


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        (
            {"type": "object", "properties": {"home": CITY}},
            '{"home": {"city": "Oslo", "days": 3}}',
            '{"home": {"city": "Oslo", "days": 3, "mood": 1}}',
        ),
        (
            {"type": "array", "items": CITY},
            '[{"city": "Oslo", "days": 3}]',
            '[{"city": "Oslo", "days": 3, "mood": 1}]',
        ),
        (
            {"anyOf": [CITY, {"type": "integer"}]},
            '{"city": "Oslo", "days": 3}',
            '{"city": "Oslo", "days": 3, "mood": 1}',
        ),
        (
            {
                "$defs": {"City": CITY},
                "type": "object",
                "properties": {"c": {"$ref": "#/$defs/City"}},
            },
            '{"c": {"city": "Oslo", "days": 3}}',
            '{"c": {"city": "Oslo", "days": 3, "mood": 1}}',
        ),
    ],
    ids=["properties", "items", "anyOf", "$defs"],
)
def test_objects_are_closed_at_every_level(schema: dict[str, object], good: str, bad: str) -> None:
    assert accepts(schema, good)
    assert not accepts(schema, bad)


def test_a_schema_without_properties_is_still_any_object() -> None:
    assert accepts({"type": "object"}, '{"anything": [1, 2]}')


def test_all_of_branches_compose_one_closed_object() -> None:
    # Closing each branch would forbid the other's keys: the holder is closed over both.
    schema = {
        "$defs": {"Base": {"type": "object", "properties": {"a": {"type": "integer"}}}},
        "allOf": [{"$ref": "#/$defs/Base"}, {"properties": {"b": {"type": "integer"}}}],
    }
    assert accepts(schema, '{"a": 1, "b": 2}')
    assert not accepts(schema, '{"a": 1, "b": 2, "c": 3}')
    assert not accepts(schema, '{"a": "x", "b": 2}')  # the branches still type their keys


def test_the_clients_schema_is_not_changed_in_place() -> None:
    schema = json.loads(json.dumps(CITY))
    closed = closed_objects(schema)
    assert schema == CITY
    assert closed == {**CITY, "additionalProperties": False}


def test_a_forced_tool_calls_arguments_are_closed() -> None:
    tool = {"type": "function", "function": {"name": "weather", "parameters": CITY}}
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "tools": [tool],
        "tool_choice": "required",
    }
    schema = parse_chat_completions(body).params.json_schema
    assert schema is not None
    call = json.loads(schema)
    assert call["properties"]["arguments"] == {**CITY, "additionalProperties": False}
