"""OpenAI Chat Completions tool calling: ``tools``, ``tool_choice``, assistant ``tool_calls``,
``tool`` turns, and answers carrying ``tool_calls`` (sans-IO).

The format-neutral part (forcing, parsing) is :mod:`skulk.api._tool_calls`. A request that
offers tools with ``tool_choice`` other than ``"none"`` is answered by :class:`ToolsRenderer`:
its text is held back until the end, then sent either as content or as one
``delta.tool_calls`` chunk per call (``index``, ``id``, ``type``, ``function.name`` and the
whole ``function.arguments``), with ``finish_reason: "tool_calls"``. ``tool_choice: "none"``
sends no tools to the model at all.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import attrs

from skulk.api._errors import ApiError
from skulk.api._openai_format import (
    CHAT_ID_PREFIX,
    chat_chunk,
    chat_role_chunk,
    chat_usage_chunk,
    new_request_id,
    openai_finish_reason,
    usage_object,
)
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
from skulk.clock import wall
from skulk.wire.runner import GenerationEnd, ToolCall

_DONE = Event("[DONE]")
_FUNCTION_KEYS = ("name", "description", "parameters", "strict")
_FUNCTION_KEYS = ("name", "description", "parameters", "strict")


def parse_tools(value: object, param: str = "tools") -> list[Tool]:
    """``tools``: ``[{"type": "function", "function": {"name", "description", "parameters",
    "strict"}}]`` (null or absent: none)."""
    tools = []
    for where, item in objects(value, param, ("type", "function")):
        if item.get("type") != "function":
            raise ApiError.unsupported(f"{where}.type", item.get("type"), supported='"function"')
        function = checked_object(item.get("function"), f"{where}.function", _FUNCTION_KEYS)
        name = check_name(function.get("name"), f"{where}.function.name")
        description = optional(
            function.get("description"), f"{where}.function.description", str, "a string"
        )
        parameters = optional(
            function.get("parameters"), f"{where}.function.parameters", dict, "an object"
        )
        optional(function.get("strict"), f"{where}.function.strict", bool, "a boolean")
        tools.append(Tool(name, description, parameters))
    check_tools(tools, param)
    return tools


def parse_tool_choice(value: object, tools: Sequence[Tool], param: str = "tool_choice") -> Choice:
    """``tool_choice``: ``"none"``, ``"auto"``, ``"required"`` or ``{"type": "function",
    "function": {"name"}}``; absent: ``"auto"`` with tools, ``"none"`` without."""
    if value is None:
        return "auto" if tools else "none"
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise ApiError.invalid(
                param, f"Invalid value for '{param}': expected 'none', 'auto' or 'required'."
            )
        if value == "required" and not tools:
            raise ApiError.invalid(param, f"'{param}' is 'required' but no tools are given.")
        return value
    if not isinstance(value, dict):
        raise ApiError.invalid_type(param, "a string or an object", value)
    if value.get("type") != "function":
        raise ApiError.unsupported(f"{param}.type", value.get("type"), supported='"function"')
    function = value.get("function")
    if not isinstance(function, dict):
        raise ApiError.invalid_type(f"{param}.function", "an object", function)
    name = check_name(function.get("name"), f"{param}.function.name")
    if all(t.name != name for t in tools):
        raise ApiError.invalid(
            f"{param}.function.name", f"Invalid value for '{param}': no tool named {name!r}."
        )
    return name


def parse_assistant_calls(value: object, param: str) -> tuple[ToolCall, ...]:
    """An assistant turn's ``tool_calls`` (``[{"id", "type": "function", "function": {"name",
    "arguments"}}]``, arguments as JSON text of an object)."""
    calls = []
    for where, item in objects(value, param):
        call_id = item.get("id")
        if not isinstance(call_id, str):
            raise ApiError.invalid_type(f"{where}.id", "a string", call_id)
        function = checked_object(item.get("function"), f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str):
            raise ApiError.invalid_type(f"{where}.function.name", "a string", name)
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise ApiError.invalid_type(f"{where}.function.arguments", "a string", arguments)
        try:
            decoded = json.loads(arguments)
        except ValueError:
            decoded = None
        if not isinstance(decoded, dict):
            raise ApiError.invalid(
                f"{where}.function.arguments",
                f"Invalid value for '{where}.function.arguments': JSON text of an object.",
            )
        calls.append(ToolCall(call_id, name, json.dumps(decoded, ensure_ascii=False)))
    return tuple(calls)


def call_objects(calls: Sequence[Call]) -> list[dict[str, object]]:
    return [
        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
        for c in calls
    ]


@attrs.frozen
class ToolsFormat:
    """A chat completion that may answer with tool calls (:class:`~skulk.api._request.Format`)."""

    include_usage: bool

    @property
    def prompt_param(self) -> str:
        return "messages"

    def renderer(self, model: str) -> ToolsRenderer:
        created = int(wall())
        return ToolsRenderer(new_request_id(CHAT_ID_PREFIX), created, model, self.include_usage)


@attrs.define
class ToolsRenderer:
    """See the module docstring."""

    id: str
    created: int
    model: str
    include_usage: bool
    _held: list[str] = attrs.Factory(list)

    def _chunk(self, delta: Mapping[str, object]) -> dict[str, object]:
        return chat_chunk(
            self.id,
            self.created,
            self.model,
            delta=delta,
            finish_reason=None,
            include_usage_field=self.include_usage,
        )

    def opening(self) -> list[Event]:
        role = chat_role_chunk(
            self.id, self.created, self.model, include_usage_field=self.include_usage
        )
        return [Event(role)]

    def delta(self, text: str) -> list[Event]:
        self._held.append(text)
        return []

    def closing(self, end: GenerationEnd) -> list[Event]:
        text, calls = self._answer(end)
        events = []
        if text:
            events.append(Event(self._chunk({"content": text})))
        for i, c in enumerate(calls):
            call = {"index": i, **call_objects([c])[0]}
            events.append(Event(self._chunk({"tool_calls": [call]})))
        last = self._chunk({})
        choices = last["choices"]
        assert isinstance(choices, list)
        choices[0]["finish_reason"] = self._reason(end, calls)
        events.append(Event(last))
        if self.include_usage:
            events.append(Event(chat_usage_chunk(self.id, self.created, self.model, end.usage)))
        return [*events, _DONE]

    def failure(self, err: ApiError) -> list[Event]:
        return [Event(err.envelope()), _DONE]

    def whole(self, text: str, end: GenerationEnd) -> dict[str, object]:
        self._held = [text]
        content, calls = self._answer(end)
        message: dict[str, object] = {"role": "assistant", "content": content or None}
        if calls:
            message["tool_calls"] = call_objects(calls)
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": self._reason(end, calls),
                }
            ],
            "usage": usage_object(end.usage),
        }

    def _answer(self, end: GenerationEnd) -> tuple[str, list[Call]]:
        text = "".join(self._held)
        return answer_calls(text, end)

    @staticmethod
    def _reason(end: GenerationEnd, calls: Sequence[Call]) -> str:
        return "tool_calls" if calls else openai_finish_reason(end.finish_reason)
