"""Driving one generation to the client, in whichever format the request speaks.

Format-neutral: a request's :class:`~skulk.api._request.Format` makes the renderer that turns
our items (text deltas, then one ``GenerationEnd``) into its events or its
whole response; this module decides *when*. A streamed request is committed only once its first
item has arrived (:func:`open_stream`): whatever fails before that — model not ready, prompt too
long, any runner failure — is a plain error response (or one WebSocket error message), never a
stream that starts and then fails. After that, a failure ends the stream with the format's own
error events (:meth:`~skulk.api._request.Renderer.failure`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncGenerator, Awaitable
from contextlib import aclosing
from typing import Protocol

import trio

from skulk.api._errors import ApiError
from skulk.api._request import Event, GenerateRequest, Renderer
from skulk.api._sse import sse_frame
from skulk.routing import ModelNotPlaced, NoReadyInstance, Overloaded, RemoteUnavailable
from skulk.wire.runner import GenerationEnd
from skulk.worker import ModelUnavailable, RequestFailure, join_scored, logprobs_of

log = logging.getLogger("skulk.api")

Request = GenerateRequest

#: Runner failure reasons caused by the request's prompt: 400 naming it.
_PROMPT_REASONS = {"prompt_too_long", "empty_prompt"}
#: Runner failure reasons caused by the request otherwise (a value the runner cannot serve):
#: 400 with no single field to blame.
_REQUEST_REASONS = {"invalid_request", "unsupported"}
#: Runner deadlines that ended a request: 504, as for any deadline.
_DEADLINE_REASONS = {"runner_wedged", "cancel_timeout"}
#: The node serving the request was lost (link down, node dead): 502, a bad upstream.
_LOST_REASONS = {"node_unreachable", "route_refused"}
#: The runner was stopped under the request (its instance deleted or moved, its node shutting
#: down): not the server's fault nor the request's, and a retry finds another instance.
_GONE_REASONS = {"runner_stopped"}

Items = AsyncGenerator[str | GenerationEnd, None]
"""One request's generation: text deltas, then one :class:`GenerationEnd`."""
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
        if exc.registered:
            return ApiError.unavailable(str(exc), code="no_instance")
        if not exc.loaded:  # not a 404: the model may well exist (the State will say)
            err = ApiError.unavailable(f"{exc}; retry in 1 s", code="state_loading")
            err.headers = {"Retry-After": "1"}
            return err
        return ApiError.model_not_found(exc.model)
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
    return serving_error_for(exc, request.format.prompt_param)


def serving_error_for(exc: Exception, prompt_param: str) -> ApiError:
    """Any failure of serving a request whose prompt is the body's ``prompt_param`` field
    (``input`` for embeddings) as the client sees it."""
    if isinstance(exc, ModelUnavailable):
        return unavailable_error(exc)
    if isinstance(exc, RequestFailure):
        return failure_error_for(exc, prompt_param)
    return routing_error(exc)


def failure_error_for(exc: RequestFailure, prompt_param: str) -> ApiError:
    """Map a typed request failure to what the client sees (a prompt failure names the
    format's prompt field, ``prompt_param``: ``messages``, ``prompt``, ``input``)."""
    if exc.reason in _PROMPT_REASONS:
        return ApiError.invalid(prompt_param, exc.message, code=exc.reason)
    if exc.reason in _REQUEST_REASONS:
        return ApiError.invalid(None, exc.message, code=exc.reason)
    if exc.reason == "max_tokens_too_large":  # could never fit the runner's KV budget
        return ApiError.invalid("max_tokens", exc.message, code=exc.reason)
    if exc.reason == "kv_cache_full":  # the runner's KV budget and its queue are full
        err = ApiError.over_capacity(f"{exc.message}; retry in 1 s")
        err.headers = {"Retry-After": "1"}
        return err
    message = f"generation failed: {exc.reason}: {exc.message}"
    if exc.reason in _DEADLINE_REASONS:
        return ApiError(504, message, type="timeout_error", code=exc.reason)
    if exc.reason in _LOST_REASONS:
        return ApiError(502, message, type="server_error", code=exc.reason)
    if exc.reason in _GONE_REASONS:
        err = ApiError.unavailable(message, code=exc.reason)
        err.headers = {"Retry-After": "1"}
        return err
    return ApiError.server_error(message, code=exc.reason)


def _no_result() -> ApiError:
    return ApiError.server_error("generation ended without a result", code="internal")


class OpenedStream:
    """A streamed generation whose first item has arrived: the point where a stream may start.

    Made by :func:`open_stream`, which raises :class:`ApiError` instead when the generation
    fails before any output (model not ready, prompt too long, runner failure): the caller
    answers that as a plain error, before any stream was committed.

    An ``OpenedStream`` owns a running generation on a runner. Iterate :meth:`events` at most
    once, and always :meth:`aclose` it — also when :meth:`events` was never iterated (the client
    went away before the response body started): closing cancels the request on the runner.
    ``aclose`` is idempotent; an HTTP handler hands it to
    :func:`~skulk.api._guard.close_with_request` so it runs whatever becomes of the response.
    """

    def __init__(self, request: Request, items: Items, first: str | GenerationEnd) -> None:
        self.request = request
        self._renderer: Renderer = request.format.renderer(request.model)
        self._items = items
        self._first: str | GenerationEnd | None = first

    async def events(self) -> AsyncGenerator[Event, None]:
        """The format's events: the opening ones, the first item's, then the rest, ending with
        the format's closing events. Raises :class:`ApiError` if the generation fails mid-way
        (answer it with :meth:`failure`)."""
        first, self._first = self._first, None
        if first is None:
            raise RuntimeError("OpenedStream.events() iterated twice")
        for event in self._renderer.opening():
            yield event
        try:
            for event in self._emit(first):
                yield event
            if isinstance(first, GenerationEnd):
                return
            async for item in self._items:
                for event in self._emit(item):
                    yield event
                if isinstance(item, GenerationEnd):
                    return
        except SERVING_ERRORS as exc:
            raise serving_error(exc, self.request) from exc
        raise _no_result()

    def failure(self, err: ApiError) -> list[Event]:
        """The events that end this stream after ``err`` (an error event, then the format's
        end of stream)."""
        return self._renderer.failure(err)

    def _emit(self, item: str | GenerationEnd) -> list[Event]:
        if isinstance(item, GenerationEnd):
            return self._renderer.closing(item)
        # an empty delta is dropped, unless it carries log-probabilities (tokens whose text
        # is held back or cut by a stop string)
        return self._renderer.delta(item) if item or logprobs_of(item) else []

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
        raise _no_result() from None
    except SERVING_ERRORS as exc:
        raise serving_error(exc, request) from exc
    except BaseException:  # cancelled while waiting, or a bug: leave nothing running
        with trio.CancelScope(shield=True):
            await items.aclose()
        raise
    return OpenedStream(request, items, first)


class Opened(Protocol):
    """A committed stream, whatever made it: :class:`OpenedStream` (one generation) or
    :class:`~skulk.api._choices.OpenedChoices` (several choices)."""

    def events(self) -> AsyncGenerator[Event, None]: ...

    def failure(self, err: ApiError) -> list[Event]: ...

    async def aclose(self) -> None: ...


async def sse_body(opened: Opened) -> AsyncGenerator[bytes, None]:
    """The SSE body of an opened stream, in its format.

    A failure after the stream started (the runner crashed, a deadline) ends it with the
    format's error events, never with a cut connection. Closes ``opened`` when it ends.
    """
    try:
        async with aclosing(opened.events()) as events:
            async for event in events:
                yield sse_frame(event)
    except ApiError as exc:
        for event in opened.failure(exc):
            yield sse_frame(event)
    except Exception:
        log.exception("a stream failed after it started")
        err = ApiError.server_error("internal server error", code="internal")
        for event in opened.failure(err):
            yield sse_frame(event)
    finally:
        await opened.aclose()


async def run_to_end(items: Items, request: Request) -> tuple[str, GenerationEnd]:
    """Run a non-streamed generation (``items``, not started yet) to its end: the whole text
    (a :class:`~skulk.worker.ScoredText` when the deltas carried log-probabilities) and how it
    ended. Raises :class:`ApiError`."""
    parts: list[str] = []
    try:
        async with aclosing(items):
            async for item in items:
                if isinstance(item, GenerationEnd):
                    return join_scored(parts), item
                parts.append(item)
    except SERVING_ERRORS as exc:
        raise serving_error(exc, request) from exc
    raise _no_result()


async def complete(items: Items, request: Request) -> dict[str, object]:
    """The whole response of a non-streamed request (``items``: its generation, not started
    yet), in its format. Raises :class:`ApiError`."""
    renderer = request.format.renderer(request.model)  # its timestamp: when the request came
    text, end = await run_to_end(items, request)
    return renderer.whole(text, end)


async def count_prompt_tokens(count: Awaitable[int], request: Request) -> int:
    """The prompt's length in tokens, as the runner counts it (through the model's chat
    template) when serving ``request``. ``count`` is the router's count of it (not started
    yet): runners are the only place a model's tokenizer lives; the runner renders and
    tokenizes the prompt exactly as for a generation (the ``input_tokens`` the same prompt is
    billed as) and decodes nothing. Raises :class:`ApiError`."""
    try:
        return await count
    except SERVING_ERRORS as exc:
        raise serving_error(exc, request) from exc
