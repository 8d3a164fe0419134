"""OpenAI's Responses format (``POST /v1/responses``): its answers, sans-IO.

:class:`ResponsesRenderer` answers with a ``response`` object (``status`` ``completed``, or
``incomplete`` with ``incomplete_details.reason = "max_output_tokens"`` when the token limit
ended it), or streams OpenAI's named events, each ``event: <type>`` with ``data`` carrying the
same ``type`` and a ``sequence_number`` counting from 0::

    response.created, response.in_progress, response.output_item.added,
    response.content_part.added, response.output_text.delta…, response.output_text.done,
    response.content_part.done, response.output_item.done,
    response.completed (or response.incomplete)

A failure after the stream started sends ``error`` (code, message, param) then
``response.failed`` (the response with ``status: "failed"`` and its ``error``).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping

import attrs

from skulk.api._errors import ApiError
from skulk.api._openai_logprobs import chat_logprobs
from skulk.api._request import Event
from skulk.clock import wall
from skulk.wire.runner import GenerationEnd
from skulk.worker import join_scored


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"


@attrs.frozen
class ResponsesFormat:
    """What a Responses answer echoes of its request (:class:`~skulk.api._request.Format`)."""

    instructions: str | None
    max_output_tokens: int | None
    temperature: float
    top_p: float
    metadata: Mapping[str, object]
    user: str | None
    tool_choice: str
    text_format: Mapping[str, object] = attrs.field(factory=lambda: {"type": "text"})
    top_logprobs: int = 0
    logprobs: bool = False  # each output_text part and delta carries its tokens' entries

    @property
    def prompt_param(self) -> str:
        return "input"

    def renderer(self, model: str) -> ResponsesRenderer:
        return ResponsesRenderer(self, model, _new_id("resp"), _new_id("msg"), wall())


def _usage(end: GenerationEnd) -> dict[str, object]:
    u = end.usage
    return {
        "input_tokens": u.prompt_tokens,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": u.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    }


def _error_code(err: ApiError) -> str:
    """``response.error.code``: OpenAI's closed set (the client's model lists it)."""
    if err.status == 429:
        return "rate_limit_exceeded"
    return "invalid_prompt" if err.status < 500 else "server_error"


@attrs.define
class ResponsesRenderer:
    """One response's events or whole object (:class:`~skulk.api._request.Renderer`)."""

    format: ResponsesFormat
    model: str
    id: str
    item_id: str
    created_at: float
    _sequence: int = 0
    _text: list[str] = attrs.Factory(list)

    def response(
        self,
        status: str,
        output: list[dict[str, object]],
        end: GenerationEnd | None = None,
        error: ApiError | None = None,
    ) -> dict[str, object]:
        """The ``response`` object in its ``status`` (``in_progress``, ``completed``,
        ``incomplete``, ``failed``)."""
        f = self.format
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "completed_at": wall() if status in ("completed", "incomplete") else None,
            "background": False,
            "error": None
            if error is None
            else {"code": _error_code(error), "message": error.message},
            "incomplete_details": incomplete,
            "instructions": f.instructions,
            "max_output_tokens": f.max_output_tokens,
            "max_tool_calls": None,
            "metadata": dict(f.metadata),
            "model": self.model,
            "output": output,
            "parallel_tool_calls": True,
            "previous_response_id": None,
            "reasoning": None,
            "service_tier": "default",
            "store": False,
            "temperature": f.temperature,
            "text": {"format": dict(f.text_format), "verbosity": "medium"},
            "tool_choice": f.tool_choice,
            "tools": [],
            "top_logprobs": f.top_logprobs,
            "top_p": f.top_p,
            "truncation": "disabled",
            "usage": None if end is None else _usage(end),
            "user": f.user,
        }

    def _logprobs(self, text: str) -> object:
        """``text``'s entries, shaped as chat's ``logprobs.content`` (the same in Responses)."""
        return chat_logprobs(text)["content"] if self.format.logprobs else []

    def _part(self, text: str) -> dict[str, object]:
        logprobs = self._logprobs(text)
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}

    def _item(self, status: str, content: list[dict[str, object]]) -> dict[str, object]:
        return {
            "id": self.item_id,
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": content,
        }

    def _event(self, name: str, **data: object) -> Event:
        event = Event({"type": name, "sequence_number": self._sequence, **data}, name=name)
        self._sequence += 1
        return event

    def _where(self) -> dict[str, object]:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0}

    @staticmethod
    def _status(end: GenerationEnd) -> str:
        return "incomplete" if end.finish_reason == "length" else "completed"

    def opening(self) -> list[Event]:
        return [
            self._event("response.created", response=self.response("in_progress", [])),
            self._event("response.in_progress", response=self.response("in_progress", [])),
            self._event(
                "response.output_item.added", output_index=0, item=self._item("in_progress", [])
            ),
            self._event("response.content_part.added", **self._where(), part=self._part("")),
        ]

    def delta(self, text: str) -> list[Event]:
        self._text.append(text)
        logprobs = self._logprobs(text)
        delta = self._event(
            "response.output_text.delta", **self._where(), delta=text, logprobs=logprobs
        )
        return [delta]

    def closing(self, end: GenerationEnd) -> list[Event]:
        text = join_scored(self._text)
        status = self._status(end)
        item = self._item(status, [self._part(text)])
        return [
            self._event(
                "response.output_text.done",
                **self._where(),
                text=text,
                logprobs=self._logprobs(text),
            ),
            self._event("response.content_part.done", **self._where(), part=self._part(text)),
            self._event("response.output_item.done", output_index=0, item=item),
            self._event(f"response.{status}", response=self.response(status, [item], end)),
        ]

    def failure(self, err: ApiError) -> list[Event]:
        item = self._item("incomplete", [self._part("".join(self._text))])
        return [
            self._event("error", code=err.code, message=err.message, param=err.param),
            self._event("response.failed", response=self.response("failed", [item], error=err)),
        ]

    def whole(self, text: str, end: GenerationEnd) -> dict[str, object]:
        status = self._status(end)
        return self.response(status, [self._item(status, [self._part(text)])], end)
