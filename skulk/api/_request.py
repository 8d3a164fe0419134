"""The one request type every client format is parsed into, and what a format renders (sans-IO).

Each wire format (OpenAI Chat Completions and Completions, OpenAI Responses, Anthropic
Messages, ...) has an adapter module with two halves:

* a **parser** turning the format's JSON body into a :class:`GenerateRequest` — the model, the
  prompt (:class:`~skulk.wire.runner.ChatPrompt` or :class:`~skulk.wire.runner.TextPrompt`), the
  :class:`~skulk.wire.runner.SamplingParams`, the stream flag, and a :class:`Format` holding
  whatever the format needs to answer (ids, echoed fields, stream options);
* a **renderer** (:meth:`Format.renderer`) turning our generation — text deltas, then one
  ``GenerationEnd`` — back into that format's stream events or whole response.

The driver in :mod:`skulk.api._stream` knows nothing of any format: it commits a stream once the
first item is here, asks the renderer for events, and ends a failed stream with the renderer's
:meth:`Renderer.failure` events. No format's logic lives outside its own module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs

from skulk.api._errors import ApiError
from skulk.wire.runner import GenerationEnd, Prompt, SamplingParams


@attrs.frozen
class Event:
    """One stream event: ``data`` (a JSON object, or a raw string such as OpenAI's ``[DONE]``)
    and, for formats with named SSE events (Responses, Anthropic), its ``name`` (the
    ``event:`` line). Over SSE it is framed by :func:`skulk.api._sse.sse_frame`."""

    data: Mapping[str, object] | str
    name: str | None = None


class Renderer(Protocol):
    """One request's output in one format; made per request by :meth:`Format.renderer` (so
    ids and timestamps are shared by its events). A stream is :meth:`opening`, :meth:`delta`
    for each non-empty piece of text (or empty one carrying log-probabilities: a
    :class:`~skulk.worker.ScoredText`, only for requests that asked), then :meth:`closing` —
    or, when generation fails after the stream started, :meth:`failure` instead of
    :meth:`closing`. Both end the format's stream
    (OpenAI's ``[DONE]``, Anthropic's ``message_stop``, Responses' ``response.completed``)."""

    def opening(self) -> list[Event]: ...

    def delta(self, text: str) -> list[Event]: ...

    def closing(self, end: GenerationEnd) -> list[Event]: ...

    def failure(self, err: ApiError) -> list[Event]: ...

    def whole(self, text: str, end: GenerationEnd) -> dict[str, object]:
        """The whole (non-streamed) response body."""
        ...


class Format(Protocol):
    """What a format's parser leaves for rendering: the renderer, and which request field a
    failure caused by the prompt (too long, empty) is blamed on."""

    @property
    def prompt_param(self) -> str: ...

    def renderer(self, model: str) -> Renderer: ...


@attrs.frozen
class GenerateRequest:
    """A validated request of any format, ready for the router: ``model`` (as the client named
    it), ``prompt`` and ``params`` for the runner, ``stream``, and the ``format`` that renders
    the answer."""

    model: str
    prompt: Prompt
    params: SamplingParams
    stream: bool
    format: Format
