"""Formatting OpenAI Chat Completions and Completions responses, stream chunks and SSE (sans-IO).

Everything here is a pure function of its arguments: ids and timestamps are passed in
(:func:`new_request_id`, and ``created = int(time.time())`` taken once per request), so one
request's chunks share them and tests can pin them. The one place that takes them is
:meth:`~skulk.api._openai_render.OpenAIFormat.renderer`, which makes the per-request renderer
the format-neutral driver (:mod:`skulk.api._stream`) uses (:mod:`skulk.api._openai_render`).

A streamed chat completion, as OpenAI sends it::

    data: {... "choices":[{"index":0,"delta":{"role":"assistant","content":""},...}]}
    data: {... "choices":[{"index":0,"delta":{"content":"Hel"},...}]}       (one per piece)
    data: {... "choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}
    data: {... "choices":[],"usage":{...}}                (only with include_usage)
    data: [DONE]

With ``stream_options.include_usage`` every chunk before the last carries ``"usage": null``.
:class:`ChatStream` and :class:`CompletionStream` produce exactly that sequence.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Literal

import attrs

from skulk.api._openai_logprobs import chat_logprobs, completion_logprobs
from skulk.wire.runner import FinishReason, Usage

OpenAIFinishReason = Literal["stop", "length"]

CHAT_ID_PREFIX = "chatcmpl"
COMPLETION_ID_PREFIX = "cmpl"

SSE_DONE = b"data: [DONE]\n\n"
"""The sentinel that ends an OpenAI SSE stream (after the last chunk, and after an error)."""


def new_request_id(kind: str) -> str:
    """A fresh response id such as ``chatcmpl-3f9c...``; ``kind`` is the prefix
    (:data:`CHAT_ID_PREFIX`, :data:`COMPLETION_ID_PREFIX`)."""
    return f"{kind}-{secrets.token_hex(12)}"


def openai_finish_reason(reason: FinishReason) -> OpenAIFinishReason:
    """The runner's finish reason as OpenAI spells it.

    ``"cancelled"`` raises :class:`ValueError`: the runner reports it only after we cancelled
    the request (the client went away, or a deadline passed), and then the client must get
    nothing, or an error (504 / an error event), never a response that looks complete.
    """
    if reason == "cancelled":
        raise ValueError("a cancelled request has no OpenAI finish_reason; send an error instead")
    return reason


def usage_object(usage: Usage) -> dict[str, object]:
    """OpenAI's ``usage`` object; ``prompt_tokens_details.cached_tokens`` when the runner's
    prefix cache supplied some of the prompt."""
    obj: dict[str, object] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }
    if usage.cached_tokens:
        obj["prompt_tokens_details"] = {"cached_tokens": usage.cached_tokens}
    return obj


def _envelope(object_: str, id: str, created: int, model: str) -> dict[str, object]:
    return {"id": id, "object": object_, "created": created, "model": model}


def _with_usage(
    chunk: dict[str, object], usage: Usage | None, include_usage_field: bool
) -> dict[str, object]:
    if usage is not None:
        chunk["usage"] = usage_object(usage)
    elif include_usage_field:
        chunk["usage"] = None
    return chunk


def _reason(reason: FinishReason | None) -> OpenAIFinishReason | None:
    return None if reason is None else openai_finish_reason(reason)


# ---- chat completions ------------------------------------------------------------------------


def chat_completion(
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: FinishReason,
    usage: Usage,
    *,
    logprobs: bool = False,
) -> dict[str, object]:
    """A whole (non-streamed) ``chat.completion`` object with one choice."""
    choice = [(text, finish_reason)]
    return whole_object("chat", id, created, model, choice, usage, logprobs=logprobs)


def whole_object(
    kind: Literal["chat", "completion"],
    id: str,
    created: int,
    model: str,
    choices: Sequence[tuple[str, FinishReason]],
    usage: Usage,
    *,
    logprobs: bool = False,
) -> dict[str, object]:
    """A whole ``chat.completion`` (``kind="chat"``) or ``text_completion`` object with one
    choice per ``(text, finish_reason)``, at ``index`` 0, 1, ...; ``usage`` covers them all.
    ``logprobs``: the request asked for them (each text carries its entries)."""
    items: list[dict[str, object]]
    if kind == "chat":
        object_ = "chat.completion"
        items = [{"message": {"role": "assistant", "content": text}} for text, _ in choices]
    else:
        object_ = "text_completion"
        items = [{"text": text} for text, _ in choices]
    return {
        **_envelope(object_, id, created, model),
        "choices": [
            {
                **item,
                "index": index,
                "logprobs": _whole_logprobs(kind, text) if logprobs else None,
                "finish_reason": openai_finish_reason(finish_reason),
            }
            for index, (item, (text, finish_reason)) in enumerate(zip(items, choices, strict=True))
        ],
        "usage": usage_object(usage),
    }


def _whole_logprobs(kind: Literal["chat", "completion"], text: str) -> dict[str, object]:
    return chat_logprobs(text) if kind == "chat" else completion_logprobs(text)[0]


def chat_chunk(
    id: str,
    created: int,
    model: str,
    *,
    delta: Mapping[str, object],
    finish_reason: FinishReason | None,
    usage: Usage | None = None,
    include_usage_field: bool = False,
    index: int = 0,
    logprobs: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """One ``chat.completion.chunk`` with one choice (``index``: which, when the request asked
    for ``n`` > 1).

    ``include_usage_field`` adds ``"usage": null`` (what OpenAI sends on every chunk but the
    last when the request set ``stream_options.include_usage``); ``usage`` fills it instead.
    """
    chunk = {
        **_envelope("chat.completion.chunk", id, created, model),
        "choices": [
            {
                "index": index,
                "delta": dict(delta),
                "logprobs": None if logprobs is None else dict(logprobs),
                "finish_reason": _reason(finish_reason),
            }
        ],
    }
    return _with_usage(chunk, usage, include_usage_field)


def chat_role_chunk(
    id: str, created: int, model: str, *, include_usage_field: bool = False, index: int = 0
) -> dict[str, object]:
    """The first chunk of a chat stream (of choice ``index``): the role, and empty content."""
    return chat_chunk(
        id,
        created,
        model,
        delta={"role": "assistant", "content": ""},
        finish_reason=None,
        include_usage_field=include_usage_field,
        index=index,
    )


def chat_content_chunk(
    id: str,
    created: int,
    model: str,
    text: str,
    *,
    include_usage_field: bool = False,
    index: int = 0,
    logprobs: bool = False,
) -> dict[str, object]:
    """A chunk adding ``text`` to the message (of choice ``index``); ``logprobs``: with the
    entries ``text`` carries."""
    return chat_chunk(
        id,
        created,
        model,
        delta={"content": text},
        finish_reason=None,
        include_usage_field=include_usage_field,
        index=index,
        logprobs=chat_logprobs(text) if logprobs else None,
    )


def chat_finish_chunk(
    id: str,
    created: int,
    model: str,
    finish_reason: FinishReason,
    *,
    include_usage_field: bool = False,
    index: int = 0,
) -> dict[str, object]:
    """The chunk that ends the choice (``index``): an empty delta and the finish reason."""
    return chat_chunk(
        id,
        created,
        model,
        delta={},
        finish_reason=finish_reason,
        include_usage_field=include_usage_field,
        index=index,
    )


def chat_usage_chunk(id: str, created: int, model: str, usage: Usage) -> dict[str, object]:
    """The last chunk when ``include_usage`` was asked: no choices, just the usage."""
    return {
        **_envelope("chat.completion.chunk", id, created, model),
        "choices": [],
        "usage": usage_object(usage),
    }


# ---- legacy completions ----------------------------------------------------------------------


def completion(
    id: str,
    created: int,
    model: str,
    text: str,
    finish_reason: FinishReason,
    usage: Usage,
    *,
    logprobs: bool = False,
) -> dict[str, object]:
    """A whole (non-streamed) ``text_completion`` object with one choice."""
    choice = [(text, finish_reason)]
    return whole_object("completion", id, created, model, choice, usage, logprobs=logprobs)


def completion_chunk(
    id: str,
    created: int,
    model: str,
    *,
    text: str,
    finish_reason: FinishReason | None,
    usage: Usage | None = None,
    include_usage_field: bool = False,
    index: int = 0,
    logprobs: Mapping[str, object] | None = None,
) -> dict[str, object]:
    """One streamed ``text_completion`` chunk with one choice (``finish_reason`` is null until
    the last one); ``usage`` / ``include_usage_field`` / ``index`` / ``logprobs`` as for
    :func:`chat_chunk`."""
    chunk = {
        **_envelope("text_completion", id, created, model),
        "choices": [
            {
                "text": text,
                "index": index,
                "logprobs": None if logprobs is None else dict(logprobs),
                "finish_reason": _reason(finish_reason),
            }
        ],
    }
    return _with_usage(chunk, usage, include_usage_field)


def completion_usage_chunk(id: str, created: int, model: str, usage: Usage) -> dict[str, object]:
    """The last chunk when ``include_usage`` was asked: no choices, just the usage."""
    return {
        **_envelope("text_completion", id, created, model),
        "choices": [],
        "usage": usage_object(usage),
    }


# ---- stream sequencing -----------------------------------------------------------------------


@attrs.frozen
class ChatStream:
    """The chunks of one streamed chat completion, in OpenAI's order.

    Send :meth:`opening`, then :meth:`content` for each non-empty piece of text (the runner may
    report empty pieces while it holds back a partial character or a possible stop string;
    skip those), then every chunk of :meth:`closing`, then :data:`SSE_DONE`.
    """

    id: str
    created: int
    model: str
    include_usage: bool
    logprobs: bool = False

    def opening(self) -> dict[str, object]:
        return chat_role_chunk(
            self.id, self.created, self.model, include_usage_field=self.include_usage
        )

    def content(self, text: str, index: int = 0) -> dict[str, object]:
        return chat_content_chunk(
            self.id,
            self.created,
            self.model,
            text,
            include_usage_field=self.include_usage,
            index=index,
            logprobs=self.logprobs,
        )

    def closing(self, finish_reason: FinishReason, usage: Usage) -> list[dict[str, object]]:
        chunks = [
            chat_finish_chunk(
                self.id,
                self.created,
                self.model,
                finish_reason,
                include_usage_field=self.include_usage,
            )
        ]
        if self.include_usage:
            chunks.append(chat_usage_chunk(self.id, self.created, self.model, usage))
        return chunks


@attrs.frozen
class CompletionStream:
    """The chunks of one streamed legacy completion, in OpenAI's order.

    Send :meth:`content` for each non-empty piece of text, then every chunk of :meth:`closing`,
    then :data:`SSE_DONE`. (Legacy completions have no opening chunk.)
    """

    id: str
    created: int
    model: str
    include_usage: bool
    logprobs: bool = False
    #: Per choice index, the characters its ``text_offset`` counts so far (a stream's state).
    offsets: dict[int, int] = attrs.field(factory=dict, eq=False)

    def content(self, text: str, index: int = 0) -> dict[str, object]:
        logprobs = None
        if self.logprobs:
            logprobs, self.offsets[index] = completion_logprobs(text, self.offsets.get(index, 0))
        return completion_chunk(
            self.id,
            self.created,
            self.model,
            text=text,
            finish_reason=None,
            include_usage_field=self.include_usage,
            index=index,
            logprobs=logprobs,
        )

    def closing(self, finish_reason: FinishReason, usage: Usage) -> list[dict[str, object]]:
        chunks = [
            completion_chunk(
                self.id,
                self.created,
                self.model,
                text="",
                finish_reason=finish_reason,
                include_usage_field=self.include_usage,
            )
        ]
        if self.include_usage:
            chunks.append(completion_usage_chunk(self.id, self.created, self.model, usage))
        return chunks
