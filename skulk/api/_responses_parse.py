"""OpenAI's Responses format (``POST /v1/responses``): its requests, sans-IO.

:func:`parse_responses` turns a body into a :class:`~skulk.api._request.GenerateRequest` or
raises :class:`ApiError` (400, ``param`` naming the field), as strictly as the Chat Completions
parser: honoured fields, fields accepted only with their no-op value, informational fields, and
anything else is ``unknown_parameter``.

* ``input``: a string (one user message) or a list of messages — roles ``user``, ``assistant``,
  ``system``, ``developer`` (as system); content a string or ``input_text`` / ``output_text``
  parts. Other input items (tool calls and outputs, reasoning, item references, images, files)
  are refused, naming the item.
* ``instructions`` is a system message put first.
* ``store``: we keep no responses (there is no ``GET /v1/responses/{id}``), so ``store: true``
  is refused rather than accepted and forgotten; absent, null or false is fine and the response
  says ``"store": false``.

The answers: :mod:`skulk.api._responses_format`.
"""

from __future__ import annotations

from collections.abc import Mapping

from skulk.api._errors import ApiError, show
from skulk.api._fields import (
    FALSE,
    MAX_TOKENS,
    MODEL,
    NULL_ONLY,
    OPENAI_INFO,
    SAMPLING,
    STREAM_OPTION_FIELDS,
    STRING,
    Check,
    as_object,
    checked_body,
    info,
    model_name,
    only,
    opt_int,
    opt_number,
    reject_unknown,
    required_str,
    run_checks,
    streaming,
    typed_part,
)
from skulk.api._request import GenerateRequest
from skulk.api._responses_format import ResponsesFormat
from skulk.api._schema import Schema, honoured, no_op, obj, ref, typed
from skulk.api._structured import TEXT_FORMAT_SCHEMA, responses_text_format
from skulk.wire.runner import MAX_TOP_LOGPROBS, ChatMessage, ChatPrompt, SamplingParams

#: The one ``include`` value we honour: log-probabilities with the output text.
LOGPROBS_INCLUDE = "message.output_text.logprobs"

# ---- parsing ---------------------------------------------------------------------------------

_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_SUPPORTED_ROLES = '"user", "assistant", "system" or "developer"'


def _check_text(param: str, value: object) -> None:
    """``text``: ``format`` is plain text or structured output (read by
    :func:`_text_format`), at the default verbosity."""
    if value is None:
        return
    text = as_object(value, param)
    reject_unknown(text, dict.fromkeys(["format", "verbosity"]), f"{param}.")
    only("medium", kind="string")(f"{param}.verbosity", text.get("verbosity"))


def _logprobs_included(body: Mapping[str, object]) -> bool:
    """Whether ``include`` asks for log-probabilities (its only value we honour; any other is
    refused as unsupported)."""
    raw = body.get("include")
    if raw is None:
        return False
    if not isinstance(raw, list):
        raise ApiError.invalid_type("include", "an array", raw)
    for i, value in enumerate(raw):
        if not isinstance(value, str):
            raise ApiError.invalid_type(f"include[{i}]", "a string", value)
        if value != LOGPROBS_INCLUDE:
            raise ApiError.unsupported(f"include[{i}]", value, supported=repr(LOGPROBS_INCLUDE))
    return bool(raw)


def _text_format(body: Mapping[str, object]) -> tuple[str | None, Mapping[str, object]]:
    """``text.format`` as the runner's schema text (``None``: free text) and as echoed."""
    text = body.get("text")
    value = text.get("format") if isinstance(text, dict) else None
    schema = responses_text_format(value)
    return schema, value if isinstance(value, dict) and schema is not None else {"type": "text"}


_TEXT = Check(
    _check_text,
    {
        "anyOf": [
            obj(
                {
                    "format": honoured(
                        'Structured output: {"type": "text"} (the default), {"type": '
                        '"json_object"} or {"type": "json_schema", "name", "schema", "strict"}, '
                        "enforced by constrained decoding; a schema feature it cannot enforce "
                        "is a 400 naming it.",
                        **TEXT_FORMAT_SCHEMA,
                    ),
                    "verbosity": no_op(["medium"], '"medium"'),
                }
            ),
            {"type": "null"},
        ],
        "description": "Plain text or structured output (format), at the default verbosity "
        "(anything else is refused, 400 unsupported_parameter).",
    },
)

_NO_OPS: dict[str, Check] = {
    "tools": only([], kind="array"),
    "tool_choice": only("auto", "none", kind=("string", "object")),
    "previous_response_id": NULL_ONLY,
    "conversation": NULL_ONLY,
    "reasoning": NULL_ONLY,
    "prompt": NULL_ONLY,
    "background": FALSE,
    "background_options": NULL_ONLY,
    "max_tool_calls": NULL_ONLY,
    "truncation": only("disabled", kind="string"),
    "text": _TEXT,
    "service_tier": only("auto", "default", kind="string"),
    "store": FALSE,
    "context_management": NULL_ONLY,
    "moderation": NULL_ONLY,
    "access_programs": NULL_ONLY,
    "image": NULL_ONLY,
    "prompt_cache_retention": NULL_ONLY,
    "prompt_cache_options": only({}, kind="object"),
}

#: The same informational fields as chat completions (user, metadata, ...).
_INFO = OPENAI_INFO

#: The honoured fields and the JSON Schema of what each accepts (the OpenAPI document's).
_HONOURED: dict[str, Schema] = {
    "model": MODEL,
    "input": honoured(
        "A string (one user message) or a list of message items.",
        anyOf=[{"type": "string"}, {"type": "array", "minItems": 1, "items": ref("InputMessage")}],
    ),
    "instructions": honoured("A system message put first.", type=["string", "null"]),
    "max_output_tokens": honoured(
        "The most tokens to generate (absent: up to the context).", **MAX_TOKENS
    ),
    "temperature": SAMPLING["temperature"],
    "top_p": SAMPLING["top_p"],
    "include": honoured(
        f"Only {LOGPROBS_INCLUDE!r}: each output token's log-probability in the output_text "
        "part's and delta events' logprobs (any other value: 400 unsupported_parameter).",
        type=["array", "null"],
        items={"const": LOGPROBS_INCLUDE},
    ),
    "top_logprobs": honoured(
        f"0 to {MAX_TOP_LOGPROBS}: that many likeliest alternatives per output token (a "
        "non-zero value turns log-probabilities on, as the include value does).",
        type=["integer", "null"],
        minimum=0,
        maximum=MAX_TOP_LOGPROBS,
    ),
    "stream": honoured("Named server-sent events (text/event-stream).", type=["boolean", "null"]),
    "stream_options": honoured(
        "Only with stream: true; include_obfuscation only false (events are never padded).",
        anyOf=[
            obj({"include_obfuscation": STREAM_OPTION_FIELDS["include_obfuscation"]}),
            {"type": "null"},
        ],
    ),
}
_FIELDS: dict[str, object] = dict.fromkeys([*_HONOURED, *_NO_OPS, *_INFO])

_MESSAGE_KEYS: dict[str, Schema] = {
    "type": {"const": "message"},
    "role": {"enum": list(_ROLES)},
    "content": {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"anyOf": [ref("InputText"), ref("OutputText")]}},
        ],
        "description": "A string or parts: output_text in assistant turns, input_text in "
        "the others.",
    },
    "id": typed((str,), "Informational (an earlier output message's)."),
    "status": typed((str,), "Informational (an earlier output message's)."),
    "phase": typed((str,), "Informational (an earlier output message's)."),
}
_PART_KEYS: dict[str, dict[str, Schema]] = {
    "input_text": {
        "type": {"const": "input_text"},
        "text": {"type": "string"},
        "prompt_cache_breakpoint": NULL_ONLY.schema,
    },
    "output_text": {
        "type": {"const": "output_text"},
        "text": {"type": "string"},
        "annotations": no_op([[]], "[]"),
        "logprobs": typed((list,), "Informational."),
    },
}


def _message_schema(roles: list[str], part: str) -> Schema:
    """An input message of ``roles``, whose content parts are ``part`` (``_part``'s rule)."""
    content = {"anyOf": [{"type": "string"}, {"type": "array", "items": ref(part)}]}
    return obj(
        {**_MESSAGE_KEYS, "role": {"enum": roles}, "content": content}, required=("role", "content")
    )


#: Shared schemas of the body above (``components.schemas`` of the OpenAPI document).
SCHEMAS: dict[str, Schema] = {
    "InputMessage": {
        "anyOf": [
            _message_schema(["user", "system", "developer"], "InputText"),
            _message_schema(["assistant"], "OutputText"),
        ],
        "description": "Other input items (function_call, reasoning, item_reference, ...) are "
        "refused (400) naming the item.",
    },
    "InputText": obj(_PART_KEYS["input_text"], required=("type", "text")),
    "OutputText": obj(_PART_KEYS["output_text"], required=("type", "text")),
}


def _part(raw: object, param: str, role: str) -> str:
    # An assistant turn speaks output_text; the others input_text (OpenAI insists on it too).
    wanted = "output_text" if role == "assistant" else "input_text"
    kind, part = typed_part(
        raw, param, {wanted: _PART_KEYS[wanted]}, supported=f'"{wanted}" parts here'
    )
    if kind == "input_text":
        NULL_ONLY(f"{param}.prompt_cache_breakpoint", part.get("prompt_cache_breakpoint"))
    else:
        only([], kind="array")(f"{param}.annotations", part.get("annotations"))
        info("array")(f"{param}.logprobs", part.get("logprobs"))
    return required_str(part, "text", param)


def _message(raw: object, param: str) -> ChatMessage:
    item = as_object(raw, param)
    kind = item.get("type", "message")
    if kind != "message":
        if not isinstance(kind, str):
            raise ApiError.invalid_type(f"{param}.type", "a string", kind)
        raise ApiError.unsupported(f"{param}.type", kind, supported='"message" input items')
    role = required_str(item, "role", param)
    mapped = _ROLES.get(role)
    if mapped is None:
        raise ApiError.invalid(
            f"{param}.role",
            f"Invalid value for '{param}.role': {show(role)}; expected {_SUPPORTED_ROLES}.",
        )
    reject_unknown(item, _MESSAGE_KEYS, f"{param}.")
    # An earlier output message sent back carries its id, status and phase: informational.
    STRING(f"{param}.id", item.get("id"))
    STRING(f"{param}.status", item.get("status"))
    STRING(f"{param}.phase", item.get("phase"))
    content = item.get("content")
    if content is None:
        raise ApiError.missing(f"{param}.content")
    if isinstance(content, str):
        return ChatMessage(mapped, content)
    if not isinstance(content, list):
        raise ApiError.invalid_type(f"{param}.content", "a string or an array of parts", content)
    text = "".join(_part(p, f"{param}.content[{j}]", role) for j, p in enumerate(content))
    return ChatMessage(mapped, text)


def _input(body: Mapping[str, object]) -> tuple[ChatMessage, ...]:
    raw = body.get("input")
    if raw is None:
        raise ApiError.missing("input")
    if isinstance(raw, str):
        return (ChatMessage("user", raw),)
    if not isinstance(raw, list):
        raise ApiError.invalid_type("input", "a string or an array of input items", raw)
    if not raw:
        raise ApiError.invalid("input", "Invalid value for 'input': must not be empty.")
    return tuple(_message(item, f"input[{i}]") for i, item in enumerate(raw))


def parse_responses(body: object) -> GenerateRequest:
    """Validate a ``POST /v1/responses`` body (the result of ``json.loads``).

    Raises :class:`ApiError` (400) naming the first offending field; nothing else. Checks run
    in a fixed order (unknown fields, model, input, instructions, no-op fields, sampling,
    streaming). ``max_output_tokens`` absent means "up to the context limit".
    """
    obj = checked_body(body, _FIELDS)
    model = model_name(obj)
    messages = _input(obj)
    instructions = obj.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise ApiError.invalid_type("instructions", "a string", instructions)
    if instructions is not None:
        messages = (ChatMessage("system", instructions), *messages)
    run_checks(obj, _NO_OPS)
    run_checks(obj, _INFO)
    max_tokens = opt_int(obj, "max_output_tokens", lo=1)
    temperature = opt_number(obj, "temperature", lo=0, hi=2)
    top_p = opt_number(obj, "top_p", lo=0, hi=1, lo_open=True)
    schema, text_format = _text_format(obj)
    top_logprobs = opt_int(obj, "top_logprobs", lo=0, hi=MAX_TOP_LOGPROBS) or 0
    logprobs = _logprobs_included(obj) or top_logprobs > 0
    params = SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        max_tokens=max_tokens,
        json_schema=schema,
        logprobs=top_logprobs if logprobs else None,
    )
    metadata = obj.get("metadata")
    user = obj.get("user")
    fmt = ResponsesFormat(
        instructions=instructions,
        max_output_tokens=max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        metadata=dict(metadata) if isinstance(metadata, dict) else {},
        user=user if isinstance(user, str) else None,
        tool_choice="none" if obj.get("tool_choice") == "none" else "auto",
        text_format=text_format,
        top_logprobs=top_logprobs,
        logprobs=logprobs,
    )
    stream, _ = streaming(obj, options_known=dict.fromkeys(["include_obfuscation"]))
    return GenerateRequest(model, ChatPrompt(messages), params, stream, fmt)
