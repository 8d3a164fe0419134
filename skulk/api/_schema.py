"""JSON Schema fragments for the parsers' field tables (sans-IO, no dependencies).

Every request parser keeps a table of the fields it knows; each entry carries the JSON Schema
of the values it accepts, and the parser's set of known fields is the table's keys. The OpenAPI
document (:mod:`skulk.api._openapi`) is built from the same tables, so a field cannot be
accepted by a parser and missing from the document, or the other way round. Descriptions start
with how the field is treated: **honoured**, **no-op only** (refused with a 400 unless it has
the value that changes nothing) or **informational** (accepted, changes nothing generated).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

Schema = dict[str, object]
"""A JSON Schema (2020-12, as OpenAPI 3.1 uses it) as a plain JSON-able dict."""

#: JSON's name for each Python type ``json.loads`` produces.
_JSON_TYPES: dict[type, str] = {
    str: "string",
    bool: "boolean",
    int: "integer",
    float: "number",
    dict: "object",
    list: "array",
}

HONOURED = "Honoured."
INFORMATIONAL = "Informational: accepted, changes nothing that is generated."


def json_types(types: Iterable[type]) -> list[str]:
    """The JSON type names of Python ``types`` (``object`` meaning any: an empty list)."""
    if object in types:
        return []
    return [_JSON_TYPES[t] for t in types]


def nullable(schema: Mapping[str, object]) -> Schema:
    """``schema`` or ``null`` (``null`` means "the default" for every optional field)."""
    return {"anyOf": [dict(schema), {"type": "null"}]}


def typed(types: Iterable[type], description: str, **extra: object) -> Schema:
    """Any value of ``types`` (``object``: any value at all) or null."""
    names = json_types(types)
    schema: Schema = {"description": description, **extra}
    if names:
        schema["type"] = [*names, "null"]
    return schema


def no_op(allowed: Iterable[object], supported: str) -> Schema:
    """A field accepted only with one of ``allowed`` (or null): any other value is a 400."""
    return {
        "enum": [*allowed, None],
        "description": f"No-op only: accepted with {supported}; any other value is refused "
        "(400 unsupported_parameter) because this server cannot honour it.",
    }


def obj(
    properties: Mapping[str, Mapping[str, object]],
    *,
    required: Iterable[str] = (),
    description: str | None = None,
) -> Schema:
    """A JSON object with exactly ``properties`` (any other key is refused)."""
    schema: Schema = {
        "type": "object",
        "properties": {name: dict(s) for name, s in properties.items()},
        "additionalProperties": False,
    }
    if required := list(required):
        schema["required"] = required
    if description is not None:
        schema["description"] = description
    return schema


def honoured(description: str, **schema: object) -> Schema:
    """An honoured field's schema, its description saying so."""
    return {"description": f"{HONOURED} {description}".strip(), **schema}


def ref(name: str) -> Schema:
    """A reference to the shared schema ``name`` (``components.schemas`` of the document;
    each parser module lists the ones it uses in its ``SCHEMAS``)."""
    return {"$ref": f"#/components/schemas/{name}"}
