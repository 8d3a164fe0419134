"""Ollama tool calling: ``tools`` on ``/api/chat``, assistant ``tool_calls`` and ``tool`` turns
in messages, and answers carrying ``message.tool_calls`` (sans-IO).

``tools`` has OpenAI's function shape (read by :func:`skulk.api._openai_tools.parse_tools`).
Ollama has no ``tool_choice``: the model decides whether to call (our ``auto``), so nothing is
forced. A ``tool`` turn names its tool (``tool_name``) instead of a call id: that name is what
the prompt carries as its ``tool_call_id``.

An answer that may call a tool is rendered by :class:`ToolsRenderer`: its text is held back to
the end; calls read from it (:func:`skulk.api._tool_calls.answer_calls`) go out in one line with
``message.tool_calls`` (``[{"id", "function": {"index", "name", "arguments"}}]``, arguments
an object), before the last line, as Ollama streams them.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import attrs

from skulk.api._errors import ApiError
from skulk.api._request import Event
from skulk.api._tool_calls import Call, answer_calls, checked_object, objects
from skulk.wire.runner import GenerationEnd, ToolCall

_CALL_KEYS = frozenset({"id", "type", "function"})
_FUNCTION_KEYS = frozenset({"name", "arguments", "index"})


def parse_calls_field(value: object, param: str) -> tuple[ToolCall, ...]:
    """An assistant turn's ``tool_calls``: ``[{"function": {"name", "arguments"}}]`` with the
    arguments an object (``id`` optional)."""
    calls = []
    for i, (where, item) in enumerate(objects(value, param, _CALL_KEYS)):
        function = checked_object(item.get("function"), f"{where}.function", _FUNCTION_KEYS)
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str):
            raise ApiError.invalid_type(f"{where}.function.name", "a string", name)
        if not isinstance(arguments, dict):
            raise ApiError.invalid_type(f"{where}.function.arguments", "an object", arguments)
        call_id = item.get("id")
        if call_id is not None and not isinstance(call_id, str):
            raise ApiError.invalid_type(f"{where}.id", "a string", call_id)
        text = json.dumps(arguments, ensure_ascii=False)
        calls.append(ToolCall(call_id or f"call_{i}", name, text))
    return tuple(calls)


def call_objects(calls: list[Call]) -> list[dict[str, object]]:
    return [
        {"id": c.id, "function": {"index": i, "name": c.name, "arguments": c.input}}
        for i, c in enumerate(calls)
    ]


@attrs.define
class ToolsRenderer:
    """See the module docstring. ``line(text)`` and ``last(end, text)`` make the format's
    lines (:func:`skulk.api._ollama_format.delta` and :func:`~skulk.api._ollama_format.final`
    bound to the request); ``failure_line`` its error line."""

    line: Callable[[str], dict[str, object]]
    last: Callable[[GenerationEnd, str], dict[str, object]]
    failure_line: Callable[[ApiError], dict[str, object]]
    _held: list[str] = attrs.Factory(list)

    def opening(self) -> list[Event]:
        return []

    def delta(self, text: str) -> list[Event]:
        self._held.append(text)
        return []

    def _answer(self, end: GenerationEnd) -> tuple[str, list[Call]]:
        text = "".join(self._held)
        return answer_calls(text, end)

    def _with_calls(self, body: dict[str, object], calls: list[Call]) -> dict[str, object]:
        message = body.get("message")
        if calls and isinstance(message, dict):
            message["tool_calls"] = call_objects(calls)
        return body

    def closing(self, end: GenerationEnd) -> list[Event]:
        text, calls = self._answer(end)
        lines = [Event(self._with_calls(self.line(text), calls))] if text or calls else []
        return [*lines, Event(self.last(end, ""))]

    def failure(self, err: ApiError) -> list[Event]:
        return [Event(self.failure_line(err))]

    def whole(self, text: str, end: GenerationEnd) -> dict[str, object]:
        self._held = [text]
        content, calls = self._answer(end)
        return self._with_calls(self.last(end, content), calls)
