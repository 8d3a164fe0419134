"""Turning one generation into OpenAI-shaped output (shared by HTTP, SSE and WebSocket)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from skulk.api._openai import (
    CHAT_ID_PREFIX,
    COMPLETION_ID_PREFIX,
    ApiError,
    ChatCompletionsRequest,
    ChatStream,
    CompletionsRequest,
    CompletionStream,
    chat_completion,
    completion,
    new_request_id,
)
from skulk.worker import Generation, ModelService, ModelUnavailable, RequestFailure

Request = ChatCompletionsRequest | CompletionsRequest

#: Runner failure reasons caused by the request itself: 400 naming this field.
_CLIENT_REASONS = {"prompt_too_long", "empty_prompt"}
#: Runner deadlines that ended a request: 504, as for any deadline.
_DEADLINE_REASONS = {"runner_wedged", "cancel_timeout"}


def unavailable_error(exc: ModelUnavailable) -> ApiError:
    s = exc.status
    detail = f" ({s.loaded}/{s.total})" if s.state == "loading" and s.total else ""
    why = f"; last failure: {s.failure_reason}: {s.failure_message}" if s.failure_reason else ""
    return ApiError.unavailable(
        f"model {s.model_id} is not ready: {s.state}{detail}{why}", code="model_not_ready"
    )


def failure_error(exc: RequestFailure, request: Request) -> ApiError:
    """Map a typed request failure to what the client sees."""
    if exc.reason in _CLIENT_REASONS:
        param = "prompt" if isinstance(request, CompletionsRequest) else "messages"
        return ApiError.invalid(param, exc.message, code=exc.reason)
    message = f"generation failed: {exc.reason}: {exc.message}"
    if exc.reason in _DEADLINE_REASONS:
        return ApiError(504, message, type="timeout_error", code=exc.reason)
    return ApiError.server_error(message, code=exc.reason)


class Output:
    """The chunks (or the whole response) of one request, in OpenAI's shapes."""

    def __init__(self, request: Request) -> None:
        self.request = request
        created = int(time.time())
        self.stream: ChatStream | CompletionStream
        if isinstance(request, ChatCompletionsRequest):
            self.id = new_request_id(CHAT_ID_PREFIX)
            self.stream = ChatStream(self.id, created, request.model, request.include_usage)
        else:
            self.id = new_request_id(COMPLETION_ID_PREFIX)
            self.stream = CompletionStream(self.id, created, request.model, request.include_usage)
        self.created = created

    def whole(self, text: str, end: Generation) -> dict[str, object]:
        make = chat_completion if isinstance(self.request, ChatCompletionsRequest) else completion
        return make(self.id, self.created, self.request.model, text, end.finish_reason, end.usage)


async def stream_chunks(
    service: ModelService, request: Request
) -> AsyncIterator[dict[str, object]]:
    """Chunks of one streamed generation. Raises :class:`ApiError` if it fails (before or
    mid-way); leaving early cancels the generation."""
    out = Output(request)
    if isinstance(out.stream, ChatStream):
        yield out.stream.opening()
    try:
        async with aclosing(service.generate(request.prompt, request.params)) as items:
            async for item in items:
                if isinstance(item, Generation):
                    for chunk in out.stream.closing(item.finish_reason, item.usage):
                        yield chunk
                elif item:
                    yield out.stream.content(item)
    except ModelUnavailable as exc:
        raise unavailable_error(exc) from exc
    except RequestFailure as exc:
        raise failure_error(exc, request) from exc


async def complete(service: ModelService, request: Request) -> dict[str, object]:
    """The whole response of a non-streamed request. Raises :class:`ApiError`."""
    out = Output(request)
    parts: list[str] = []
    try:
        async with aclosing(service.generate(request.prompt, request.params)) as items:
            async for item in items:
                if isinstance(item, Generation):
                    return out.whole("".join(parts), item)
                parts.append(item)
    except ModelUnavailable as exc:
        raise unavailable_error(exc) from exc
    except RequestFailure as exc:
        raise failure_error(exc, request) from exc
    raise ApiError.server_error("generation ended without a result", code="internal")
