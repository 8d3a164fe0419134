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

from collections.abc import Mapping

import attrs

from skulk.api._errors import ApiError
from skulk.api._fields import (
    FALSE,
    INT64_MIN,
    MAX_STOP_LENGTH,
    MAX_TOKENS,
    MODEL,
    NULL_ONLY,
    OPENAI_INFO,
    SAMPLING,
    STOP_STRING,
    STREAM_OPTION_FIELDS,
    STRING,
    Check,
    checked_body,
    is_int,
    model_name,
    only,
    opt_bool,
    opt_int,
    opt_number,
    run_checks,
    stop_list,
    stop_string,
    streaming,
)
from skulk.api._openai_messages import parse_messages
from skulk.api._openai_render import OpenAIFormat
from skulk.api._openai_tools import ToolsFormat, parse_tool_choice, parse_tools
from skulk.api._request import Format, GenerateRequest
from skulk.api._schema import Schema, honoured, obj, ref
from skulk.api._structured import RESPONSE_FORMAT_SCHEMA, openai_response_format
from skulk.api._tool_calls import forced_params, tools_json
from skulk.wire.runner import MAX_TOP_LOGPROBS, ChatPrompt, SamplingParams, TextPrompt

COMPLETIONS_DEFAULT_MAX_TOKENS = 16
"""OpenAI's default ``max_tokens`` for legacy completions (also used for an explicit null)."""

MAX_STOP_SEQUENCES = 4
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


# ---- no-op-only and informational fields -----------------------------------------------------

_ZERO = only(0, kind="number")
_ONE = only(1, kind="integer")

_COMMON_NO_OPS: dict[str, Check] = {
    "presence_penalty": _ZERO,
    "frequency_penalty": _ZERO,
    "logit_bias": only({}, kind="object"),
}

_CHAT_NO_OPS: dict[str, Check] = {
    **_COMMON_NO_OPS,
    "functions": only([], kind="array"),
    "function_call": only("none", kind=("string", "object")),
    "audio": NULL_ONLY,
    "prediction": NULL_ONLY,
    "modalities": only(["text"], kind="array"),
    "reasoning_effort": NULL_ONLY,
    "verbosity": only("medium", kind="string"),
    "service_tier": only("auto", "default", kind="string"),
    "store": FALSE,
    "web_search_options": NULL_ONLY,
    "moderation": NULL_ONLY,
    "prompt_cache_retention": NULL_ONLY,
    "prompt_cache_options": only({}, kind="object"),
}

_CHAT_INFO = OPENAI_INFO

_COMPLETIONS_NO_OPS: dict[str, Check] = {
    **_COMMON_NO_OPS,
    "echo": FALSE,
    "best_of": _ONE,
    "suffix": only("", kind="string"),
}

_COMPLETIONS_INFO: dict[str, Check] = {"user": STRING}

# The honoured fields, each with the JSON Schema of what it accepts (its checks are the
# functions below): the OpenAPI document is built from these tables (see _schema.py).
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
        **MAX_TOKENS,
    ),
    **SAMPLING,
    "stop": honoured(
        f"A string or up to {MAX_STOP_SEQUENCES}, each 1 to {MAX_STOP_LENGTH} characters; "
        "generation ends before one, which is not emitted.",
        anyOf=[
            STOP_STRING,
            {"type": "array", "items": STOP_STRING, "maxItems": MAX_STOP_SEQUENCES},
            {"type": "null"},
        ],
    ),
}
_STREAMING: dict[str, Schema] = {
    "stream": honoured(
        "Server-sent events (text/event-stream), ending with data: [DONE].",
        type=["boolean", "null"],
    ),
    "stream_options": honoured(
        "Only with stream: true.", anyOf=[obj(STREAM_OPTION_FIELDS), {"type": "null"}]
    ),
}
_CHAT_HONOURED: dict[str, Schema] = {
    "model": MODEL,
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
        **MAX_TOKENS,
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
    "model": MODEL,
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


# ---- honoured fields -------------------------------------------------------------------------


def _stop(body: Mapping[str, object]) -> tuple[str, ...]:
    value = body.get("stop")
    if value is None:
        return ()
    if isinstance(value, str):
        return (stop_string(value, "stop"),)
    if not isinstance(value, list):
        raise ApiError.invalid_type("stop", "a string, an array of strings or null", value)
    return stop_list(value, "stop", MAX_STOP_SEQUENCES)


def _sampling(
    body: Mapping[str, object], *, default_max_tokens: int | None, chat: bool
) -> SamplingParams:
    max_tokens = opt_int(body, "max_tokens", lo=1)
    if chat:
        # The newer name; OpenAI still accepts both. Two different values are ambiguous.
        completion_tokens = opt_int(body, "max_completion_tokens", lo=1)
        if completion_tokens is not None:
            if max_tokens is not None and max_tokens != completion_tokens:
                raise ApiError.invalid(
                    "max_completion_tokens",
                    "'max_tokens' and 'max_completion_tokens' disagree "
                    f"({max_tokens} vs {completion_tokens}); set only one of them.",
                )
            max_tokens = completion_tokens
    temperature = opt_number(body, "temperature", lo=0, hi=2)
    top_p = opt_number(body, "top_p", lo=0, hi=1, lo_open=True)
    top_k = opt_int(body, "top_k", lo=0)
    return SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=0 if top_k is None else top_k,
        seed=opt_int(body, "seed", lo=INT64_MIN),
        max_tokens=default_max_tokens if max_tokens is None else max_tokens,
        stop=_stop(body),
    )


# ---- prompt (legacy completions) -------------------------------------------------------------


def _is_token_ids(value: object) -> bool:
    return isinstance(value, list) and all(is_int(t) for t in value)


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
    wanted = opt_bool(body, "logprobs")
    top = opt_int(body, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS)
    if top and not wanted:
        raise ApiError.invalid(
            "top_logprobs", "'top_logprobs' is only allowed when 'logprobs' is true."
        )
    return (top or 0) if wanted else None


def _choices(body: Mapping[str, object]) -> int:
    """``n``: 1 to :data:`MAX_CHOICES` (absent or null: 1)."""
    n = opt_int(body, "n", lo=1, hi=MAX_CHOICES)
    return 1 if n is None else n


# ---- entry points ----------------------------------------------------------------------------


def parse_chat_completions(body: object) -> ChatCompletionsRequest:
    """Validate a ``POST /v1/chat/completions`` body (the result of ``json.loads``).

    Raises :class:`ApiError` (400) naming the first offending field; nothing else. Checks run
    in a fixed order (unknown fields, model, messages, no-op fields, sampling, streaming), so
    the same body always gets the same error. ``developer`` messages become ``system``; text
    content parts are concatenated. ``max_tokens`` absent means "up to the context limit".
    """
    obj = checked_body(body, _CHAT_FIELDS)
    model = model_name(obj)
    prompt = parse_messages(obj)
    run_checks(obj, _CHAT_NO_OPS)
    run_checks(obj, _CHAT_INFO)
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
    stream, include_usage = streaming(obj)
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
    obj = checked_body(body, _COMPLETIONS_FIELDS)
    model = model_name(obj)
    prompt = _prompt(obj)
    run_checks(obj, _COMPLETIONS_NO_OPS)
    run_checks(obj, _COMPLETIONS_INFO)
    n = _choices(obj)
    params = _sampling(obj, default_max_tokens=COMPLETIONS_DEFAULT_MAX_TOKENS, chat=False)
    logprobs = opt_int(obj, "logprobs", lo=0, hi=MAX_COMPLETION_LOGPROBS)
    params = attrs.evolve(params, logprobs=logprobs)
    stream, include_usage = streaming(obj)
    return CompletionsRequest(
        model=model, prompt=prompt, params=params, stream=stream, include_usage=include_usage, n=n
    )
