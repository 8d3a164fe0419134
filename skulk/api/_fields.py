"""The field checks every request format shares (sans-IO): OpenAI Chat Completions and
Completions, Responses, Anthropic Messages and Ollama all read their bodies with this kit.

A format's parser keeps tables of the fields it knows. Every field falls in exactly one group:

* **honoured**: read with the typed readers here (:func:`opt_int`, :func:`opt_number`,
  :func:`opt_bool`, :func:`opt_str`, :func:`model_name`, :func:`stop_list`, …); its JSON Schema sits
  in the format's ``*_HONOURED`` table (the shared ones here: :data:`MODEL`, :data:`SAMPLING`,
  :data:`MAX_TOKENS`, :data:`STOP_STRING`);
* **no-op only**: a field we cannot honour, accepted only with the value that changes nothing
  (:func:`only`), otherwise 400 ``unsupported_parameter`` — never silently ignored;
* **informational**: any value of the right type (:func:`info`), because it does not change what
  is generated;
* anything else is 400 ``unknown_parameter`` (:func:`checked_body`, :func:`reject_unknown`).

A :class:`Check` is both the check and the JSON Schema of what it lets through, so the OpenAPI
document (:mod:`skulk.api._openapi`) says what the parsers do (:mod:`skulk.api._schema`).

``null`` always means "the default", for every optional field. Numbers follow JSON's typing as
OpenAI does: a boolean is never a number, an integer is fine where a number is expected, and a
float (even ``2.0``) is refused where an integer is expected. Every reader raises
:class:`~skulk.api._errors.ApiError` (400, ``param`` naming the field) and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Iterable, Mapping
from typing import TypeGuard

import attrs

from skulk.api._errors import ApiError, show
from skulk.api._schema import INFORMATIONAL, Schema, honoured, no_op, typed

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1
#: The longest stop string (characters): the runner checks every one against the text it holds
#: back after every token, so a huge one would slow every stream of the runner.
MAX_STOP_LENGTH = 1024

#: The Python types ``json.loads`` gives for each JSON type a field may be declared with.
_KINDS: dict[str, tuple[type, ...]] = {
    "integer": (int,),
    "number": (int, float),
    "string": (str,),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "any": (object,),
}

Kind = str | tuple[str, ...]
"""A field's JSON type (``"integer"``, ``"number"``, ``"string"``, ``"boolean"``, ``"array"``,
``"object"`` or ``"any"``), or several of them."""


# ---- types -----------------------------------------------------------------------------------


def is_int(value: object) -> TypeGuard[int]:
    """A JSON integer (never a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[int | float]:
    """A JSON number (never a boolean)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kinds(kind: Kind) -> tuple[str, ...]:
    return (kind,) if isinstance(kind, str) else kind


def _types(kind: Kind) -> tuple[type, ...]:
    return tuple(t for k in _kinds(kind) for t in _KINDS[k])


def _expected(kind: Kind) -> str:
    """``"a string or an object"`` for ``("string", "object")``."""
    return " or ".join(f"{'an' if k[0] in 'aeiou' else 'a'} {k}" for k in _kinds(kind))


def _has_type(value: object, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # bool is an int subclass; JSON keeps them apart
        return bool in types or object in types
    return isinstance(value, types)


def check_type(param: str, value: object, kind: Kind) -> None:
    """400 ``invalid_type`` unless ``value`` has the JSON type ``kind``."""
    if not _has_type(value, _types(kind)):
        raise ApiError.invalid_type(param, _expected(kind), value)


# ---- no-op-only and informational fields -----------------------------------------------------


@attrs.frozen
class Check:
    """How a parser checks one field (``check(param, value)`` raises :class:`ApiError`), and
    the JSON Schema of the values it lets through: one object for both, so the OpenAPI document
    (:mod:`skulk.api._openapi`) says what the parser does (:mod:`skulk.api._schema`)."""

    check: Callable[[str, object], None]
    schema: Schema

    def __call__(self, param: str, value: object) -> None:
        self.check(param, value)


def _same(value: object, allowed: object) -> bool:
    """``value`` is ``allowed`` as JSON sees it: 1 is 1.0, but ``false`` is not 0."""
    return value == allowed and isinstance(value, bool) == isinstance(allowed, bool)


def only(*allowed: object, kind: Kind = "any") -> Check:
    """A field accepted only with one of ``allowed`` (or null); other values of its JSON type
    ``kind`` are well-formed requests we cannot honour (400 ``unsupported_parameter``)."""
    supported = " or ".join([show(a) for a in allowed] + ["null"])

    def check(param: str, value: object) -> None:
        if value is None:
            return
        check_type(param, value, kind)
        if not any(_same(value, a) for a in allowed):
            raise ApiError.unsupported(param, value, supported=supported)

    return Check(check, no_op(allowed, supported))


def info(kind: Kind) -> Check:
    """A field that does not change what is generated: any value of its JSON type ``kind``."""

    def check(param: str, value: object) -> None:
        if value is not None:
            check_type(param, value, kind)

    return Check(check, typed(_types(kind), INFORMATIONAL))


def run_checks(body: Mapping[str, object], checks: Mapping[str, Check], prefix: str = "") -> None:
    """Run each of ``checks`` on its field of ``body`` (in the table's order; errors name
    ``prefix`` + the field)."""
    for name, check in checks.items():
        if name in body:
            check(prefix + name, body[name])


NULL_ONLY = only()
FALSE = only(False, kind="boolean")
STRING = info("string")


def _check_metadata(param: str, value: object) -> None:
    if value is None:
        return
    for key, item in as_object(value, param).items():
        if not isinstance(item, str):
            raise ApiError.invalid_type(f"{param}.{key}", "a string", item)


#: OpenAI's ``metadata``: an object of strings.
METADATA = Check(
    _check_metadata,
    typed((dict,), f"{INFORMATIONAL} String values.", additionalProperties={"type": "string"}),
)
#: The informational fields of OpenAI's formats (Chat Completions and Responses).
OPENAI_INFO: dict[str, Check] = {
    "user": STRING,
    "safety_identifier": STRING,
    # A routing hint for OpenAI's prefix cache; ours caches (or not) regardless of it.
    "prompt_cache_key": STRING,
    "metadata": METADATA,
    "parallel_tool_calls": info("boolean"),
}


# ---- objects ---------------------------------------------------------------------------------


def as_object(value: object, param: str) -> dict[str, object]:
    """``value``, which must be a JSON object (400 ``invalid_type`` naming ``param``)."""
    if not isinstance(value, dict):
        raise ApiError.invalid_type(param, "an object", value)
    return value


def reject_unknown(keys: Iterable[object], known: Container[object], prefix: str = "") -> None:
    """400 ``unknown_parameter`` for the first of ``keys`` not in ``known``."""
    for key in keys:
        if key not in known:
            raise ApiError.unknown_parameter(f"{prefix}{key}")


def checked_body(value: object, known: Container[object]) -> dict[str, object]:
    """A request body: a JSON object (else 400 ``invalid_body``) with no field beyond
    ``known``."""
    if not isinstance(value, dict):
        raise ApiError.bad_body()
    reject_unknown(value, known)
    return value


def required_str(obj: Mapping[str, object], key: str, param: str) -> str:
    """``obj[key]``, which must be a string; errors name ``{param}.{key}``."""
    value = obj.get(key)
    if value is None:
        raise ApiError.missing(f"{param}.{key}")
    if not isinstance(value, str):
        raise ApiError.invalid_type(f"{param}.{key}", "a string", value)
    return value


def typed_part(
    part: object, param: str, keys: Mapping[str, Mapping[str, object]], supported: str
) -> tuple[str, dict[str, object]]:
    """A content part (or block) at ``param``: an object whose ``type`` is one of ``keys``,
    with no field beyond ``keys[type]``; another ``type`` is refused as unsupported
    (``supported`` says which are). Returns the type and the object."""
    part_obj = as_object(part, param)
    kind = required_str(part_obj, "type", param)
    if kind not in keys:
        raise ApiError.unsupported(f"{param}.type", kind, supported=supported)
    reject_unknown(part_obj, keys[kind], f"{param}.")
    return kind, part_obj


def message_list(obj: Mapping[str, object]) -> list[object]:
    """The required, non-empty ``messages`` array (its items unchecked)."""
    raw = obj.get("messages")
    if raw is None:
        raise ApiError.missing("messages")
    if not isinstance(raw, list):
        raise ApiError.invalid_type("messages", "an array of messages", raw)
    if not raw:
        raise ApiError.invalid("messages", "Invalid value for 'messages': must not be empty.")
    return raw


# ---- typed readers ---------------------------------------------------------------------------


def model_name(obj: Mapping[str, object]) -> str:
    """The required, non-empty ``model``."""
    value = obj.get("model")
    if value is None:
        raise ApiError.missing("model")
    if not isinstance(value, str):
        raise ApiError.invalid_type("model", "a string", value)
    if not value:
        raise ApiError.invalid("model", "Invalid value for 'model': must not be empty.")
    return value


def opt_int(obj: Mapping[str, object], name: str, *, lo: int, hi: int = INT64_MAX) -> int | None:
    """``obj[name]``: an integer in ``[lo, hi]``, or ``None`` when absent or null."""
    value = obj.get(name)
    if value is None:
        return None
    if not is_int(value):
        raise ApiError.invalid_type(name, "an integer", value)
    if not lo <= value <= hi:
        bound = f"at least {lo}" if value < lo else f"at most {hi}"
        raise ApiError.invalid(name, f"Invalid value for '{name}': {show(value)}; must be {bound}.")
    return value


def opt_number(
    obj: Mapping[str, object], name: str, *, lo: float, hi: float, lo_open: bool = False
) -> float | None:
    """``obj[name]``: a number in ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``), or ``None``."""
    value = obj.get(name)
    if value is None:
        return None
    if not is_number(value):
        raise ApiError.invalid_type(name, "a number", value)
    # Compare before float(): a huge JSON integer would overflow it. NaN fails every comparison.
    above_lo = lo < value if lo_open else lo <= value
    if not (above_lo and value <= hi):
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise ApiError.invalid(
            name, f"Invalid value for '{name}': {show(value)}; must be in {interval}."
        )
    return float(value)


def opt_bool(obj: Mapping[str, object], name: str, *, param: str | None = None) -> bool | None:
    """``obj[name]``: a boolean, or ``None`` (errors name ``param``, by default ``name``)."""
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ApiError.invalid_type(param or name, "a boolean", value)
    return value


def opt_str(obj: Mapping[str, object], name: str, param: str) -> str | None:
    """``obj[name]``: a string, or ``None``; errors name ``param``."""
    value = obj.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise ApiError.invalid_type(param, "a string", value)
    return value


def stop_list(value: list[object], param: str, limit: int) -> tuple[str, ...]:
    """An array of at most ``limit`` stop strings at ``param``."""
    if len(value) > limit:
        raise ApiError.invalid(
            param,
            f"Invalid value for '{param}': at most {limit} stop sequences "
            f"are allowed, got {len(value)}.",
        )
    return tuple(stop_string(item, f"{param}[{i}]") for i, item in enumerate(value))


def stop_string(value: object, param: str) -> str:
    """One stop string: 1 to :data:`MAX_STOP_LENGTH` characters."""
    if not isinstance(value, str):
        raise ApiError.invalid_type(param, "a string", value)
    if not value:
        # An empty stop string would end every generation before its first token.
        raise ApiError.invalid(param, f"Invalid value for '{param}': must not be empty.")
    if len(value) > MAX_STOP_LENGTH:
        raise ApiError.invalid(
            param,
            f"Invalid value for '{param}': at most {MAX_STOP_LENGTH} characters, got {len(value)}.",
        )
    return value


# ---- streaming (OpenAI's formats) ------------------------------------------------------------

STREAM_OPTION_FIELDS: dict[str, Schema] = {
    "include_usage": honoured(
        "A last chunk with empty choices carries the usage.", type=["boolean", "null"]
    ),
    # OpenAI pads stream chunks with random ``obfuscation`` text unless told not to; we never do.
    "include_obfuscation": no_op([False], "false"),
}
_STREAM_OPTIONS: dict[str, object] = dict(STREAM_OPTION_FIELDS)
#: What :func:`streaming` enforces across fields, as JSON Schema (the OpenAPI document's).
STREAM_OPTIONS_NEED_STREAM: Schema = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}


def streaming(
    obj: Mapping[str, object], options_known: Mapping[str, object] = _STREAM_OPTIONS
) -> tuple[bool, bool]:
    """``(stream, include_usage)`` of an OpenAI body; ``options_known``: the
    ``stream_options`` the format defines (Responses has no ``include_usage``)."""
    stream = bool(opt_bool(obj, "stream"))
    raw = obj.get("stream_options")
    if raw is None:
        return stream, False
    options = as_object(raw, "stream_options")
    if not stream:
        raise ApiError.invalid(
            "stream_options", "'stream_options' is only allowed when 'stream' is true."
        )
    reject_unknown(options, options_known, "stream_options.")
    FALSE("stream_options.include_obfuscation", options.get("include_obfuscation"))
    include_usage = opt_bool(options, "include_usage", param="stream_options.include_usage")
    return stream, bool(include_usage)


# ---- the shared honoured fields' schemas -----------------------------------------------------

MODEL = honoured("The model (a name the cluster serves).", type="string", minLength=1)
STOP_STRING: Schema = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH}
MAX_TOKENS: Schema = {"type": ["integer", "null"], "minimum": 1, "maximum": INT64_MAX}
#: The sampling fields OpenAI's and Anthropic's formats share (each format may narrow one:
#: Anthropic's temperature is 0 to 1).
SAMPLING: dict[str, Schema] = {
    "temperature": honoured(
        "0 to 2; 0 is greedy (default 1).", type=["number", "null"], minimum=0, maximum=2
    ),
    "top_p": honoured(
        "Nucleus sampling, in (0, 1] (default 1).",
        type=["number", "null"],
        exclusiveMinimum=0,
        maximum=1,
    ),
    "top_k": honoured(
        "An extension: sample from the k likeliest tokens; 0 (the default) is off.",
        type=["integer", "null"],
        minimum=0,
        maximum=INT64_MAX,
    ),
    "seed": honoured(
        "A signed 64-bit seed; absent means random.",
        type=["integer", "null"],
        minimum=INT64_MIN,
        maximum=INT64_MAX,
    ),
}
