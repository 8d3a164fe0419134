"""Turning one generation into OpenAI-shaped output (shared by HTTP, SSE and WebSocket).

A streamed request is committed only once its first item has arrived (:func:`open_stream`):
whatever fails before that — model not ready, prompt too long, any runner failure — is a plain
error response (or one WebSocket error message), never a stream that starts and then fails.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing

import trio

from skulk.api._openai import (
    CHAT_ID_PREFIX,
    COMPLETION_ID_PREFIX,
    SSE_DONE,
    ApiError,
    ChatCompletionsRequest,
    ChatStream,
    CompletionsRequest,
    CompletionStream,
    chat_completion,
    completion,
    new_request_id,
    sse_event,
)
from skulk.routing import ModelNotPlaced, NoReadyInstance, Overloaded, RemoteUnavailable
from skulk.worker import Generation, ModelUnavailable, RequestFailure

log = logging.getLogger("skulk.api")

Request = ChatCompletionsRequest | CompletionsRequest

#: Runner failure reasons caused by the request's prompt: 400 naming it.
_PROMPT_REASONS = {"prompt_too_long", "empty_prompt"}
#: Runner failure reasons caused by the request otherwise (a value the runner cannot serve):
#: 400 with no single field to blame.
_REQUEST_REASONS = {"invalid_request"}
#: Runner deadlines that ended a request: 504, as for any deadline.
_DEADLINE_REASONS = {"runner_wedged", "cancel_timeout"}
#: The node serving the request was lost (link down, node dead): 502, a bad upstream.
_LOST_REASONS = {"node_unreachable", "route_refused"}

Items = AsyncGenerator[str | Generation, None]
"""One request's generation: text deltas, then one :class:`Generation`."""
ROUTING_ERRORS = (ModelNotPlaced, NoReadyInstance, Overloaded, RemoteUnavailable)
#: Everything serving a request may raise that the client sees as a typed error.
SERVING_ERRORS = (ModelUnavailable, RequestFailure, *ROUTING_ERRORS)


def unavailable_error(exc: ModelUnavailable) -> ApiError:
    s = exc.status
    detail = f" ({s.loaded}/{s.total})" if s.state == "loading" and s.total else ""
    why = f"; last failure: {s.failure_reason}: {s.failure_message}" if s.failure_reason else ""
    return ApiError.unavailable(
        f"model {s.model_id} is not ready: {s.state}{detail}{why}", code="model_not_ready"
    )


def routing_error(exc: Exception) -> ApiError:
    """A routing failure (no instance, none ready, overloaded, the serving node gone) as the
    client sees it."""
    if isinstance(exc, ModelNotPlaced):
        if not exc.registered:
            return ApiError.model_not_found(exc.model)
        return ApiError.unavailable(str(exc), code="no_instance")
    if isinstance(exc, NoReadyInstance):
        return ApiError.unavailable(str(exc), code="model_not_ready")
    if isinstance(exc, Overloaded):
        retry = max(1, math.ceil(exc.retry_after))
        err = ApiError.over_capacity(f"{exc}; retry in {retry} s")
        err.headers = {"Retry-After": str(retry)}
        return err
    if isinstance(exc, RemoteUnavailable):
        return ApiError.unavailable(str(exc), code="model_not_ready")
    return ApiError.server_error(str(exc), code="internal")


def serving_error(exc: Exception, request: Request) -> ApiError:
    """Any failure of serving ``request`` as the client sees it."""
    if isinstance(exc, ModelUnavailable):
        return unavailable_error(exc)
    if isinstance(exc, RequestFailure):
        return failure_error(exc, request)
    return routing_error(exc)


def failure_error(exc: RequestFailure, request: Request) -> ApiError:
    """Map a typed request failure to what the client sees."""
    if exc.reason in _PROMPT_REASONS:
        param = "prompt" if isinstance(request, CompletionsRequest) else "messages"
        return ApiError.invalid(param, exc.message, code=exc.reason)
    if exc.reason in _REQUEST_REASONS:
        return ApiError.invalid(None, exc.message, code=exc.reason)
    message = f"generation failed: {exc.reason}: {exc.message}"
    if exc.reason in _DEADLINE_REASONS:
        return ApiError(504, message, type="timeout_error", code=exc.reason)
    if exc.reason in _LOST_REASONS:
        return ApiError(502, message, type="server_error", code=exc.reason)
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


class OpenedStream:
    """A streamed generation whose first item has arrived: the point where a stream may start.

    Made by :func:`open_stream`, which raises :class:`ApiError` instead when the generation
    fails before any output (model not ready, prompt too long, runner failure): the caller
    answers that as a plain error, before any stream was committed.

    An ``OpenedStream`` owns a running generation on a runner. Iterate :meth:`chunks` at most
    once, and always :meth:`aclose` it — also when :meth:`chunks` was never iterated (the client
    went away before the response body started): closing cancels the request on the runner.
    ``aclose`` is idempotent; an HTTP handler hands it to
    :func:`~skulk.api._guard.close_with_request` so it runs whatever becomes of the response.
    """

    def __init__(
        self,
        request: Request,
        items: AsyncGenerator[str | Generation, None],
        first: str | Generation,
    ) -> None:
        self._out = Output(request)
        self._items = items
        self._first: str | Generation | None = first

    async def chunks(self) -> AsyncGenerator[dict[str, object], None]:
        """The OpenAI chunks: the opening chunk (chat), the first item's, then the rest.
        Raises :class:`ApiError` if the generation fails mid-way."""
        out = self._out
        if isinstance(out.stream, ChatStream):
            yield out.stream.opening()
        first, self._first = self._first, None
        if first is None:
            raise RuntimeError("OpenedStream.chunks() iterated twice")
        try:
            for chunk in self._emit(first):
                yield chunk
            if isinstance(first, Generation):
                return
            async for item in self._items:
                for chunk in self._emit(item):
                    yield chunk
                if isinstance(item, Generation):
                    return
        except SERVING_ERRORS as exc:
            raise serving_error(exc, out.request) from exc
        raise ApiError.server_error("generation ended without a result", code="internal")

    def _emit(self, item: str | Generation) -> list[dict[str, object]]:
        if isinstance(item, Generation):
            return self._out.stream.closing(item.finish_reason, item.usage)
        return [self._out.stream.content(item)] if item else []

    async def aclose(self) -> None:
        """Stop the generation if it still runs (cancels it on the runner); idempotent."""
        await self._items.aclose()


async def open_stream(items: Items, request: Request) -> OpenedStream:
    """Start ``request``'s generation (``items``, not started yet) and wait for its first item
    (text or the end).

    Raises :class:`ApiError` if it fails first — nothing is left running then. Otherwise the
    caller owns the returned :class:`OpenedStream` and must close it.
    """
    try:
        first = await anext(items)
    except StopAsyncIteration:
        raise ApiError.server_error("generation ended without a result", code="internal") from None
    except SERVING_ERRORS as exc:
        raise serving_error(exc, request) from exc
    except BaseException:  # cancelled while waiting, or a bug: leave nothing running
        with trio.CancelScope(shield=True):
            await items.aclose()
        raise
    return OpenedStream(request, items, first)


async def sse_body(opened: OpenedStream) -> AsyncGenerator[bytes, None]:
    """The SSE body of an opened stream: ``data:`` events, then ``data: [DONE]``.

    A failure after the stream started (the runner crashed, a deadline) ends it with an error
    event, then ``[DONE]``, never with a cut connection. Closes ``opened`` when it ends.
    """
    try:
        async with aclosing(opened.chunks()) as chunks:
            async for chunk in chunks:
                yield sse_event(chunk)
    except ApiError as exc:
        yield sse_event(exc.envelope())
    except Exception:
        log.exception("a stream failed after it started")
        yield sse_event(ApiError.server_error("internal server error", code="internal").envelope())
    finally:
        await opened.aclose()
    yield SSE_DONE


async def complete(items: Items, request: Request) -> dict[str, object]:
    """The whole response of a non-streamed request (``items``: its generation, not started
    yet). Raises :class:`ApiError`."""
    out = Output(request)
    parts: list[str] = []
    try:
        async with aclosing(items):
            async for item in items:
                if isinstance(item, Generation):
                    return out.whole("".join(parts), item)
                parts.append(item)
    except SERVING_ERRORS as exc:
        raise serving_error(exc, request) from exc
    raise ApiError.server_error("generation ended without a result", code="internal")
