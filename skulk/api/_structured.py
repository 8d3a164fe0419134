"""Structured output fields of every format, read into one JSON schema for the runner (sans-IO).

OpenAI chat's ``response_format``, Responses' ``text.format`` and Ollama's ``format`` all say
the same thing in three shapes: free text, any JSON object, or a JSON document valid for a
schema. Each parser calls its reader here and puts the result in
:attr:`~skulk.wire.runner.SamplingParams.json_schema`; the runner enforces it token by token
(:mod:`skulk.engine._grammar`), so the output of a request that ends with ``"stop"`` always
parses and validates.

A schema is refused with a 400 naming its field and the feature
(:class:`~skulk.grammar.SchemaRefused`). Up to :data:`CHECK_HERE_BYTES` it is checked here, on
the event loop (well under a millisecond for such schemas); a larger one (up to
:data:`~skulk.grammar.MAX_SCHEMA_BYTES`) is checked where it is compiled anyway, on the
runner's prompt-preparing thread, which refuses it the same way (``invalid_request``, a 400
whose message names the field and the feature) — so no big schema is ever compiled on the
API's event loop.
"""

from __future__ import annotations

import json
import re
from typing import Final, TypeVar

from skulk.api._errors import ApiError
from skulk.grammar import JSON_OBJECT_SCHEMA, SchemaRefused, check_schema, schema_text

T = TypeVar("T")
#: OpenAI's rule for the names of schemas and tools.
NAME_PATTERN: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
#: Schemas up to this size (compact JSON text) are checked in the API; larger ones by the runner.
CHECK_HERE_BYTES: Final = 4096


def refused(exc: SchemaRefused) -> ApiError:
    """The 400 for a schema we cannot enforce, naming the field and the feature."""
    return ApiError.invalid(exc.param, exc.message, code="unsupported_schema")


def schema_json(schema: object, param: str) -> str:
    """``schema`` (a decoded JSON value) as the runner's schema text, checked (see the module
    docstring for where). Raises :class:`ApiError`."""
    try:
        text = schema_text(schema, param)
        if len(text) <= CHECK_HERE_BYTES:
            check_schema(json.loads(text), param)
    except SchemaRefused as exc:
        raise refused(exc) from None
    return text


def check_name(value: object, param: str) -> str:
    """A schema's or a tool's ``name``: OpenAI's rule (``a-z``, ``A-Z``, ``0-9``, ``_`` and
    ``-``, at most 64 characters)."""
    if not isinstance(value, str):
        raise ApiError.invalid_type(param, "a string", value)
    if not NAME_PATTERN.match(value):
        raise ApiError.invalid(
            param, f"Invalid value for '{param}': 1 to 64 of a-z, A-Z, 0-9, '_' and '-'."
        )
    return value


def optional(value: object, param: str, kind: type[T], expected: str) -> T | None:
    """``value`` if it is null or a ``kind``, else a 400 naming ``param`` (``expected`` says
    what was, e.g. ``"a string"``)."""
    if value is not None and not isinstance(value, kind):
        raise ApiError.invalid_type(param, expected, value)
    return value


def _json_schema_fields(spec: dict[str, object], param: str, *, extra: frozenset[str]) -> str:
    """The ``name``/``schema``/``strict``/``description`` of a ``json_schema`` format at
    ``param`` (``strict: false`` is enforced too: constraining is never worse than best
    effort; an absent schema means any JSON object)."""
    for key in spec:
        if key not in {"name", "schema", "strict", "description", *extra}:
            raise ApiError.unknown_parameter(f"{param}.{key}")
    if "name" not in spec:
        raise ApiError.missing(f"{param}.name")
    check_name(spec["name"], f"{param}.name")
    optional(spec.get("strict"), f"{param}.strict", bool, "a boolean")
    optional(spec.get("description"), f"{param}.description", str, "a string")
    schema = spec.get("schema")
    if schema is None:
        return JSON_OBJECT_SCHEMA
    if not isinstance(schema, dict):
        raise ApiError.invalid_type(f"{param}.schema", "an object", schema)
    return schema_json(schema, f"{param}.schema")


def openai_response_format(value: object, param: str = "response_format") -> str | None:
    """Chat Completions' ``response_format``: ``{"type": "text"}`` (or null) → ``None``;
    ``{"type": "json_object"}`` → any JSON object; ``{"type": "json_schema", "json_schema":
    {"name", "schema", "strict", "description"}}`` → that schema."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError.invalid_type(param, "an object", value)
    kind = value.get("type")
    if kind is None:
        raise ApiError.missing(f"{param}.type")
    allowed = {"text": set(), "json_object": set(), "json_schema": {"json_schema"}}
    if not isinstance(kind, str) or kind not in allowed:
        raise ApiError.invalid(
            f"{param}.type",
            f"Invalid value for '{param}.type': expected one of 'text', 'json_object' or "
            "'json_schema'.",
        )
    for key in value:
        if key != "type" and key not in allowed[kind]:
            raise ApiError.unknown_parameter(f"{param}.{key}")
    if kind == "text":
        return None
    if kind == "json_object":
        return JSON_OBJECT_SCHEMA
    spec = value.get("json_schema")
    if spec is None:
        raise ApiError.missing(f"{param}.json_schema")
    if not isinstance(spec, dict):
        raise ApiError.invalid_type(f"{param}.json_schema", "an object", spec)
    return _json_schema_fields(spec, f"{param}.json_schema", extra=frozenset())


def responses_text_format(value: object, param: str = "text.format") -> str | None:
    """Responses' ``text.format``: as :func:`openai_response_format`, with the ``json_schema``
    fields beside ``type`` (``{"type": "json_schema", "name", "schema", "strict"}``)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise ApiError.invalid_type(param, "an object", value)
    if value.get("type") != "json_schema":
        return openai_response_format(value, param)
    return _json_schema_fields(value, param, extra=frozenset({"type"}))


def ollama_format(value: object, param: str = "format") -> str | None:
    """Ollama's ``format``: ``""`` or null → ``None``; ``"json"`` → any JSON object (Ollama
    lets the model pick any JSON value there; an object is what its clients expect); an object
    → that schema."""
    if value is None or value == "":
        return None
    if value == "json":
        return JSON_OBJECT_SCHEMA
    if isinstance(value, dict):
        return schema_json(value, param)
    if isinstance(value, str):
        raise ApiError.unsupported(param, value, supported='"json", a JSON schema or ""')
    raise ApiError.invalid_type(param, 'a string ("json") or an object (a JSON schema)', value)


#: The JSON Schemas of the fields, for the OpenAPI documents (what the readers above accept).
JSON_SCHEMA_SPEC: Final[dict[str, object]] = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
        "schema": {"type": "object"},
        "strict": {"type": ["boolean", "null"]},
        "description": {"type": ["string", "null"]},
    },
    "required": ["name"],
    "additionalProperties": False,
}
_TEXT_OR_OBJECT: Final[dict[str, object]] = {
    "type": "object",
    "properties": {"type": {"enum": ["text", "json_object"]}},
    "required": ["type"],
    "additionalProperties": False,
}
RESPONSE_FORMAT_SCHEMA: Final[dict[str, object]] = {
    "anyOf": [
        {"type": "null"},
        _TEXT_OR_OBJECT,
        {
            "type": "object",
            "properties": {"type": {"const": "json_schema"}, "json_schema": JSON_SCHEMA_SPEC},
            "required": ["type", "json_schema"],
            "additionalProperties": False,
        },
    ]
}
#: Responses' ``text.format``: the ``json_schema`` fields beside ``type``.
TEXT_FORMAT_SCHEMA: Final[dict[str, object]] = {
    "anyOf": [
        {"type": "null"},
        _TEXT_OR_OBJECT,
        {
            "type": "object",
            "properties": {
                "type": {"const": "json_schema"},
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "schema": {"type": "object"},
                "strict": {"type": ["boolean", "null"]},
                "description": {"type": ["string", "null"]},
            },
            "required": ["type", "name"],
            "additionalProperties": False,
        },
    ]
}
