"""Anthropic's Messages format (``POST /v1/messages``, ``POST /v1/messages/count_tokens``):
parsing and rendering, sans-IO.

:func:`parse_messages` / :func:`parse_count_tokens` turn a body into a
:class:`~skulk.api._request.GenerateRequest` or raise :class:`ApiError` (400; Anthropic's
envelope has no ``param``, so the message names the field). As for the OpenAI formats, a field
we cannot honour sent with a non-default value is refused, never ignored.

* ``system``: a string or text blocks; ``messages``: roles ``user`` and ``assistant``, content
  a string or ``text`` blocks (images, documents, tool use and results, thinking blocks are
  refused, naming the block). A conversation must end with a user turn: Anthropic continues a
  final assistant turn ("prefill"), which the model's chat template cannot express, so it is
  refused rather than answered as a new turn.
* ``max_tokens`` is required (as Anthropic requires it); ``temperature`` is 0 to 1 as Anthropic
  defines it (0 ⇒ greedy), ``top_p``, ``top_k`` (0 ⇒ off), ``stop_sequences``.

:class:`AnthropicRenderer` answers with a ``message`` or streams Anthropic's named events::

    message_start, content_block_start, ping, content_block_delta (text_delta)…,
    content_block_stop, message_delta (stop_reason, usage), message_stop

The prompt's length is known only once generation ends, so ``message_start`` carries
``input_tokens: 0`` and ``message_delta``'s usage carries the real ``input_tokens`` (the
official client takes it from there). A failure after the stream started ends it with
``event: error`` and Anthropic's error object.

``stop_reason`` is ``max_tokens`` when the token limit ended the message, ``stop_sequence``
(with ``stop_sequence`` set to it) when one of the request's ``stop_sequences`` did — the
runner's stop matcher reports which one (``GenerationEnd.stop_sequence``) — else ``end_turn``.

``count_tokens`` is answered by the runner rendering and tokenizing the prompt (a
``Tokenize`` request through the router): nothing is decoded.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Literal

import attrs

from skulk.api._anthropic_tools import ToolsFormat, parse_tool_choice, parse_tools, tool_blocks
from skulk.api._error_formats import anthropic_envelope
from skulk.api._errors import ApiError, show
from skulk.api._fields import (
    MODEL,
    NULL_ONLY,
    SAMPLING,
    STOP_STRING,
    STRING,
    Check,
    as_object,
    checked_body,
    info,
    message_list,
    model_name,
    only,
    opt_bool,
    opt_int,
    opt_number,
    reject_unknown,
    required_str,
    run_checks,
    stop_list,
    typed_part,
)
from skulk.api._request import Event, GenerateRequest
from skulk.api._schema import Schema, honoured, obj, ref, typed
from skulk.api._tool_calls import Choice, Tool, forced_params, tools_json
from skulk.wire.runner import ChatMessage, ChatPrompt, FinishReason, GenerationEnd, SamplingParams

#: The most stop sequences one request may carry: the runner checks every one of them against
#: the text it holds back after every token.
MAX_STOP_SEQUENCES = 16

AnthropicStopReason = Literal["end_turn", "max_tokens", "stop_sequence"]

# ---- parsing ---------------------------------------------------------------------------------


def _check_metadata(param: str, value: object) -> None:
    if value is None:
        return
    metadata = as_object(value, param)
    reject_unknown(metadata, dict.fromkeys(["user_id"]), f"{param}.")
    STRING(f"{param}.user_id", metadata.get("user_id"))


_METADATA = Check(
    _check_metadata,
    {
        "anyOf": [obj({"user_id": STRING.schema}), {"type": "null"}],
        "description": "Informational: accepted, changes nothing that is generated.",
    },
)

#: Fields both routes take, accepted only with their no-op value.
_COMMON_NO_OPS: dict[str, Check] = {
    "thinking": only({"type": "disabled"}, kind="object"),
    "mcp_servers": only([], kind="array"),
    "context_management": NULL_ONLY,
    "output_config": only({}, kind="object"),
    "speed": only("standard", kind="string"),
}
_MESSAGES_NO_OPS: dict[str, Check] = {
    **_COMMON_NO_OPS,
    "container": NULL_ONLY,
    "diagnostics": NULL_ONLY,
}
#: Fields that do not change what is generated (caching hints, scheduling, accounting).
_COMMON_INFO: dict[str, Check] = {
    "cache_control": info("object"),
    "user_profile_id": STRING,
    "workspace_id": STRING,
}
_MESSAGES_INFO: dict[str, Check] = {
    **_COMMON_INFO,
    "metadata": _METADATA,
    "service_tier": only("auto", "standard_only", kind="string"),
    "inference_geo": STRING,
}

_TEXT_OR_BLOCKS: list[Schema] = [{"type": "string"}, {"type": "array", "items": ref("TextBlock")}]
#: The prompt's fields, which both routes take, and the JSON Schema of what each accepts.
_PROMPT_HONOURED: dict[str, Schema] = {
    "model": MODEL,
    "messages": honoured(
        "The conversation, ending with a user turn (a final assistant turn, prefill, is refused).",
        type="array",
        minItems=1,
        items=ref("Message"),
    ),
    "system": honoured("A system message first.", anyOf=[*_TEXT_OR_BLOCKS, {"type": "null"}]),
    "tools": honoured(
        "Client tools ({name, description, input_schema}), rendered through the model's chat "
        "template (or the documented fallback system turn).",
        type=["array", "null"],
        items={
            "type": "object",
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"},
                "description": {"type": "string"},
                "input_schema": {"type": "object"},
                "type": {"const": "custom"},
                "cache_control": {"type": "object"},
            },
            "required": ["name", "input_schema"],
            "additionalProperties": False,
        },
    ),
    "tool_choice": honoured(
        "auto (the default with tools), none (no tools shown), any or {type: tool, name}: the "
        "last two force one call whose input is valid for the tool's input_schema.",
        anyOf=[
            {
                "type": "object",
                "properties": {
                    "type": {"enum": ["auto", "any", "tool", "none"]},
                    "name": {"type": "string"},
                    "disable_parallel_tool_use": {"type": "boolean"},
                },
                "required": ["type"],
                "additionalProperties": False,
            },
            {"type": "null"},
        ],
    ),
}
_MESSAGES_HONOURED: dict[str, Schema] = {
    **_PROMPT_HONOURED,
    "max_tokens": honoured(
        "Required: the most tokens to generate.", type="integer", minimum=1, maximum=2**63 - 1
    ),
    "stop_sequences": honoured(
        f"Up to {MAX_STOP_SEQUENCES}; generation ends before one, which is not emitted.",
        type=["array", "null"],
        items=STOP_STRING,
        maxItems=MAX_STOP_SEQUENCES,
    ),
    "temperature": honoured(
        "0 to 1 (Anthropic's range); 0 is greedy (default 1).",
        type=["number", "null"],
        minimum=0,
        maximum=1,
    ),
    "top_p": SAMPLING["top_p"],
    "top_k": SAMPLING["top_k"],
    "stream": honoured("Named server-sent events (text/event-stream).", type=["boolean", "null"]),
}
_MESSAGES_FIELDS: dict[str, object] = dict.fromkeys(
    [*_MESSAGES_HONOURED, *_MESSAGES_NO_OPS, *_MESSAGES_INFO]
)
_COUNT_FIELDS: dict[str, object] = dict.fromkeys(
    [*_PROMPT_HONOURED, *_COMMON_NO_OPS, *_COMMON_INFO]
)

_TEXT_BLOCK_KEYS: dict[str, Schema] = {
    "type": {"const": "text"},
    "text": {"type": "string"},
    "cache_control": typed((dict,), "Informational."),
    "citations": {"enum": [[], None]},
}
_MESSAGE_KEYS: dict[str, Schema] = {
    "role": {"enum": ["user", "assistant"]},
    "content": {"anyOf": _TEXT_OR_BLOCKS},
}
#: Shared schemas of the bodies above (``components.schemas`` of the OpenAPI document).
SCHEMAS: dict[str, Schema] = {
    "Message": obj(
        _MESSAGE_KEYS,
        required=("role", "content"),
        description="image, document, tool_use, tool_result, thinking, ... blocks are refused "
        "(400) naming the block.",
    ),
    "TextBlock": obj(_TEXT_BLOCK_KEYS, required=("type", "text")),
}


def _text_block(raw: object, param: str) -> str:
    _, block = typed_part(raw, param, {"text": _TEXT_BLOCK_KEYS}, '"text" blocks')
    info("object")(f"{param}.cache_control", block.get("cache_control"))
    only([], kind="array")(f"{param}.citations", block.get("citations"))
    return required_str(block, "text", param)


def _text(value: object, param: str) -> str:
    """A string, or text blocks joined as written."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ApiError.invalid_type(param, "a string or an array of content blocks", value)
    return "".join(_text_block(block, f"{param}[{j}]") for j, block in enumerate(value))


def _message(raw: object, param: str) -> list[ChatMessage]:
    message = as_object(raw, param)
    role = required_str(message, "role", param)
    if role not in ("user", "assistant"):
        raise ApiError.invalid(
            f"{param}.role",
            f"Invalid value for '{param}.role': {show(role)}; expected \"user\" or "
            '"assistant" (the system prompt is the top-level "system" field).',
        )
    reject_unknown(message, _MESSAGE_KEYS, f"{param}.")
    content = message.get("content")
    if content is None:
        raise ApiError.missing(f"{param}.content")
    if isinstance(content, list):
        turns = tool_blocks(role, content, f"{param}.content", _text_block)
        if turns is not None:
            return turns
    return [ChatMessage(role, _text(content, f"{param}.content"))]


def _prompt(body: Mapping[str, object]) -> ChatPrompt:
    raw = message_list(body)
    messages = [t for i, m in enumerate(raw) for t in _message(m, f"messages[{i}]")]
    if messages[-1].role == "assistant":
        last = f"messages[{len(messages) - 1}].role"
        raise ApiError.unsupported(
            last,
            "assistant",
            supported="conversations that end with a user turn (a final assistant turn, "
            "'prefill', is not supported)",
        )
    system = body.get("system")
    if system is not None:
        messages.insert(0, ChatMessage("system", _text(system, "system")))
    return ChatPrompt(tuple(messages))


def _tools(body: Mapping[str, object], prompt: ChatPrompt) -> tuple[ChatPrompt, Choice, list[Tool]]:
    """The prompt with the request's tools (none when ``tool_choice`` is ``none``)."""
    tools = parse_tools(body.get("tools"))
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    if choice == "none":
        return prompt, choice, tools
    return attrs.evolve(prompt, tools=tools_json(tools)), choice, tools


def _stop_sequences(body: Mapping[str, object]) -> tuple[str, ...]:
    value = body.get("stop_sequences")
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ApiError.invalid_type("stop_sequences", "an array of strings", value)
    return stop_list(value, "stop_sequences", MAX_STOP_SEQUENCES)


def parse_messages(body: object) -> GenerateRequest:
    """Validate a ``POST /v1/messages`` body (the result of ``json.loads``).

    Raises :class:`ApiError` (400) naming the first offending field; nothing else. Checks run
    in a fixed order (unknown fields, model, messages and system, max_tokens, no-op fields,
    sampling, streaming).
    """
    obj = checked_body(body, _MESSAGES_FIELDS)
    model = model_name(obj)
    prompt, choice, tools = _tools(obj, _prompt(obj))
    if obj.get("max_tokens") is None:
        raise ApiError.missing("max_tokens")
    max_tokens = opt_int(obj, "max_tokens", lo=1)
    run_checks(obj, _MESSAGES_NO_OPS)
    run_checks(obj, _MESSAGES_INFO)
    temperature = opt_number(obj, "temperature", lo=0, hi=1)
    top_p = opt_number(obj, "top_p", lo=0, hi=1, lo_open=True)
    top_k = opt_int(obj, "top_k", lo=0)
    params = SamplingParams(
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=0 if top_k is None else top_k,
        max_tokens=max_tokens,
        stop=_stop_sequences(obj),
    )
    stream = bool(opt_bool(obj, "stream"))
    if choice == "none":
        return GenerateRequest(model, prompt, params, stream, AnthropicFormat())
    params = forced_params(params, tools, choice, "tools")
    return GenerateRequest(model, prompt, params, stream, ToolsFormat())


#: The parameters of a count request: never used to generate (the runner only tokenizes the
#: prompt, see :meth:`skulk.routing.Router.count_tokens`).
COUNT_PARAMS = SamplingParams(temperature=0.0, max_tokens=1)


def parse_count_tokens(body: object) -> GenerateRequest:
    """Validate a ``POST /v1/messages/count_tokens`` body: the prompt fields of a Messages
    request (no ``max_tokens`` and no sampling). Its prompt is counted by the runner, which
    renders and tokenizes it as for a generation (see
    :func:`skulk.api._stream.count_prompt_tokens`)."""
    obj = checked_body(body, _COUNT_FIELDS)
    model = model_name(obj)
    prompt, _, _ = _tools(obj, _prompt(obj))
    run_checks(obj, _COMMON_NO_OPS)
    run_checks(obj, _COMMON_INFO)
    return GenerateRequest(model, prompt, COUNT_PARAMS, False, AnthropicFormat())


# ---- rendering -------------------------------------------------------------------------------


def stop_reason(reason: FinishReason, stop_sequence: str | None = None) -> AnthropicStopReason:
    """Anthropic's ``stop_reason`` for how a generation ended; ``stop_sequence``: the stop
    sequence that ended it, when known."""
    if reason == "cancelled":
        raise ValueError("a cancelled request has no stop_reason; send an error instead")
    if reason == "length":
        return "max_tokens"
    return "stop_sequence" if stop_sequence is not None else "end_turn"


@attrs.frozen
class AnthropicFormat:
    """How to answer a Messages request (:class:`~skulk.api._request.Format`)."""

    @property
    def prompt_param(self) -> str:
        return "messages"

    def renderer(self, model: str) -> AnthropicRenderer:
        return AnthropicRenderer(model, f"msg_{secrets.token_hex(12)}")


def _event(name: str, **data: object) -> Event:
    return Event({"type": name, **data}, name=name)


@attrs.frozen
class AnthropicRenderer:
    """One message's events or whole object (:class:`~skulk.api._request.Renderer`)."""

    model: str
    id: str

    def message(
        self, content: list[dict[str, object]], end: GenerationEnd | None
    ) -> dict[str, object]:
        usage = end.usage if end is not None else None
        reason = None if end is None else stop_reason(end.finish_reason, end.stop_sequence)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": content,
            "model": self.model,
            "stop_reason": reason,
            "stop_sequence": None if end is None else end.stop_sequence,
            "usage": {
                "input_tokens": usage.prompt_tokens if usage else 0,
                "output_tokens": usage.completion_tokens if usage else 0,
            },
        }

    def opening(self) -> list[Event]:
        return [
            _event("message_start", message=self.message([], None)),
            _event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
            _event("ping"),
        ]

    def delta(self, text: str) -> list[Event]:
        return [_event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})]

    def closing(self, end: GenerationEnd) -> list[Event]:
        usage = end.usage
        return [
            _event("content_block_stop", index=0),
            _event(
                "message_delta",
                delta={
                    "stop_reason": stop_reason(end.finish_reason, end.stop_sequence),
                    "stop_sequence": end.stop_sequence,
                },
                usage={
                    "input_tokens": usage.prompt_tokens,
                    "output_tokens": usage.completion_tokens,
                },
            ),
            _event("message_stop"),
        ]

    def failure(self, err: ApiError) -> list[Event]:
        return [Event(anthropic_envelope(err), name="error")]

    def whole(self, text: str, end: GenerationEnd) -> dict[str, object]:
        return self.message([{"type": "text", "text": text}], end)
