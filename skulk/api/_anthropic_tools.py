"""Anthropic Messages tool use: ``tools``, ``tool_choice``, ``tool_use`` / ``tool_result``
content blocks, and answers with ``tool_use`` blocks (sans-IO).

The format-neutral part (forcing, parsing) is :mod:`skulk.api._tool_calls`. ``tool_choice``
``{"type": "any"}`` and ``{"type": "tool", "name"}`` force one call (constrained decoding);
``auto`` (the default with tools) lets the model choose; ``none`` shows no tools.

An answer that may call a tool is rendered by :class:`ToolsRenderer`: its text is held back to
the end, then sent as a ``text`` block and/or one ``tool_use`` block per call — streamed as
``content_block_start`` (``tool_use`` with an empty ``input``), one ``content_block_delta``
with an ``input_json_delta`` holding the whole input, ``content_block_stop`` — with
``stop_reason: "tool_use"``.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Mapping, Sequence

import attrs

from skulk.api._error_formats import anthropic_envelope
from skulk.api._errors import ApiError, show
from skulk.api._request import Event
from skulk.api._structured import check_name, optional
from skulk.api._tool_calls import (
    Call,
    Choice,
    Tool,
    answer_calls,
    check_tools,
    checked_object,
    objects,
)
from skulk.wire.runner import ChatMessage, FinishReason, GenerationEnd, ToolCall

_TOOL_KEYS = frozenset({"name", "description", "input_schema", "type", "cache_control"})
# ``caller`` and ``toolset_name`` are what the official client echoes back from a response's
# blocks: informational, they change nothing in the prompt.
_TOOL_USE_KEYS = frozenset(
    {"type", "id", "name", "input", "cache_control", "caller", "toolset_name"}
)
_TOOL_RESULT_KEYS = frozenset(
    {"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"}
)


def parse_tools(value: object, param: str = "tools") -> list[Tool]:
    """``tools``: ``[{"name", "description", "input_schema"}]`` (client tools only)."""
    tools = []
    for where, item in objects(value, param, _TOOL_KEYS):
        kind = item.get("type")
        if kind not in (None, "custom"):
            raise ApiError.unsupported(f"{where}.type", kind, supported='"custom" (client tools)')
        name = check_name(item.get("name"), f"{where}.name")
        description = optional(item.get("description"), f"{where}.description", str, "a string")
        schema = item.get("input_schema")
        if not isinstance(schema, dict):
            raise ApiError.invalid_type(f"{where}.input_schema", "an object", schema)
        tools.append(Tool(name, description, schema))
    check_tools(tools, param)
    return tools


def parse_tool_choice(value: object, tools: Sequence[Tool], param: str = "tool_choice") -> Choice:
    """``tool_choice``: ``{"type": "auto" | "any" | "none"}`` or ``{"type": "tool",
    "name"}`` (``disable_parallel_tool_use`` is accepted: we make at most one forced call)."""
    if value is None:
        return "auto" if tools else "none"
    if not isinstance(value, dict):
        raise ApiError.invalid_type(param, "an object", value)
    kind = value.get("type")
    for key in value:
        if key not in ("type", "name", "disable_parallel_tool_use"):
            raise ApiError.unknown_parameter(f"{param}.{key}")
    if kind in ("auto", "none"):
        return str(kind) if tools else "none"
    if not tools:
        raise ApiError.invalid(param, f"{param}: {show(kind)} needs tools.")
    if kind == "any":
        return "required"
    if kind == "tool":
        name = check_name(value.get("name"), f"{param}.name")
        if all(t.name != name for t in tools):
            raise ApiError.invalid(f"{param}.name", f"{param}.name: no tool named {name!r}.")
        return name
    raise ApiError.invalid(
        f"{param}.type", f'{param}.type: expected "auto", "any", "tool" or "none".'
    )


def _result_text(value: object, param: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ApiError.invalid_type(param, "a string or an array of text blocks", value)
    parts = []
    for j, block in enumerate(value):
        if not isinstance(block, dict) or block.get("type") != "text":
            raise ApiError.unsupported(f"{param}[{j}]", block, supported='"text" blocks')
        text = block.get("text")
        if not isinstance(text, str):
            raise ApiError.invalid_type(f"{param}[{j}].text", "a string", text)
        parts.append(text)
    return "".join(parts)


def tool_blocks(
    role: str, blocks: list[object], param: str, text_block: Callable[[object, str], str]
) -> list[ChatMessage] | None:
    """The turns of a message whose content blocks include ``tool_use`` (assistant) or
    ``tool_result`` (user) blocks; ``None`` when it has none (plain text blocks, read by the
    caller). ``text_block(raw, param) -> str`` reads a text block."""
    kinds = {b.get("type") for b in blocks if isinstance(b, dict)}
    if not kinds & {"tool_use", "tool_result"}:
        return None
    texts: list[str] = []
    calls: list[ToolCall] = []
    results: list[ChatMessage] = []
    for j, raw in enumerate(blocks):
        where = f"{param}[{j}]"
        kind = raw.get("type") if isinstance(raw, dict) else None
        if kind == "tool_use" and role == "assistant":
            raw = checked_object(raw, where, _TOOL_USE_KEYS)
            call_id, name, arguments = raw.get("id"), raw.get("name"), raw.get("input")
            if not isinstance(call_id, str):
                raise ApiError.invalid_type(f"{where}.id", "a string", call_id)
            if not isinstance(name, str):
                raise ApiError.invalid_type(f"{where}.name", "a string", name)
            if not isinstance(arguments, dict):
                raise ApiError.invalid_type(f"{where}.input", "an object", arguments)
            calls.append(ToolCall(call_id, name, json.dumps(arguments, ensure_ascii=False)))
        elif kind == "tool_result" and role == "user":
            raw = checked_object(raw, where, _TOOL_RESULT_KEYS)
            call_id = raw.get("tool_use_id")
            if not isinstance(call_id, str):
                raise ApiError.invalid_type(f"{where}.tool_use_id", "a string", call_id)
            content = _result_text(raw.get("content"), f"{where}.content")
            if raw.get("is_error") is True:
                content = f"Error: {content}"
            results.append(ChatMessage("tool", content, tool_call_id=call_id))
        else:
            texts.append(text_block(raw, where))
    if role == "assistant":
        return [ChatMessage("assistant", "".join(texts), tool_calls=tuple(calls))]
    return [*results, *([ChatMessage("user", "".join(texts))] if texts else [])]


@attrs.frozen
class ToolsFormat:
    """A Messages answer that may use tools (:class:`~skulk.api._request.Format`)."""

    @property
    def prompt_param(self) -> str:
        return "messages"

    def renderer(self, model: str) -> ToolsRenderer:
        return ToolsRenderer(model, f"msg_{secrets.token_hex(12)}")


def _event(name: str, **data: object) -> Event:
    return Event({"type": name, **data}, name=name)


def _stop_reason(end: GenerationEnd, calls: bool) -> str:
    if calls:
        return "tool_use"
    reason: FinishReason = end.finish_reason
    if reason == "length":
        return "max_tokens"
    return "stop_sequence" if end.stop_sequence is not None else "end_turn"


@attrs.define
class ToolsRenderer:
    """See the module docstring."""

    model: str
    id: str
    _held: list[str] = attrs.Factory(list)

    def _message(
        self, content: list[Mapping[str, object]], end: GenerationEnd | None
    ) -> dict[str, object]:
        calls = any(b.get("type") == "tool_use" for b in content)
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "content": [dict(b) for b in content],
            "model": self.model,
            "stop_reason": None if end is None else _stop_reason(end, calls),
            "stop_sequence": None if end is None else end.stop_sequence,
            "usage": {
                "input_tokens": end.usage.prompt_tokens if end else 0,
                "output_tokens": end.usage.completion_tokens if end else 0,
            },
        }

    def opening(self) -> list[Event]:
        return [_event("message_start", message=self._message([], None)), _event("ping")]

    def delta(self, text: str) -> list[Event]:
        self._held.append(text)
        return []

    def _answer(self, end: GenerationEnd) -> tuple[str, list[Call]]:
        text = "".join(self._held)
        return answer_calls(text, end, id_prefix="toolu_")

    def closing(self, end: GenerationEnd) -> list[Event]:
        text, calls = self._answer(end)
        events = []
        index = 0
        if text or not calls:
            events += [
                _event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
                _event("content_block_delta", index=0, delta={"type": "text_delta", "text": text}),
                _event("content_block_stop", index=0),
            ]
            index = 1
        for i, call in enumerate(calls, start=index):
            block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": call.arguments}
            events += [
                _event("content_block_start", index=i, content_block=block),
                _event("content_block_delta", index=i, delta=delta),
                _event("content_block_stop", index=i),
            ]
        usage = {
            "input_tokens": end.usage.prompt_tokens,
            "output_tokens": end.usage.completion_tokens,
        }
        stop = {"stop_reason": _stop_reason(end, bool(calls)), "stop_sequence": end.stop_sequence}
        return [*events, _event("message_delta", delta=stop, usage=usage), _event("message_stop")]

    def failure(self, err: ApiError) -> list[Event]:
        return [Event(anthropic_envelope(err), name="error")]

    def whole(self, text: str, end: GenerationEnd) -> dict[str, object]:
        self._held = [text]
        content, calls = self._answer(end)
        blocks: list[Mapping[str, object]] = [{"type": "text", "text": content}] if content else []
        blocks += [
            {"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in calls
        ]
        return self._message(blocks, end)
