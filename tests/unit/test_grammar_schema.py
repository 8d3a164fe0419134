"""Structured-output schemas checked at the API edge (skulk.grammar): what llguidance can
enforce passes, anything else is refused with the feature named."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from skulk.grammar import (
    JSON_OBJECT_SCHEMA,
    MAX_SCHEMA_BYTES,
    MAX_SCHEMA_DEPTH,
    SchemaRefused,
    check_schema,
    schema_text,
)

PARAM = "response_format.json_schema.schema"

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "role": {"enum": ["admin", "user", None]},
        "scores": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 4},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city"],
        },
        "when": {"type": "string", "format": "date-time"},
        "tag": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "ratio": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["name", "role", "scores"],
    "additionalProperties": False,
    "$defs": {"unused": {"type": "boolean"}},
}


def refusal(schema: object) -> SchemaRefused:
    with pytest.raises(SchemaRefused) as caught:
        check_schema(schema, PARAM)
    assert caught.value.param == PARAM
    assert str(caught.value) == caught.value.message
    assert caught.value.message.startswith(PARAM + ": ")
    return caught.value


@pytest.mark.parametrize(
    "schema",
    [
        json.loads(JSON_OBJECT_SCHEMA),
        PERSON,
        {"type": "string", "pattern": "^[a-z]+[0-9]{2}$"},
        {"oneOf": [{"type": "string"}, {"type": "integer"}]},  # cannot overlap: it is anyOf
        {
            "$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
            "$ref": "#/$defs/node",
        },
        {"type": "object", "x-vendor-annotation": True, "description": "unknown keys are notes"},
    ],
)
def test_enforceable_schemas_pass(schema: dict[str, object]) -> None:
    check_schema(schema, PARAM)


def test_an_unimplemented_keyword_is_named_with_where_it_is() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string"}, "b": {"type": "array", "uniqueItems": True}},
    }
    err = refusal(schema)
    assert (err.problem, err.feature, err.location) == (
        "unsupported",
        'keyword "uniqueItems"',
        "/properties/b",
    )
    assert err.message == f"{PARAM}: unsupported keyword \"uniqueItems\" at '/properties/b'"


@pytest.mark.parametrize(
    ("keyword", "extra"),
    [
        ("propertyNames", {"pattern": "^a"}),
        ("contains", {"type": "integer"}),
        ("dependentRequired", {"a": ["b"]}),
        ("unevaluatedProperties", False),
        ("not", {"type": "string"}),
    ],
)
def test_each_unimplemented_keyword_is_refused_by_name(keyword: str, extra: object) -> None:
    err = refusal({"type": "object", keyword: extra})
    assert err.feature == f'keyword "{keyword}"'
    assert err.location == ""


def test_a_property_named_like_a_keyword_is_not_mistaken_for_it() -> None:
    schema = {
        "type": "object",
        "properties": {"not": {"type": "string"}, "deep": {"items": {"not": {"type": "null"}}}},
        "enum": [{"not": 1}],
    }
    err = refusal(schema)
    assert err.feature == 'keyword "not"'
    assert err.location == "/properties/deep/items"


def test_several_keywords_are_all_named() -> None:
    err = refusal({"if": {"type": "string"}, "then": {"minLength": 2}})
    assert err.feature == 'keywords "if", "then"'


def test_an_overlapping_one_of_is_refused() -> None:
    err = refusal({"type": "object", "properties": {"n": {"oneOf": [{"type": "number"}, {}]}}})
    assert err.problem == "unsupported"
    assert err.feature.startswith('keyword "oneOf"')
    assert err.location == "/properties/n"


def test_an_unknown_format_is_refused_by_name() -> None:
    err = refusal({"type": "object", "properties": {"u": {"type": "string", "format": "colour"}}})
    assert (err.feature, err.location) == ('format "colour"', "/properties/u")


def test_a_client_cannot_switch_on_lenient_mode() -> None:
    # x-guidance options in the schema are overridden: "lenient" would ignore "not".
    err = refusal({"x-guidance": {"lenient": True}, "not": {"type": "string"}})
    assert err.feature == 'keyword "not"'


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "integer", "minimum": 5, "maximum": 1}, "minimum (5) is greater"),
        ({"enum": []}, "empty"),
        ({"type": "object", "required": ["a"], "additionalProperties": False}, "'a'"),
    ],
)
def test_an_unsatisfiable_schema_is_refused(schema: object, words: str) -> None:
    err = refusal(schema)
    assert err.problem == "unsatisfiable"
    assert words in err.feature


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        ({"type": "colour"}, "colour"),
        ({"type": "string", "pattern": "(a"}, "unclosed group"),
        ({"$ref": "#/$defs/missing"}, "/$defs/missing"),
        ({"$ref": "http://127.0.0.1:9/schema.json"}, "does not fetch"),  # never fetched
        ([{"type": "object"}], "must be a JSON object"),
        (True, "must be a JSON object"),
        ("json", "must be a JSON object"),
        ({"enum": [float("nan")]}, "not JSON"),
        ({"description": "a\udc00b"}, "lone surrogate"),
    ],
)
def test_an_invalid_schema_is_refused(schema: object, words: str) -> None:
    err = refusal(schema)
    assert err.problem == "invalid"
    assert words in err.feature


def test_a_schema_over_the_size_cap_is_refused() -> None:
    props = {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(800)}
    err = refusal({"type": "object", "properties": props})
    assert err.problem == "too_large"
    assert str(MAX_SCHEMA_BYTES) in err.feature


def test_a_schema_nested_past_the_cap_is_refused_without_recursing() -> None:
    schema: dict[str, object] = {"type": "integer"}
    for _ in range(50_000):  # far past the interpreter's recursion limit
        schema = {"type": "array", "items": schema}
    err = refusal(schema)
    assert err.problem == "too_deep"
    assert f"at most {MAX_SCHEMA_DEPTH}" in err.feature


def test_a_schema_at_the_depth_cap_passes_and_one_level_more_does_not() -> None:
    schema: dict[str, object] = {"type": "integer"}
    while schema_depth(schema) < MAX_SCHEMA_DEPTH:
        schema = {"type": "array", "items": schema}
    check_schema(schema, PARAM)
    assert refusal({"type": "array", "items": schema}).problem == "too_deep"


def schema_depth(value: object) -> int:
    if isinstance(value, dict):
        return 1 + max((schema_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((schema_depth(v) for v in value), default=0)
    return 0


def test_schema_text_keeps_property_order() -> None:
    # Properties are produced in the schema's order, so the text must keep it.
    # (closed_objects appends additionalProperties: false, after the client's keys.)
    text = schema_text({"properties": {"z": {}, "a": {}}, "type": "object"})
    assert text == '{"properties":{"z":{},"a":{}},"type":"object","additionalProperties":false}'


def test_the_api_side_checker_does_not_import_mlx() -> None:
    code = (
        "import sys, skulk.grammar; "
        "skulk.grammar.check_schema({'type': 'object'}); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'numpy')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
