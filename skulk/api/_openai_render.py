"""The OpenAI formats as renderers of the format-neutral driver (:mod:`skulk.api._stream`):
:class:`OpenAIFormat` (the :class:`~skulk.api._request.Format` of a chat or legacy completion),
:class:`OpenAIRenderer` (one choice) and :class:`OpenAIChoicesRenderer` (``n`` > 1), built on the
chunks and objects of :mod:`skulk.api._openai_format`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import attrs

from skulk.api._errors import ApiError
from skulk.api._openai_format import (
    CHAT_ID_PREFIX,
    COMPLETION_ID_PREFIX,
    ChatStream,
    CompletionStream,
    chat_completion,
    chat_finish_chunk,
    chat_role_chunk,
    chat_usage_chunk,
    completion,
    completion_chunk,
    completion_usage_chunk,
    new_request_id,
    whole_object,
)
from skulk.api._request import Event
from skulk.clock import wall
from skulk.wire.runner import GenerationEnd, Usage

_DONE = Event("[DONE]")


@attrs.frozen
class OpenAIFormat:
    """How to answer a chat completion (``kind="chat"``) or a legacy completion
    (``kind="completion"``): :class:`~skulk.api._request.Format`. ``choices`` is the request's
    ``n``: above 1, :mod:`skulk.api._choices` serves it and renders it with
    :meth:`choices_renderer`."""

    kind: Literal["chat", "completion"]
    include_usage: bool
    choices: int = 1
    logprobs: bool = False

    @property
    def prompt_param(self) -> str:
        return "messages" if self.kind == "chat" else "prompt"

    def renderer(self, model: str) -> OpenAIRenderer:
        return OpenAIRenderer(self._stream(model))

    def choices_renderer(self, model: str) -> OpenAIChoicesRenderer:
        """The renderer of a request with ``n`` > 1 (every choice shares one id)."""
        return OpenAIChoicesRenderer(self._stream(model))

    def _stream(self, model: str) -> ChatStream | CompletionStream:
        created = int(wall())
        if self.kind == "chat":
            chat_id = new_request_id(CHAT_ID_PREFIX)
            return ChatStream(chat_id, created, model, self.include_usage, self.logprobs)
        completion_id = new_request_id(COMPLETION_ID_PREFIX)
        return CompletionStream(completion_id, created, model, self.include_usage, self.logprobs)


@attrs.frozen
class OpenAIRenderer:
    """A chat or legacy completion's chunks (:class:`ChatStream`, :class:`CompletionStream`)
    or whole object. A stream ends with ``[DONE]``; a failed one with the error envelope as a
    ``data:`` event, then ``[DONE]``."""

    stream: ChatStream | CompletionStream

    def opening(self) -> list[Event]:
        return [Event(self.stream.opening())] if isinstance(self.stream, ChatStream) else []

    def delta(self, text: str) -> list[Event]:
        return [Event(self.stream.content(text))]

    def closing(self, end: GenerationEnd) -> list[Event]:
        return [*map(Event, self.stream.closing(end.finish_reason, end.usage)), _DONE]

    def failure(self, err: ApiError) -> list[Event]:
        return [Event(err.envelope()), _DONE]

    def whole(self, text: str, end: GenerationEnd) -> dict[str, object]:
        s = self.stream
        make = chat_completion if isinstance(s, ChatStream) else completion
        return make(
            s.id, s.created, s.model, text, end.finish_reason, end.usage, logprobs=s.logprobs
        )


@attrs.frozen
class OpenAIChoicesRenderer:
    """The chunks (or whole object) of a chat or legacy completion with ``n`` > 1 choices
    (:class:`skulk.api._choices.ChoicesRenderer`), in OpenAI's shape: every chunk carries one
    choice, its own ``index``; chat sends a role chunk per index; each choice ends with its
    own finish chunk; the usage chunk (with ``include_usage``) and ``[DONE]`` come once, after
    the last choice ended."""

    stream: ChatStream | CompletionStream

    def opening(self, index: int) -> list[Event]:
        s = self.stream
        if not isinstance(s, ChatStream):
            return []  # legacy completions have no opening chunk
        role = chat_role_chunk(
            s.id, s.created, s.model, include_usage_field=s.include_usage, index=index
        )
        return [Event(role)]

    def delta(self, index: int, text: str) -> list[Event]:
        return [Event(self.stream.content(text, index))]

    def finish(self, index: int, end: GenerationEnd) -> list[Event]:
        s = self.stream
        if isinstance(s, ChatStream):
            chunk = chat_finish_chunk(
                s.id,
                s.created,
                s.model,
                end.finish_reason,
                include_usage_field=s.include_usage,
                index=index,
            )
        else:
            chunk = completion_chunk(
                s.id,
                s.created,
                s.model,
                text="",
                finish_reason=end.finish_reason,
                include_usage_field=s.include_usage,
                index=index,
            )
        return [Event(chunk)]

    def closing(self, usage: Usage) -> list[Event]:
        s = self.stream
        if not s.include_usage:
            return [_DONE]
        make = chat_usage_chunk if isinstance(s, ChatStream) else completion_usage_chunk
        return [Event(make(s.id, s.created, s.model, usage)), _DONE]

    def failure(self, err: ApiError) -> list[Event]:
        return [Event(err.envelope()), _DONE]

    def whole(
        self, choices: Sequence[tuple[str, GenerationEnd]], usage: Usage
    ) -> dict[str, object]:
        s = self.stream
        kind: Literal["chat", "completion"] = "chat" if isinstance(s, ChatStream) else "completion"
        ends = [(text, end.finish_reason) for text, end in choices]
        return whole_object(kind, s.id, s.created, s.model, ends, usage, logprobs=s.logprobs)
