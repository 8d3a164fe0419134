"""Validating OpenAI Chat Completions and Completions request bodies (sans-IO).

:func:`parse_chat_completions` and :func:`parse_completions` take whatever ``json.loads`` gave
(any JSON value) and either return a frozen request ready for the runner or raise
:class:`ApiError` (status 400, ``param`` naming the field). They never raise anything else.

Every top-level field falls in exactly one of these groups (the tables below):

* **honoured**: model, messages / prompt, max_tokens (+ chat's max_completion_tokens),
  temperature, top_p, top_k (our extension), seed, stop, stream, stream_options, n (1 to
  :data:`MAX_CHOICES`);
* **no-op only**: fields we cannot honour, accepted only with their default value
  (``presence_penalty: 0``, ``tools: []``, ...) and otherwise rejected with
  ``code="unsupported_parameter"``, never silently ignored;
* **informational**: ``user``, ``metadata``, ... accepted with any value of the right type,
  because they do not change what is generated;
* anything else is rejected as an unknown parameter, as OpenAI does.

``null`` always means "the default", for every optional field.

Numbers follow OpenAI's typing: a boolean is never a number, an integer is fine where a number
is expected, and a float (even ``2.0``) is rejected where an integer is expected.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TypeGuard

import attrs

from skulk.api._errors import ApiError, show
from skulk.api._openai_format import OpenAIFormat
from skulk.api._openai_tools import (
    ToolsFormat,
    parse_assistant_calls,
    parse_tool_choice,
    parse_tools,
)
from skulk.api._request import Format, GenerateRequest
from skulk.api._schema import INFORMATIONAL, Schema, honoured, no_op, nullable, obj, ref, typed
from skulk.api._structured import RESPONSE_FORMAT_SCHEMA, openai_response_format
from skulk.api._tool_calls import forced_params, tools_json
from skulk.wire.runner import (
    MAX_TOP_LOGPROBS,
    ChatMessage,
    ChatPrompt,
    SamplingParams,
    TextPrompt,
    ToolCall,
)

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for legacy completions (also used for an explicit null)."""

MAX_STOP_SEQUENCES = 4
#: The longest stop string (characters): the runner checks every one against the text it holds
#: back after every token, so a huge one would slow every stream of the runner.
MAX_STOP_LENGTH = 1024
#: The most choices (``n``) one request may ask for: each is its own generation on the runner
#: and takes its own admission place, so a bound keeps one request from filling an instance.
MAX_CHOICES = 8
#: The most alternatives legacy completions' ``logprobs`` may ask for (OpenAI's limit; chat's
#: ``top_logprobs`` goes to :data:`~skulk.wire.runner.MAX_TOP_LOGPROBS`).
MAX_COMPLETION_LOGPROBS = 5


@attrs.frozen
class ChatCompletionsRequest:
    """A validated ``POST /v1/chat/completions`` body.

    ``include_usage`` is ``stream_options.include_usage``: the stream ends with a usage-only
    chunk and every other chunk carries ``"usage": null``. A non-streaming response always has
    usage. ``n``: how many choices (:mod:`skulk.api._choices`).
    """

    model: str
    prompt: ChatPrompt
    params: SamplingParams
    stream: bool
    include_usage: bool
    n: int = 1
    tools: bool = False  # tools offered and tool_choice not "none": the answer may call them

    def generate_request(self) -> GenerateRequest:
        """The format-neutral request the router and the stream driver take."""
        logprobs = self.params.logprobs is not None
        fmt: Format = OpenAIFormat("chat", self.include_usage, self.n, logprobs)
        if self.tools:
            fmt = ToolsFormat(self.include_usage)
        return GenerateRequest(self.model, self.prompt, self.params, self.stream, fmt)


@attrs.frozen
class CompletionsRequest:
    """A validated ``POST /v1/completions`` body (see :class:`ChatCompletionsRequest`)."""

    model: str
    prompt: TextPrompt
    params: SamplingParams
    stream: bool
    include_usage: bool
    n: int = 1

    def generate_request(self) -> GenerateRequest:
        """The format-neutral request the router and the stream driver take."""
        logprobs = self.params.logprobs is not None
        fmt = OpenAIFormat("completion", self.include_usage, self.n, logprobs)
        return GenerateRequest(self.model, self.prompt, self.params, self.stream, fmt)


# ---- small typed readers ---------------------------------------------------------------------


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _has_type(value: object, types: tuple[type, ...]) -> bool:
    if isinstance(value, bool):  # bool is an int subclass; JSON keeps them apart
        return bool in types or object in types
    return isinstance(value, types)


def _opt_int(body: Mapping[str, object], name: str, *, lo: int, hi: int = INT64_MAX) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise ApiError.invalid_type(name, "an integer", value)
    if not lo <= value <= hi:
        bound = f"at least {lo}" if value < lo else f"at most {hi}"
        raise ApiError.invalid(name, f"Invalid value for '{name}': {show(value)}; must be {bound}.")
    return value


def _opt_number(
    body: Mapping[str, object], name: str, *, lo: float, hi: float, lo_open: bool = False
) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_number(value):
        raise ApiError.invalid_type(name, "a number", value)
    # Compare before float(): a huge JSON integer would overflow it. NaN fails every comparison.
    above_lo = lo < value if lo_open else lo <= value
    if not (above_lo and value <= hi):
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise ApiError.invalid(
            name, f"Invalid value for '{name}': {show(value)}; must be in {interval}."
        )
    return float(value)


def _opt_bool(body: Mapping[str, object], name: str, *, param: str | None = None) -> bool | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, bool):
        raise ApiError.invalid_type(param or name, "a boolean", value)
    return value


def _object(value: object, param: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise ApiError.invalid_type(param, "an object", value)
    return value


def _reject_unknown(keys: Iterable[object], known: Mapping[str, object], prefix: str) -> None:
    for key in keys:
        if key not in known:
            raise ApiError.unknown_parameter(f"{prefix}{key}")


# ---- no-op-only and informational fields -----------------------------------------------------


@attrs.frozen
class _Check:
    """How a parser checks one field (``check(param, value)`` raises :class:`ApiError`), and
    the JSON Schema of the values it lets through: one object for both, so the OpenAPI document
    (:mod:`skulk.api._openapi`) says what the parser does (:mod:`skulk.api._schema`)."""

    check: Callable[[str, object], None]
    schema: Schema

    def __call__(self, param: str, value: object) -> None:
        self.check(param, value)


def _only(*allowed: object, types: tuple[type, ...] = (object,), expected: str = "") -> _Check:
    """A field accepted only with one of ``allowed`` (or null); other values of the right type
    are well-formed requests we cannot honour."""
    supported = " or ".join([show(a) for a in allowed] + ["null"])

    def check(param: str, value: object) -> None:
        if value is None:
            return
        if not _has_type(value, types):
            raise ApiError.invalid_type(param, expected, value)
        if not any(value == a for a in allowed):
            raise ApiError.unsupported(param, value, supported=supported)

    return _Check(check, no_op(allowed, supported))


def _info(types: tuple[type, ...], expected: str) -> _Check:
    """A field that does not change what is generated: any value of the right type."""

    def check(param: str, value: object) -> None:
        if value is not None and not _has_type(value, types):
            raise ApiError.invalid_type(param, expected, value)

    return _Check(check, typed(types, INFORMATIONAL))


def _check_metadata(param: str, value: object) -> None:
    if value is None:
        return
    for key, item in _object(value, param).items():
        if not isinstance(item, str):
            raise ApiError.invalid_type(f"{param}.{key}", "a string", item)


_METADATA = _Check(
    _check_metadata,
    typed((dict,), f"{INFORMATIONAL} String values.", additionalProperties={"type": "string"}),
)


_NULL_ONLY = _only()
_ZERO = _only(0, types=(int, float), expected="a number")
_FALSE = _only(False, types=(bool,), expected="a boolean")
_ONE = _only(1, types=(int,), expected="an integer")
_STRING = _info((str,), "a string")

_COMMON_NO_OPS: dict[str, _Check] = {
    "presence_penalty": _ZERO,
    "frequency_penalty": _ZERO,
    "logit_bias": _only({}, types=(dict,), expected="an object"),
}

_CHAT_NO_OPS: dict[str, _Check] = {
    **_COMMON_NO_OPS,
    "functions": _only([], types=(list,), expected="an array"),
    "function_call": _only("none", types=(str, dict), expected="a string or an object"),
    "audio": _NULL_ONLY,
    "prediction": _NULL_ONLY,
    "modalities": _only(["text"], types=(list,), expected="an array"),
    "reasoning_effort": _NULL_ONLY,
    "verbosity": _only("medium", types=(str,), expected="a string"),
    "service_tier": _only("auto", "default", types=(str,), expected="a string"),
    "store": _FALSE,
    "web_search_options": _NULL_ONLY,
    "moderation": _NULL_ONLY,
    "prompt_cache_retention": _NULL_ONLY,
    "prompt_cache_options": _only({}, types=(dict,), expected="an object"),
}

_CHAT_INFO: dict[str, _Check] = {
    "user": _STRING,
    "safety_identifier": _STRING,
    # A routing hint for OpenAI's prefix cache; ours caches (or not) regardless of it.
    "prompt_cache_key": _STRING,
    "metadata": _METADATA,
    "parallel_tool_calls": _info((bool,), "a boolean"),
}

_COMPLETIONS_NO_OPS: dict[str, _Check] = {
    **_COMMON_NO_OPS,
    "echo": _FALSE,
    "best_of": _ONE,
    "suffix": _only("", types=(str,), expected="a string"),
}

_COMPLETIONS_INFO: dict[str, _Check] = {"user": _STRING}

# The honoured fields, each with the JSON Schema of what it accepts (its checks are the
# functions below): the OpenAPI document is built from these tables (see _schema.py).
_MODEL = honoured("The model (a name the cluster serves).", type="string", minLength=1)
_STOP_STRING: Schema = {"type": "string", "minLength": 1, "maxLength": MAX_STOP_LENGTH}
_MAX_TOKENS: Schema = {"type": ["integer", "null"], "minimum": 1, "maximum": INT64_MAX}
_SAMPLING: dict[str, Schema] = {
    "n": honoured(
        f"How many choices to generate, 1 to {MAX_CHOICES} (default 1), each its own generation "
        "of the prompt; with a seed, choice 0 uses it and choice i a seed derived from "
        "(seed, i).",
        type=["integer", "null"],
        minimum=1,
        maximum=MAX_CHOICES,
    ),
    "max_tokens": honoured(
        "The most tokens to generate (chat: absent means up to the context; completions: "
        f"absent means {COMPLETIONS_DEFAULT_MAX_TOKENS}).",
        **_MAX_TOKENS,
    ),
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
    "stop": honoured(
        f"A string or up to {MAX_STOP_SEQUENCES}, each 1 to {MAX_STOP_LENGTH} characters; "
        "generation ends before one, which is not emitted.",
        anyOf=[
            _STOP_STRING,
            {"type": "array", "items": _STOP_STRING, "maxItems": MAX_STOP_SEQUENCES},
            {"type": "null"},
        ],
    ),
}
_STREAM_OPTION_FIELDS: dict[str, Schema] = {
    "include_usage": honoured(
        "A last chunk with empty choices carries the usage.", type=["boolean", "null"]
    ),
    # OpenAI pads stream chunks with random ``obfuscation`` text unless told not to; we never do.
    "include_obfuscation": no_op([False], "false"),
}
_STREAMING: dict[str, Schema] = {
    "stream": honoured(
        "Server-sent events (text/event-stream), ending with data: [DONE].",
        type=["boolean", "null"],
    ),
    "stream_options": honoured(
        "Only with stream: true.", anyOf=[obj(_STREAM_OPTION_FIELDS), {"type": "null"}]
    ),
}
_CHAT_HONOURED: dict[str, Schema] = {
    "model": _MODEL,
    "messages": honoured(
        "The conversation, rendered through the model's chat template.",
        type="array",
        minItems=1,
        items=ref("ChatMessage"),
    ),
    "tools": honoured(
        "Function tools, rendered through the model's chat template (or the documented "
        "fallback system turn); calls are read from the answer (see docs/api.md).",
        type=["array", "null"],
        items={
            "type": "object",
            "properties": {
                "type": {"const": "function"},
                "function": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                        "description": {"type": ["string", "null"]},
                        "parameters": {"type": ["object", "null"]},
                        "strict": {"type": ["boolean", "null"]},
                    },
                    "required": ["name"],
                    "additionalProperties": False,
                },
            },
            "required": ["type", "function"],
            "additionalProperties": False,
        },
    ),
    "tool_choice": honoured(
        '"none" (no tools shown), "auto" (the default with tools), "required" or '
        '{"type": "function", "function": {"name"}}: the last two force one call whose '
        "arguments are valid for the tool's parameters (constrained decoding).",
        anyOf=[
            {"enum": ["none", "auto", "required"]},
            {
                "type": "object",
                "properties": {
                    "type": {"const": "function"},
                    "function": {
                        "type": "object",
                        "properties": {"name": {"type": "string"}},
                        "required": ["name"],
                    },
                },
                "required": ["type", "function"],
            },
            {"type": "null"},
        ],
    ),
    "response_format": honoured(
        'Structured output: {"type": "text"} (the default), {"type": "json_object"} or '
        '{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}; enforced by '
        "constrained decoding (strict false too). A schema feature the grammar engine cannot "
        "enforce is a 400 naming it.",
        **RESPONSE_FORMAT_SCHEMA,
    ),
    "max_completion_tokens": honoured(
        "The newer name of max_tokens (both may be sent only with the same value).",
        **_MAX_TOKENS,
    ),
    "logprobs": honoured(
        "Each output token's log-probability (the log-softmax of the model's logits, before "
        "temperature, top_p and top_k) in choices[].logprobs.content.",
        type=["boolean", "null"],
    ),
    "top_logprobs": honoured(
        f"0 to {MAX_TOP_LOGPROBS}: that many likeliest alternatives per token; needs logprobs.",
        type=["integer", "null"],
        minimum=0,
        maximum=MAX_TOP_LOGPROBS,
    ),
    **_SAMPLING,
    **_STREAMING,
}
_COMPLETIONS_HONOURED: dict[str, Schema] = {
    "model": _MODEL,
    "prompt": honoured(
        "One text prompt, tokenized as is (several prompts and token ids are refused).",
        anyOf=[
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
        ],
    ),
    "logprobs": honoured(
        f"0 to {MAX_COMPLETION_LOGPROBS}: each output token's log-probability and that many "
        "likeliest alternatives (the sampled token is always listed too) in "
        "choices[].logprobs.",
        type=["integer", "null"],
        minimum=0,
        maximum=MAX_COMPLETION_LOGPROBS,
    ),
    **_SAMPLING,
    **_STREAMING,
}

_CHAT_FIELDS: dict[str, object] = dict.fromkeys([*_CHAT_HONOURED, *_CHAT_NO_OPS, *_CHAT_INFO])
_COMPLETIONS_FIELDS: dict[str, object] = dict.fromkeys(
    [*_COMPLETIONS_HONOURED, *_COMPLETIONS_NO_OPS, *_COMPLETIONS_INFO]
)


def _run_checks(body: Mapping[str, object], checks: Mapping[str, _Check]) -> None:
    for name, check in checks.items():
        if name in body:
            check(name, body[name])


# ---- honoured fields -------------------------------------------------------------------------


def _body(body: object, known: Mapping[str, object]) -> dict[str, object]:
    if not isinstance(body, dict):
        raise ApiError.bad_body()
    _reject_unknown(body, known, "")
    return body


def _model(body: Mapping[str, object]) -> str:
    model = body.get("model")
    if model is None:
        raise ApiError.missing("model")
    if not isinstance(model, str):
        raise ApiError.invalid_type("model", "a string", model)
    if not model:
        raise ApiError.invalid("model", "Invalid value for 'model': must not be empty.")
    return model


def _stop(body: Mapping[str, object]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (_stop_string(value, "stop"),)
    if not isinstance(value, list):
        raise ApiError.invalid_type("stop", "a string, an array of strings or null", value)
    return _stop_list(value, "stop", MAX_STOP_SEQUENCES)


def _stop_list(value: list[object], param: str, limit: int) -> tuple[str, ...]:
    """An array of at most ``limit`` stop strings at ``param``."""
    if len(value) > limit:
        raise ApiError.invalid(
            param,
            f"Invalid value for '{param}': at most {limit} stop sequences "
            f"are allowed, got {len(value)}.",
        )
    return tuple(_stop_string(item, f"{param}[{i}]") for i, item in enumerate(value))


def _stop_string(value: object, param: str) -> str:
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


def _sampling(
    body: Mapping[str, object], *, default_max_tokens: int | None, chat: bool
) -> SamplingParams:
    max_tokens = _opt_int(body, "max_tokens", lo=1)
    if chat:
        # The newer name; OpenAI still accepts both. Two different values are ambiguous.
        completion_tokens = _opt_int(body, "max_completion_tokens", lo=1)
        if completion_tokens is not None:
            if max_tokens is not None and max_tokens != completion_tokens:
                raise ApiError.invalid(
                    "max_completion_tokens",
                    "'max_tokens' and 'max_completion_tokens' disagree "
                    f"({max_tokens} vs {completion_tokens}); set only one of them.",
                )
            max_tokens = completion_tokens
    temperature = _opt_number(body, "temperature", lo=0, hi=2)
    top_p = _opt_number(body, "top_p", lo=0, hi=1, lo_open=True)
    top_k = _opt_int(body, "top_k", lo=0)
    return SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=0 if top_k is None else top_k,
        seed=_opt_int(body, "seed", lo=INT64_MIN),
        max_tokens=default_max_tokens if max_tokens is None else max_tokens,
        stop=_stop(body),
    )


_STREAM_OPTIONS: dict[str, object] = dict(_STREAM_OPTION_FIELDS)
#: What :func:`_streaming` enforces across fields, as JSON Schema (the OpenAPI document's).
STREAM_OPTIONS_NEED_STREAM: Schema = {
    "if": {"required": ["stream_options"], "properties": {"stream_options": {"type": "object"}}},
    "then": {"required": ["stream"], "properties": {"stream": {"const": True}}},
}
_NO_OBFUSCATION = _only(False, types=(bool,), expected="a boolean")


def _streaming(
    body: Mapping[str, object], options_known: Mapping[str, object] = _STREAM_OPTIONS
) -> tuple[bool, bool]:
    """``(stream, include_usage)``; ``options_known``: the ``stream_options`` the format
    defines (Responses has no ``include_usage``)."""
    stream = bool(_opt_bool(body, "stream"))
    raw = body.get("stream_options")
    if raw is None:
        return stream, False
    options = _object(raw, "stream_options")
    if not stream:
        raise ApiError.invalid(
            "stream_options", "'stream_options' is only allowed when 'stream' is true."
        )
    _reject_unknown(options, options_known, "stream_options.")
    param = "stream_options.include_obfuscation"
    _NO_OBFUSCATION(param, options.get("include_obfuscation"))
    include_usage = _opt_bool(options, "include_usage", param="stream_options.include_usage")
    return stream, bool(include_usage)


# ---- messages --------------------------------------------------------------------------------

_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
}
_SUPPORTED_ROLES = '"system", "developer", "user", "assistant" or "tool"'
_UNSUPPORTED_ROLES = {"function"}  # the deprecated form of tool calls

_COMMON_MESSAGE_KEYS = ("role", "content", "name")
_MESSAGE_KEYS: dict[str, dict[str, object]] = {
    "system": dict.fromkeys(_COMMON_MESSAGE_KEYS),
    "user": dict.fromkeys(_COMMON_MESSAGE_KEYS),
    "assistant": dict.fromkeys(
        [*_COMMON_MESSAGE_KEYS, "refusal", "audio", "function_call", "tool_calls"]
    ),
    "tool": dict.fromkeys(("role", "content", "tool_call_id")),
}
_ASSISTANT_NO_OPS: dict[str, _Check] = {
    "function_call": _NULL_ONLY,
    "refusal": _NULL_ONLY,
    "audio": _NULL_ONLY,
}
_TEXT_PART_KEYS: dict[str, Schema] = {
    "type": {"const": "text"},
    "text": {"type": "string"},
    "prompt_cache_breakpoint": _NULL_ONLY.schema,
}
_TEXT_CONTENT: Schema = {
    "anyOf": [
        {"type": "string"},
        {
            "type": "array",
            "minItems": 1,
            "items": obj(_TEXT_PART_KEYS, required=("type", "text")),
        },
    ],
    "description": "A string, or text parts joined as written.",
}
_NAME = typed((str,), "Informational: which participant spoke.")
#: The shared schemas of the request bodies above (``components.schemas`` in the OpenAPI
#: document); ``tests/unit/test_openapi.py`` checks them against ``_MESSAGE_KEYS``.
SCHEMAS: dict[str, Schema] = {
    "ChatMessage": {
        "anyOf": [
            obj(
                {
                    "role": {"enum": ["system", "developer", "user"]},
                    "content": _TEXT_CONTENT,
                    "name": _NAME,
                },
                required=("role", "content"),
                description="developer is taken as system. Role function is refused (400).",
            ),
            obj(
                {
                    "role": {"const": "assistant"},
                    "content": nullable(_TEXT_CONTENT),
                    "name": _NAME,
                    "tool_calls": {
                        "type": ["array", "null"],
                        "description": 'Calls it made: [{"id", "type": "function", '
                        '"function": {"name", "arguments"}}], arguments as JSON text.',
                    },
                    **{key: check.schema for key, check in _ASSISTANT_NO_OPS.items()},
                },
                required=("role",),
            ),
            obj(
                {
                    "role": {"const": "tool"},
                    "content": _TEXT_CONTENT,
                    "tool_call_id": {"type": "string"},
                },
                required=("role", "content", "tool_call_id"),
            ),
        ]
    }
}


def _required_str(obj: Mapping[str, object], key: str, param: str) -> str:
    """``obj[key]``, which must be a string; errors name ``{param}.{key}``."""
    value = obj.get(key)
    if value is None:
        raise ApiError.missing(f"{param}.{key}")
    if not isinstance(value, str):
        raise ApiError.invalid_type(f"{param}.{key}", "a string", value)
    return value


def _typed_part(
    part: object, param: str, keys: Mapping[str, Mapping[str, object]], supported: str
) -> tuple[str, dict[str, object]]:
    """A content part (or block) at ``param``: an object whose ``type`` is one of ``keys``,
    with no field beyond ``keys[type]``; another ``type`` is refused as unsupported
    (``supported`` says which are). Returns the type and the object."""
    obj = _object(part, param)
    kind = _required_str(obj, "type", param)
    if kind not in keys:
        raise ApiError.unsupported(f"{param}.type", kind, supported=supported)
    _reject_unknown(obj, keys[kind], f"{param}.")
    return kind, obj


def _text_part(part: object, param: str) -> str:
    _, obj = _typed_part(part, param, {"text": _TEXT_PART_KEYS}, '"text" content parts')
    _NULL_ONLY(f"{param}.prompt_cache_breakpoint", obj.get("prompt_cache_breakpoint"))
    return _required_str(obj, "text", param)


def _content(message: Mapping[str, object], param: str, *, optional: bool) -> str:
    content = message.get("content")
    if content is None:
        if optional:
            return ""
        raise ApiError.missing(param)
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError.invalid_type(param, "a string or an array of content parts", content)
    if not content:
        raise ApiError.invalid(param, f"Invalid value for '{param}': must not be an empty array.")
    # Parts are joined as written: a client that splits text into parts chose where to split.
    return "".join(_text_part(part, f"{param}[{j}]") for j, part in enumerate(content))


def _message(raw: object, param: str) -> ChatMessage:
    message = _object(raw, param)
    role = message.get("role")
    if role is None:
        raise ApiError.missing(f"{param}.role")
    if not isinstance(role, str):
        raise ApiError.invalid_type(f"{param}.role", "a string", role)
    if role in _UNSUPPORTED_ROLES:
        raise ApiError.unsupported(f"{param}.role", role, supported=_SUPPORTED_ROLES)
    mapped = _ROLES.get(role)
    if mapped is None:
        raise ApiError.invalid(
            f"{param}.role",
            f"Invalid value for '{param}.role': {show(role)}; expected {_SUPPORTED_ROLES}.",
        )
    _reject_unknown(message, _MESSAGE_KEYS[mapped], f"{param}.")
    _STRING(f"{param}.name", message.get("name"))  # informational: which participant spoke
    calls: tuple[ToolCall, ...] = ()
    if mapped == "assistant":
        for key, check in _ASSISTANT_NO_OPS.items():
            check(f"{param}.{key}", message.get(key))
        calls = parse_assistant_calls(message.get("tool_calls"), f"{param}.tool_calls")
    call_id = None
    if mapped == "tool":
        call_id = _required_str(message, "tool_call_id", param)
    # An assistant turn may have null content (OpenAI allows it); it means an empty turn.
    content = _content(message, f"{param}.content", optional=mapped == "assistant")
    return ChatMessage(role=mapped, content=content, tool_calls=calls, tool_call_id=call_id)


def _message_list(body: Mapping[str, object]) -> list[object]:
    """The required, non-empty ``messages`` array (its items unchecked)."""
    raw = body.get("messages")
    if raw is None:
        raise ApiError.missing("messages")
    if not isinstance(raw, list):
        raise ApiError.invalid_type("messages", "an array of messages", raw)
    if not raw:
        raise ApiError.invalid("messages", "Invalid value for 'messages': must not be empty.")
    return raw


def _messages(body: Mapping[str, object]) -> ChatPrompt:
    raw = _message_list(body)
    return ChatPrompt(tuple(_message(m, f"messages[{i}]") for i, m in enumerate(raw)))


# ---- prompt (legacy completions) -------------------------------------------------------------


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(_is_int(t) for t in value)


def _prompt(body: Mapping[str, object]) -> TextPrompt:
    value = body.get("prompt")
    if value is None:
        raise ApiError.missing("prompt")
    if isinstance(value, str):
        return TextPrompt(value)
    if isinstance(value, list):
        if len(value) == 1 and isinstance(value[0], str):
            return TextPrompt(value[0])
        if not value:
            raise ApiError.invalid("prompt", "Invalid value for 'prompt': must not be empty.")
        if all(isinstance(p, str) for p in value):
            raise ApiError.unsupported("prompt", value, supported="one prompt per request")
        if _is_token_ids(value) or all(_is_token_ids(p) for p in value):
            raise ApiError.unsupported("prompt", value, supported="text prompts, not token ids")
    raise ApiError.invalid_type("prompt", "a string or an array of one string", value)


def _chat_logprobs(body: Mapping[str, object]) -> int | None:
    """``SamplingParams.logprobs`` for chat: ``top_logprobs`` (0 when absent) when
    ``logprobs`` is true, else ``None``; a non-zero ``top_logprobs`` without it is refused
    (as OpenAI does)."""
    wanted = _opt_bool(body, "logprobs")
    top = _opt_int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if top and not wanted:
        raise ApiError.invalid(
            "top_logprobs", "'top_logprobs' is only allowed when 'logprobs' is true."
        )
    return (top or 0) if wanted else None


def _choices(body: Mapping[str, object]) -> int:
    """``n``: 1 to :data:`MAX_CHOICES` (absent or null: 1)."""
    n = _opt_int(body, "n", lo=1, hi=MAX_CHOICES)
    return 1 if n is None else n


# ---- entry points ----------------------------------------------------------------------------


def parse_chat_completions(body: object) -> ChatCompletionsRequest:
    """Validate a ``POST /v1/chat/completions`` body (the result of ``json.loads``).

    Raises :class:`ApiError` (400) naming the first offending field; nothing else. Checks run
    in a fixed order (unknown fields, model, messages, no-op fields, sampling, streaming), so
    the same body always gets the same error. ``developer`` messages become ``system``; text
    content parts are concatenated. ``max_tokens`` absent means "up to the context limit".
    """
    obj = _body(body, _CHAT_FIELDS)
    model = _model(obj)
    prompt = _messages(obj)
    _run_checks(obj, _CHAT_NO_OPS)
    _run_checks(obj, _CHAT_INFO)
    n = _choices(obj)
    params = _sampling(obj, default_max_tokens=None, chat=True)
    params = attrs.evolve(params, logprobs=_chat_logprobs(obj))
    schema = openai_response_format(obj.get("response_format"))
    if schema is not None:
        params = attrs.evolve(params, json_schema=schema)
    tools = parse_tools(obj.get("tools"))
    choice = parse_tool_choice(obj.get("tool_choice"), tools)
    if choice != "none":
        _tools_alone(schema is not None and choice != "auto", n, params.logprobs is not None)
        params = forced_params(params, tools, choice, "tools")
        prompt = attrs.evolve(prompt, tools=tools_json(tools))
    stream, include_usage = _streaming(obj)
    return ChatCompletionsRequest(
        model=model,
        prompt=prompt,
        params=params,
        stream=stream,
        include_usage=include_usage,
        n=n,
        tools=choice != "none",
    )


def _tools_alone(forced_with_schema: bool, n: int, logprobs: bool) -> None:
    """What a request that may call tools cannot combine with (400 naming it)."""
    if forced_with_schema:
        raise ApiError.invalid(
            "tool_choice", "A forced tool call cannot be combined with response_format."
        )
    if n != 1:
        raise ApiError.unsupported("n", n, supported="1 when tools may be called")
    if logprobs:
        raise ApiError.unsupported("logprobs", True, supported="false when tools may be called")


def parse_completions(body: object) -> CompletionsRequest:
    """Validate a ``POST /v1/completions`` body (the result of ``json.loads``).

    As :func:`parse_chat_completions`; ``prompt`` is a string or an array of exactly one string
    (several prompts and token-id prompts are rejected as unsupported). ``max_tokens`` absent or
    null means :data:`COMPLETIONS_DEFAULT_MAX_TOKENS` (16), OpenAI's default for this endpoint.
    """
    obj = _body(body, _COMPLETIONS_FIELDS)
    model = _model(obj)
    prompt = _prompt(obj)
    _run_checks(obj, _COMPLETIONS_NO_OPS)
    _run_checks(obj, _COMPLETIONS_INFO)
    n = _choices(obj)
    params = _sampling(obj, default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS, chat=False)
    logprobs = _opt_int(obj, "logprobs", lo=0, hi=MAX_COMPLETION_LOGPROBS)
    params = attrs.evolve(params, logprobs=logprobs)
    stream, include_usage = _streaming(obj)
    return CompletionsRequest(
        model=model, prompt=prompt, params=params, stream=stream, include_usage=include_usage, n=n
    )
