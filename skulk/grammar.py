"""Structured output: the JSON a request must produce, refused at the API edge when we cannot
enforce it.

A request asks for structured output with OpenAI's ``response_format`` (``{"type":
"json_object"}``, or ``{"type": "json_schema", "json_schema": {"schema": …, "strict": …}}``)
or Ollama's ``format`` (``"json"`` or a schema); a forced tool call asks for arguments valid for
the tool's ``parameters`` schema (:func:`tool_call_schema`). All of them become one JSON schema
(``"json"`` and ``json_object`` are :data:`JSON_OBJECT_SCHEMA`), carried to the runner as JSON text
(:func:`schema_text`) and enforced there token by token (:mod:`skulk.engine._grammar`).
``strict: false`` is enforced too: constraining is never worse than best effort.

Why **llguidance** (not xgrammar, not outlines-core):

* it is the engine llama.cpp and vLLM ship for JSON schemas and grammars, maintained by the
  Guidance team, with an abi3 wheel for this platform (no Rust toolchain, no torch);
* it builds the token mask lazily per step with an Earley parser over a token trie (about
  10 to 50 µs per step on the demo model's 1024-token vocabulary, measured), so compiling a new
  schema costs well under a millisecond instead of a precomputed per-schema automaton;
* it *says* what it cannot do: a keyword it does not implement (``not``, ``if``/``then``,
  ``uniqueItems``, ``propertyNames``, …), an unknown ``format``, a ``oneOf`` whose branches can
  overlap, an unsatisfiable schema or a remote ``$ref`` is an error naming it, never silently
  ignored — so :func:`check_schema` asks llguidance itself instead of keeping a keyword list
  that would drift from the library;
* its matcher supports ``rollback(n)`` (speculative decoding) and computes masks with the GIL
  released.

Its one departure from JSON Schema that clients may notice: object properties are produced in
the order the schema lists them. Ours (:func:`closed_objects`, as llama.cpp's JSON-schema
grammars do): an object schema that lists ``properties`` and does not mention
``additionalProperties`` admits no other key, since a weak model given the freedom writes made-up
keys until its token budget runs out; an explicit ``true`` or sub-schema is honoured.

Output is compact JSON with Python's separators (``", "``, ``": "``) and no other whitespace, so
a weak model cannot loop on whitespace and every instance of a bounded schema has a bounded
length.

This module is pure (no mlx): the API imports it to refuse a schema with a 400 before a request
is queued, and the runner uses the same options to compile it.
"""

from __future__ import annotations

import copy
import json
import re
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Final, Literal

import llguidance

#: The schema for "any JSON object" (OpenAI ``json_object``, Ollama ``format: "json"``).
JSON_OBJECT_SCHEMA: Final = '{"type": "object"}'
#: Largest schema accepted, as compact JSON text. Compiling one this size takes ~60 ms (the
#: grammar is validated eagerly), so a bigger one could stall the loop that checks it.
MAX_SCHEMA_BYTES: Final = 64 * 1024
#: Deepest nesting of objects and arrays in the schema document (not in its instances).
MAX_SCHEMA_DEPTH: Final = 64
#: How the JSON compiler is configured, overriding any ``x-guidance`` key in a client's schema
#: (``lenient`` would let llguidance ignore keywords it does not implement, and free whitespace
#: lets a weak model emit blanks until the token budget runs out).
COMPILE_OPTIONS: Final[llguidance._lib.JsonCompileOptions] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": False,
    "coerce_one_of": False,
}

Problem = Literal["unsupported", "invalid", "unsatisfiable", "too_large", "too_deep"]

# Keys whose values map names to subschemas, and keys whose values are data, not schemas.
_NAMED_SUBSCHEMAS: Final = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
_DATA_KEYS: Final = frozenset({"enum", "const", "default", "examples"})
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: (\[[^\]]*\])")
_MAX_MESSAGE = 400


class SchemaRefused(ValueError):
    """A schema we cannot enforce; the API answers 400 with :attr:`param` and :attr:`message`.

    ``param`` is the request field that carried the schema (``response_format.json_schema.
    schema``, ``format``, ``tools[0].function.parameters``); ``problem`` is the kind of
    refusal; ``feature`` names what was refused (``keyword "propertyNames"``, ``format
    "foo"``, …) and ``location`` is the JSON pointer of the subschema using it (``""`` for the
    root or when unknown).
    """

    def __init__(self, param: str, problem: Problem, feature: str, location: str = "") -> None:
        self.param = param
        self.problem = problem
        self.feature = feature
        self.location = location
        where = f" at {location!r}" if location else ""
        self.message = f"{param}: {_PREFIX[problem]}{feature}{where}"
        super().__init__(self.message)


_PREFIX: Final[dict[Problem, str]] = {
    "unsupported": "unsupported ",
    "invalid": "invalid schema: ",
    "unsatisfiable": "unsatisfiable schema: ",
    "too_large": "schema too large: ",
    "too_deep": "schema too deep: ",
}


def check_schema(schema: object, param: str = "schema") -> None:
    """Raise :class:`SchemaRefused` unless structured output can enforce ``schema`` (a decoded
    JSON value). Pure and deterministic; costs up to ~60 ms for a schema of
    :data:`MAX_SCHEMA_BYTES`, so an async caller may want a worker thread for large ones."""
    text = schema_text(schema, param)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar_for(text))
    if is_error:  # warnings (none seen for JSON schemas) do not refuse a schema
        raise schema_error(param, messages[0] if messages else "refused", schema)


def schema_text(schema: object, param: str = "schema") -> str:
    """``schema`` as the compact JSON text the runner receives (key order kept: it is the
    order properties are produced in), its objects closed (:func:`closed_objects`). Raises
    :class:`SchemaRefused` for a value that is not a JSON object, or one over the size or depth
    caps."""
    if not isinstance(schema, dict):
        raise SchemaRefused(param, "invalid", "a schema must be a JSON object")
    depth = _depth(schema)
    if depth > MAX_SCHEMA_DEPTH:
        raise SchemaRefused(param, "too_deep", f"nested {depth} levels, at most {MAX_SCHEMA_DEPTH}")
    schema = closed_objects(schema)
    try:
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as e:  # NaN, or a value json.loads cannot produce
        raise SchemaRefused(param, "invalid", f"not JSON ({e})") from None
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:  # a lone surrogate, from a "\\udc00" escape or raw bytes
        raise SchemaRefused(param, "invalid", "a string holds a lone surrogate") from None
    if size > MAX_SCHEMA_BYTES:
        raise SchemaRefused(param, "too_large", f"{size} bytes, at most {MAX_SCHEMA_BYTES}")
    return text


def closed_objects(schema: dict[str, object]) -> dict[str, object]:
    """A copy of ``schema`` in which every object schema that lists ``properties`` and does not
    mention ``additionalProperties`` has ``additionalProperties: false``, at every level
    (properties, items, ``anyOf``/``oneOf``/``allOf`` branches, ``$defs``, …). An explicit
    ``true`` or sub-schema is kept; a schema without ``properties`` (``{"type": "object"}``:
    any object) stays open.

    ``allOf`` composes one object from several: closing each branch would forbid the keys the
    others add, so its branches (and the local ``$defs`` they ``$ref``) stay as written and the
    schema holding the ``allOf`` is closed over all of their properties instead (each listed in
    its ``properties`` as ``{}``, after its own), as llama.cpp merges them."""
    schema = copy.deepcopy(schema)
    branches: set[int] = set()  # id() of the allOf branches, and of the $defs they refer to
    unions: dict[int, list[str]] = {}  # id() of a schema holding allOf: its branches' keys
    for _, node in _subschemas(schema):
        parts = node.get("allOf")
        if not isinstance(parts, list):
            continue
        names: list[str] = []
        for part in parts:
            target = _local_ref(schema, part)
            for branch in (part, target):
                if isinstance(branch, dict):
                    branches.add(id(branch))
                    props = branch.get("properties")
                    if isinstance(props, dict):
                        names.extend(str(n) for n in props if n not in names)
        if names:
            unions[id(node)] = names
    for _, node in _subschemas(schema):
        if id(node) in branches or "additionalProperties" in node:
            continue
        props = node.get("properties")
        names = unions.get(id(node), [])
        if names and (props is None or isinstance(props, dict)):
            own = dict(props or {})
            node["properties"] = {**own, **{n: {} for n in names if n not in own}}
        elif not isinstance(props, dict):
            continue
        node["additionalProperties"] = False
    return schema


def _local_ref(schema: dict[str, object], node: object) -> object:
    """The subschema a local ``{"$ref": "#/$defs/Name"}`` (or ``#/definitions/``) points to,
    else ``None``."""
    ref = node.get("$ref") if isinstance(node, dict) else None
    if not isinstance(ref, str):
        return None
    for where in ("$defs", "definitions"):
        prefix = f"#/{where}/"
        defs = schema.get(where)
        if ref.startswith(prefix) and isinstance(defs, dict):
            return defs.get(ref.removeprefix(prefix).replace("~1", "/").replace("~0", "~"))
    return None


def tool_call_schema(tools: Mapping[str, object]) -> dict[str, object]:
    """The schema of one call of one of ``tools`` (function name → its ``parameters`` schema,
    each checked with :func:`check_schema` first) in the ``{"name": …, "arguments": …}`` shape
    that mlx-lm's ``json_tools`` parser (Hermes, Qwen) reads: the name is a constant, the
    arguments valid for that function's schema. One tool (``tool_choice`` naming a function)
    gives one object; several (``"required"``) an ``anyOf`` of them."""
    calls: list[dict[str, object]] = [
        {
            "type": "object",
            "properties": {"name": {"const": name}, "arguments": parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for name, parameters in tools.items()
    ]
    if not calls:
        raise ValueError("no tools to call")
    return calls[0] if len(calls) == 1 else {"anyOf": calls}


def grammar_for(text: str) -> str:
    """The llguidance grammar enforcing the JSON schema ``text`` (from :func:`schema_text`)
    with :data:`COMPILE_OPTIONS`. Not validated: see :func:`check_schema`."""
    return llguidance.LLMatcher.grammar_from_json_schema(text, overrides=COMPILE_OPTIONS)


def schema_error(param: str, message: str, schema: object) -> SchemaRefused:
    """The :class:`SchemaRefused` for llguidance's error ``message`` about ``schema`` (also
    used by the runner when a matcher refuses a grammar)."""
    message = message.strip()
    unimplemented = _UNIMPLEMENTED.search(message)
    if unimplemented is not None:
        keys = [str(k) for k in json.loads(unimplemented.group(1))] or ["?"]
        noun = "keyword" if len(keys) == 1 else "keywords"
        feature = f"{noun} " + ", ".join(f'"{k}"' for k in keys)
        return SchemaRefused(param, "unsupported", feature, _locate(schema, keys[0]))
    if message.startswith("oneOf constraints are not supported"):
        feature = 'keyword "oneOf" whose alternatives can overlap (use "anyOf")'
        return SchemaRefused(param, "unsupported", feature, _locate(schema, "oneOf"))
    if message.startswith("Unknown format: "):
        name = message.removeprefix("Unknown format: ")
        return SchemaRefused(param, "unsupported", f'format "{name}"', _locate(schema, "format"))
    if message.startswith("Unsatisfiable schema: "):
        return SchemaRefused(param, "unsatisfiable", _short(message.split(": ", 1)[1]))
    return SchemaRefused(param, "invalid", _short(message))


def _short(message: str) -> str:
    message = " ".join(message.split())
    return message if len(message) <= _MAX_MESSAGE else message[: _MAX_MESSAGE - 1] + "…"


def _depth(value: object) -> int:
    """Nesting depth of containers, iteratively (a hostile document must not recurse)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, (dict, list)):
            deepest = max(deepest, depth)
            if depth <= MAX_SCHEMA_DEPTH:  # deeper is refused anyway: stop counting
                children = node.values() if isinstance(node, dict) else node
                stack.extend((child, depth + 1) for child in children)
    return deepest


def _locate(schema: object, keyword: str) -> str:
    """JSON pointer of the first subschema using ``keyword`` (``""`` if none is found)."""
    for pointer, node in _subschemas(schema):
        if keyword in node:
            return pointer
    return ""


def _subschemas(schema: object) -> Iterator[tuple[str, dict[str, object]]]:
    """Every subschema (as ``(pointer, dict)``), parents first; property names and data
    (``enum``, ``const``, …) are not mistaken for keywords."""
    queue: deque[tuple[str, object]] = deque([("", schema)])
    while queue:
        pointer, node = queue.popleft()
        if not isinstance(node, dict):
            continue
        yield pointer, node
        for key, value in node.items():
            here = f"{pointer}/{_escape(str(key))}"
            if key in _DATA_KEYS:
                continue
            if key in _NAMED_SUBSCHEMAS and isinstance(value, dict):
                queue.extend((f"{here}/{_escape(str(n))}", sub) for n, sub in value.items())
            elif isinstance(value, dict):
                queue.append((here, value))
            elif isinstance(value, list):
                queue.extend((f"{here}/{i}", item) for i, item in enumerate(value))


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")
