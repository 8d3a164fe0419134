"""Formatting OpenAI Chat Completions and Completions responses, stream chunks and SSE (sans-IO).

Everything here is a pure function of its arguments: ids and timestamps are passed in
(:func:`new_request_id`, and ``created = int(time.time())`` taken once per request), so one
request's chunks share them and tests can pin them.

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

import json
import re
import secrets
from collections.abc import Mapping
from typing import Literal

import attrs

from skulk.wire.runner import FinishReason, Usage

OpenAIFinishReason = Literal["stop", "length"]

CHAT_ID_PREFIX = "chatcmpl"
COMPLETION_ID_PREFIX = "cmpl"

SSE_DONE = b"data: [DONE]\n\n"
"""The sentinel that ends an OpenAI SSE stream (after the last chunk, and after an error)."""

_SSE_LINE_BREAK = re.compile(r"\r\n|\r|\n")


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
    """OpenAI's ``usage`` object."""
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
    }


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
    id: str, created: int, model: str, text: str, finish_reason: FinishReason, usage: Usage
) -> dict[str, object]:
    """A whole (non-streamed) ``chat.completion`` object with one choice."""
    return {
        **_envelope("chat.completion", id, created, model),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": openai_finish_reason(finish_reason),
            }
        ],
        "usage": usage_object(usage),
    }


def chat_chunk(
    id: str,
    created: int,
    model: str,
    *,
    delta: Mapping[str, object],
    finish_reason: FinishReason | None,
    usage: Usage | None = None,
    include_usage_field: bool = False,
) -> dict[str, object]:
    """One ``chat.completion.chunk`` with one choice.

    ``include_usage_field`` adds ``"usage": null`` (what OpenAI sends on every chunk but the
    last when the request set ``stream_options.include_usage``); ``usage`` fills it instead.
    """
    chunk = {
        **_envelope("chat.completion.chunk", id, created, model),
        "choices": [
            {
                "index": 0,
                "delta": dict(delta),
                "logprobs": None,
                "finish_reason": _reason(finish_reason),
            }
        ],
    }
    return _with_usage(chunk, usage, include_usage_field)


def chat_role_chunk(
    id: str, created: int, model: str, *, include_usage_field: bool = False
) -> dict[str, object]:
    """The first chunk of a chat stream: the role, and empty content."""
    return chat_chunk(
        id,
        created,
        model,
        delta={"role": "assistant", "content": ""},
        finish_reason=None,
        include_usage_field=include_usage_field,
    )


def chat_content_chunk(
    id: str, created: int, model: str, text: str, *, include_usage_field: bool = False
) -> dict[str, object]:
    """A chunk adding ``text`` to the message."""
    return chat_chunk(
        id,
        created,
        model,
        delta={"content": text},
        finish_reason=None,
        include_usage_field=include_usage_field,
    )


def chat_finish_chunk(
    id: str,
    created: int,
    model: str,
    finish_reason: FinishReason,
    *,
    include_usage_field: bool = False,
) -> dict[str, object]:
    """The chunk that ends the choice: an empty delta and the finish reason."""
    return chat_chunk(
        id,
        created,
        model,
        delta={},
        finish_reason=finish_reason,
        include_usage_field=include_usage_field,
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
    id: str, created: int, model: str, text: str, finish_reason: FinishReason, usage: Usage
) -> dict[str, object]:
    """A whole (non-streamed) ``text_completion`` object with one choice."""
    return {
        **_envelope("text_completion", id, created, model),
        "choices": [
            {
                "text": text,
                "index": 0,
                "logprobs": None,
                "finish_reason": openai_finish_reason(finish_reason),
            }
        ],
        "usage": usage_object(usage),
    }


def completion_chunk(
    id: str,
    created: int,
    model: str,
    *,
    text: str,
    finish_reason: FinishReason | None,
    usage: Usage | None = None,
    include_usage_field: bool = False,
) -> dict[str, object]:
    """One streamed ``text_completion`` chunk with one choice (``finish_reason`` is null until
    the last one); ``usage`` / ``include_usage_field`` as for :func:`chat_chunk`."""
    chunk = {
        **_envelope("text_completion", id, created, model),
        "choices": [
            {
                "text": text,
                "index": 0,
                "logprobs": None,
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

    def opening(self) -> dict[str, object]:
        return chat_role_chunk(
            self.id, self.created, self.model, include_usage_field=self.include_usage
        )

    def content(self, text: str) -> dict[str, object]:
        return chat_content_chunk(
            self.id, self.created, self.model, text, include_usage_field=self.include_usage
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

    def content(self, text: str) -> dict[str, object]:
        return completion_chunk(
            self.id,
            self.created,
            self.model,
            text=text,
            finish_reason=None,
            include_usage_field=self.include_usage,
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


# ---- SSE framing -----------------------------------------------------------------------------


def sse_event(obj: Mapping[str, object] | str) -> bytes:
    """One server-sent event: ``data: <compact JSON>\\n\\n`` (a string is sent as is).

    A string containing line breaks becomes several ``data:`` lines, which SSE clients join
    back with ``\\n``; compact JSON never contains a raw line break. Non-finite floats raise
    :class:`ValueError` rather than emitting JSON that clients cannot parse.
    """
    if isinstance(obj, str):
        return _sse_frame(obj).encode("utf-8", "replace")
    try:
        return _sse_frame(_compact_json(obj, ensure_ascii=False)).encode()
    except UnicodeEncodeError:  # a lone surrogate (e.g. echoed from a request); escape it
        return _sse_frame(_compact_json(obj, ensure_ascii=True)).encode()


def _compact_json(obj: Mapping[str, object], *, ensure_ascii: bool) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=ensure_ascii, allow_nan=False)


def _sse_frame(data: str) -> str:
    return "".join(f"data: {line}\n" for line in _SSE_LINE_BREAK.split(data)) + "\n"
