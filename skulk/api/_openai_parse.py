"""Validating OpenAI Chat Completions and Completions request bodies (sans-IO).

:func:`parse_chat_completions` and :func:`parse_completions` take whatever ``json.loads`` gave
(any JSON value) and either return a frozen request ready for the runner or raise
:class:`ApiError` (status 400, ``param`` naming the field). They never raise anything else.

Every top-level field falls in exactly one of these groups (the tables below):

* **honoured**: model, messages / prompt, max_tokens (+ chat's max_completion_tokens),
  temperature, top_p, top_k (our extension), seed, stop, stream, stream_options;
* **no-op only**: fields we cannot honour, accepted only with their default value (``n: 1``,
  ``presence_penalty: 0``, ``tools: []``, ...) and otherwise rejected with
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

from skulk.api._openai_errors import ApiError, _show
from skulk.wire.runner import ChatMessage, ChatPrompt, SamplingParams, TextPrompt

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for legacy completions (also used for an explicit null)."""

MAX_STOP_SEQUENCES = 4
#: The longest stop string (characters): the runner checks every one against the text it holds
#: back after every token, so a huge one would slow every stream of the runner.
MAX_STOP_LENGTH = 1024


@attrs.frozen
class ChatCompletionsRequest:
    """A validated ``POST /v1/chat/completions`` body.

    ``include_usage`` is ``stream_options.include_usage``: the stream ends with a usage-only
    chunk and every other chunk carries ``"usage": null``. A non-streaming response always has
    usage.
    """

    model: str
    prompt: ChatPrompt
    params: SamplingParams
    stream: bool
    include_usage: bool


@attrs.frozen
class CompletionsRequest:
    """A validated ``POST /v1/completions`` body (see :class:`ChatCompletionsRequest`)."""

    model: str
    prompt: TextPrompt
    params: SamplingParams
    stream: bool
    include_usage: bool


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
        raise ApiError.invalid(
            name, f"Invalid value for '{name}': {_show(value)}; must be {bound}."
        )
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
            name, f"Invalid value for '{name}': {_show(value)}; must be in {interval}."
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

_Check = Callable[[str, object], None]


def _only(*allowed: object, types: tuple[type, ...] = (object,), expected: str = "") -> _Check:
    """A field accepted only with one of ``allowed`` (or null); other values of the right type
    are well-formed requests we cannot honour."""
    supported = " or ".join([_show(a) for a in allowed] + ["null"])

    def check(param: str, value: object) -> None:
        if value is None:
            return
        if not _has_type(value, types):
            raise ApiError.invalid_type(param, expected, value)
        if not any(value == a for a in allowed):
            raise ApiError.unsupported(param, value, supported=supported)

    return check


def _info(types: tuple[type, ...], expected: str) -> _Check:
    """A field that does not change what is generated: any value of the right type."""

    def check(param: str, value: object) -> None:
        if value is not None and not _has_type(value, types):
            raise ApiError.invalid_type(param, expected, value)

    return check


def _check_metadata(param: str, value: object) -> None:
    if value is None:
        return
    for key, item in _object(value, param).items():
        if not isinstance(item, str):
            raise ApiError.invalid_type(f"{param}.{key}", "a string", item)


_NULL_ONLY = _only()
_ZERO = _only(0, types=(int, float), expected="a number")
_FALSE = _only(False, types=(bool,), expected="a boolean")
_ONE = _only(1, types=(int,), expected="an integer")
_STRING = _info((str,), "a string")

_COMMON_NO_OPS: dict[str, _Check] = {
    "n": _ONE,
    "presence_penalty": _ZERO,
    "frequency_penalty": _ZERO,
    "logit_bias": _only({}, types=(dict,), expected="an object"),
}

_CHAT_NO_OPS: dict[str, _Check] = {
    **_COMMON_NO_OPS,
    "logprobs": _FALSE,
    "top_logprobs": _only(0, types=(int,), expected="an integer"),
    "tools": _only([], types=(list,), expected="an array"),
    "tool_choice": _only("none", types=(str, dict), expected="a string or an object"),
    "functions": _only([], types=(list,), expected="an array"),
    "function_call": _only("none", types=(str, dict), expected="a string or an object"),
    "response_format": _only({"type": "text"}, types=(dict,), expected="an object"),
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
    "metadata": _check_metadata,
    "parallel_tool_calls": _info((bool,), "a boolean"),
}

_COMPLETIONS_NO_OPS: dict[str, _Check] = {
    **_COMMON_NO_OPS,
    "logprobs": _only(0, types=(int,), expected="an integer"),
    "echo": _FALSE,
    "best_of": _ONE,
    "suffix": _only("", types=(str,), expected="a string"),
}

_COMPLETIONS_INFO: dict[str, _Check] = {"user": _STRING}

_SAMPLING = ("max_tokens", "temperature", "top_p", "top_k", "seed", "stop")
_STREAMING = ("stream", "stream_options")
_CHAT_HONOURED = ("model", "messages", "max_completion_tokens", *_SAMPLING, *_STREAMING)
_COMPLETIONS_HONOURED = ("model", "prompt", *_SAMPLING, *_STREAMING)

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
    if len(value) > MAX_STOP_SEQUENCES:
        raise ApiError.invalid(
            "stop",
            f"Invalid value for 'stop': at most {MAX_STOP_SEQUENCES} stop sequences "
            f"are allowed, got {len(value)}.",
        )
    return tuple(_stop_string(item, f"stop[{i}]") for i, item in enumerate(value))


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


_STREAM_OPTIONS: dict[str, object] = dict.fromkeys(["include_usage", "include_obfuscation"])
# OpenAI pads stream chunks with random ``obfuscation`` text unless told not to; we never do.
_NO_OBFUSCATION = _only(False, types=(bool,), expected="a boolean")


def _streaming(body: Mapping[str, object]) -> tuple[bool, bool]:
    """``(stream, include_usage)``."""
    stream = bool(_opt_bool(body, "stream"))
    raw = body.get("stream_options")
    if raw is None:
        return stream, False
    options = _object(raw, "stream_options")
    if not stream:
        raise ApiError.invalid(
            "stream_options", "'stream_options' is only allowed when 'stream' is true."
        )
    _reject_unknown(options, _STREAM_OPTIONS, "stream_options.")
    param = "stream_options.include_obfuscation"
    _NO_OBFUSCATION(param, options.get("include_obfuscation"))
    include_usage = _opt_bool(options, "include_usage", param="stream_options.include_usage")
    return stream, bool(include_usage)


# ---- messages --------------------------------------------------------------------------------

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_SUPPORTED_ROLES = '"system", "developer", "user" or "assistant"'
_UNSUPPORTED_ROLES = {"tool", "function"}  # until tool calling exists

_COMMON_MESSAGE_KEYS = ("role", "content", "name")
_MESSAGE_KEYS: dict[str, dict[str, object]] = {
    "system": dict.fromkeys(_COMMON_MESSAGE_KEYS),
    "user": dict.fromkeys(_COMMON_MESSAGE_KEYS),
    "assistant": dict.fromkeys(
        [*_COMMON_MESSAGE_KEYS, "refusal", "audio", "function_call", "tool_calls"]
    ),
}
_ASSISTANT_NO_OPS: dict[str, _Check] = {
    "tool_calls": _only([], types=(list,), expected="an array"),
    "function_call": _NULL_ONLY,
    "refusal": _NULL_ONLY,
    "audio": _NULL_ONLY,
}
_TEXT_PART_KEYS: dict[str, object] = dict.fromkeys(["type", "text", "prompt_cache_breakpoint"])


def _text_part(part: object, param: str) -> str:
    obj = _object(part, param)
    kind = obj.get("type")
    if kind is None:
        raise ApiError.missing(f"{param}.type")
    if not isinstance(kind, str):
        raise ApiError.invalid_type(f"{param}.type", "a string", kind)
    if kind != "text":
        raise ApiError.unsupported(f"{param}.type", kind, supported='"text" content parts')
    _reject_unknown(obj, _TEXT_PART_KEYS, f"{param}.")
    _NULL_ONLY(f"{param}.prompt_cache_breakpoint", obj.get("prompt_cache_breakpoint"))
    text = obj.get("text")
    if text is None:
        raise ApiError.missing(f"{param}.text")
    if not isinstance(text, str):
        raise ApiError.invalid_type(f"{param}.text", "a string", text)
    return text


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
            f"Invalid value for '{param}.role': {_show(role)}; expected {_SUPPORTED_ROLES}.",
        )
    _reject_unknown(message, _MESSAGE_KEYS[mapped], f"{param}.")
    _STRING(f"{param}.name", message.get("name"))  # informational: which participant spoke
    if mapped == "assistant":
        for key, check in _ASSISTANT_NO_OPS.items():
            check(f"{param}.{key}", message.get(key))
    # An assistant turn may have null content (OpenAI allows it); it means an empty turn.
    content = _content(message, f"{param}.content", optional=mapped == "assistant")
    return ChatMessage(role=mapped, content=content)


def _messages(body: Mapping[str, object]) -> ChatPrompt:
    raw = body.get("messages")
    if raw is None:
        raise ApiError.missing("messages")
    if not isinstance(raw, list):
        raise ApiError.invalid_type("messages", "an array of messages", raw)
    if not raw:
        raise ApiError.invalid("messages", "Invalid value for 'messages': must not be empty.")
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
    params = _sampling(obj, default_max_tokens=None, chat=True)
    stream, include_usage = _streaming(obj)
    return ChatCompletionsRequest(
        model=model, prompt=prompt, params=params, stream=stream, include_usage=include_usage
    )


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
    params = _sampling(obj, default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS, chat=False)
    stream, include_usage = _streaming(obj)
    return CompletionsRequest(
        model=model, prompt=prompt, params=params, stream=stream, include_usage=include_usage
    )
