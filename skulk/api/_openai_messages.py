"""Validating Chat Completions' ``messages`` (sans-IO): roles, content parts, an assistant's
tool calls and a tool's result, with the JSON Schema of each (``SCHEMAS``).

``developer`` is taken as ``system``; the deprecated ``function`` role is refused as
unsupported; text content parts are joined as written. Used by
:func:`skulk.api._openai_parse.parse_chat_completions`.
"""

from __future__ import annotations

from collections.abc import Mapping

from skulk.api._errors import ApiError, show
from skulk.api._fields import (
    NULL_ONLY,
    STRING,
    Check,
    as_object,
    message_list,
    reject_unknown,
    required_str,
    typed_part,
)
from skulk.api._openai_tools import parse_assistant_calls
from skulk.api._schema import Schema, nullable, obj, typed
from skulk.wire.runner import ChatMessage, ChatPrompt, ToolCall

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
_ASSISTANT_NO_OPS: dict[str, Check] = {
    "function_call": NULL_ONLY,
    "refusal": NULL_ONLY,
    "audio": NULL_ONLY,
}
_TEXT_PART_KEYS: dict[str, Schema] = {
    "type": {"const": "text"},
    "text": {"type": "string"},
    "prompt_cache_breakpoint": NULL_ONLY.schema,
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
#: The shared schemas of Chat Completions' messages (``components.schemas`` in the OpenAPI
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


def _text_part(part: object, param: str) -> str:
    _, obj = typed_part(part, param, {"text": _TEXT_PART_KEYS}, '"text" content parts')
    NULL_ONLY(f"{param}.prompt_cache_breakpoint", obj.get("prompt_cache_breakpoint"))
    return required_str(obj, "text", param)


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
    message = as_object(raw, param)
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
    reject_unknown(message, _MESSAGE_KEYS[mapped], f"{param}.")
    STRING(f"{param}.name", message.get("name"))  # informational: which participant spoke
    calls: tuple[ToolCall, ...] = ()
    if mapped == "assistant":
        for key, check in _ASSISTANT_NO_OPS.items():
            check(f"{param}.{key}", message.get(key))
        calls = parse_assistant_calls(message.get("tool_calls"), f"{param}.tool_calls")
    call_id = None
    if mapped == "tool":
        call_id = required_str(message, "tool_call_id", param)
    # An assistant turn may have null content (OpenAI allows it); it means an empty turn.
    content = _content(message, f"{param}.content", optional=mapped == "assistant")
    return ChatMessage(role=mapped, content=content, tool_calls=calls, tool_call_id=call_id)


def parse_messages(body: Mapping[str, object]) -> ChatPrompt:
    """Chat Completions' required, non-empty ``messages`` as a prompt."""
    raw = message_list(body)
    return ChatPrompt(tuple(_message(m, f"messages[{i}]") for i, m in enumerate(raw)))
