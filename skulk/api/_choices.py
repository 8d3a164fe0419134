"""Serving a request that asks for several choices (OpenAI's ``n``): n generations of one prompt.

Each choice is its own request on the runner (they batch there), all on the one instance the
request was routed to, run concurrently; this module fans them out and merges what comes back.
Format-neutral like :mod:`skulk.api._stream`: a format that has choices says so with
:class:`ChoicesFormat`, and its :class:`ChoicesRenderer` turns our items into its events or
its whole response.

The rules, the same as for one generation, applied to the whole request:

* **Seeds.** With a ``seed``, choice 0 uses it as given (so its text is what ``n: 1`` gives) and
  choice ``i`` a seed derived from ``(seed, i)`` (:func:`choice_seed`): the choices differ, and
  the whole response is reproducible. Without one, each choice is random.
* **All or nothing before the answer starts.** A request is committed only once *every* choice
  has its first item (:func:`open_choices`); until then each choice that has one waits, holding
  its admission place, so the n choices hold n places at once. A failure of any choice before
  that — the admission bound refusing one of the n places (429), a prompt too long, a runner
  failure — is the whole request's plain error, and the other choices are cancelled (and have
  ended on the runner) before it is answered.
* **After that**, a failure of one choice ends a stream with the format's error events (a plain
  request with the error) and cancels the others; a client going away cancels all n.
* **Usage** counts the prompt once (as OpenAI does) and sums the completion tokens
  (:func:`combined_usage`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Protocol, runtime_checkable

import attrs
import trio

from skulk.api._errors import ApiError
from skulk.api._request import Event
from skulk.api._stream import SERVING_ERRORS, Items, Request, serving_error
from skulk.wire.runner import GenerationEnd, SamplingParams, Usage
from skulk.worker import join_scored, logprobs_of

log = logging.getLogger("skulk.api")

#: How long closing a fan-out may wait, shielded, for its choices to end (each cancels its
#: request on the runner, which has its own ``cancel_timeout``).
CLOSE_DEADLINE = 10.0

#: Keeps derived seeds apart from any other use of blake2b on the same numbers.
_SEED_PERSON = b"skulk-choice"


class ChoicesRenderer(Protocol):
    """A request's output with several choices, in one format (made per request by
    :meth:`ChoicesFormat.choices_renderer`, so ids and timestamps are shared). A stream is
    :meth:`opening` for each choice, then :meth:`delta` / :meth:`finish` for each choice as its
    items come (interleaved), then :meth:`closing` once every choice has finished — or
    :meth:`failure` instead, when a choice fails after the stream started."""

    def opening(self, index: int) -> list[Event]: ...

    def delta(self, index: int, text: str) -> list[Event]: ...

    def finish(self, index: int, end: GenerationEnd) -> list[Event]: ...

    def closing(self, usage: Usage) -> list[Event]: ...

    def failure(self, err: ApiError) -> list[Event]: ...

    def whole(
        self, choices: Sequence[tuple[str, GenerationEnd]], usage: Usage
    ) -> dict[str, object]:
        """The whole (non-streamed) response: each choice's text and end, by index."""
        ...


@runtime_checkable
class ChoicesFormat(Protocol):
    """A :class:`~skulk.api._request.Format` whose requests may ask for several choices
    (OpenAI's chat completions and completions): ``choices`` is how many."""

    @property
    def choices(self) -> int: ...

    def choices_renderer(self, model: str) -> ChoicesRenderer: ...


def choice_count(request: Request) -> int:
    """How many choices ``request`` asks for (1 for a format without choices)."""
    fmt = request.format
    return fmt.choices if isinstance(fmt, ChoicesFormat) else 1


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice ``index`` of a request seeded with ``seed``: ``seed`` itself for
    choice 0, else a signed 64-bit value derived from ``(seed, index)`` (blake2b), so every
    choice draws differently and the same request gives the same choices again."""
    if index == 0:
        return seed
    digest = hashlib.blake2b(
        f"{seed}:{index}".encode(), digest_size=8, person=_SEED_PERSON
    ).digest()
    return int.from_bytes(digest, "little", signed=True)


def choice_params(params: SamplingParams, n: int) -> list[SamplingParams]:
    """Each choice's sampling parameters: ``params`` with the choice's seed
    (:func:`choice_seed`); without a seed, each choice is random."""
    if params.seed is None:
        return [params] * n
    return [attrs.evolve(params, seed=choice_seed(params.seed, i)) for i in range(n)]


def combined_usage(usages: Sequence[Usage]) -> Usage:
    """The usage of a request with several choices: the prompt counted once (as OpenAI does),
    the completion tokens summed. ``cached_tokens`` is the fewest any choice reused from the
    prefix cache: what can be said of the one prompt counted."""
    return Usage(
        prompt_tokens=usages[0].prompt_tokens,
        completion_tokens=sum(u.completion_tokens for u in usages),
        cached_tokens=min(u.cached_tokens for u in usages),
    )


_Item = tuple[int, str | GenerationEnd | ApiError]
"""What a choice's pump passes on: its index, and its next item or its failure."""


class OpenedChoices:
    """A request with several choices whose every first item has arrived: the point where its
    answer may start. Made by :func:`open_choices`.

    The choices run in tasks of the nursery given to :func:`open_choices`, each pumping its
    generation into one channel; after its first item each waits until :meth:`events` or
    :meth:`whole` starts reading. Like :class:`~skulk.api._stream.OpenedStream`: read it at
    most once, and always :meth:`aclose` it — closing cancels every choice still running, on
    the runner too, and waits (shielded, bounded) until they have ended; it is idempotent.
    """

    def __init__(self, request: Request, choices: Sequence[Items]) -> None:
        fmt = request.format
        if not isinstance(fmt, ChoicesFormat):
            raise TypeError(f"{type(fmt).__name__} has no choices")
        self.request = request
        self._renderer = fmt.choices_renderer(request.model)  # its timestamp: now
        self._choices = list(choices)
        self._send, self._receive = trio.open_memory_channel[_Item](0)
        self._go = trio.Event()  # reading started: pumps go on past their first item
        self._ended = trio.Event()  # every pump has ended
        self._cancel: trio.CancelScope | None = None
        self._closed = False
        self._firsts: list[tuple[int, str | GenerationEnd]] = []

    async def _supervise(
        self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        try:
            async with trio.open_nursery() as pumps:
                self._cancel = pumps.cancel_scope
                async with self._send:
                    for index, items in enumerate(self._choices):
                        pumps.start_soon(self._pump, index, items, self._send.clone())
                task_status.started()
        except Exception:  # a pump never raises; were one to, it must not reach the nursery
            # given (the app's), whose other tasks are not this request's
            log.exception("the choices of a request failed")
        finally:
            self._ended.set()

    async def _pump(self, index: int, items: Items, send: trio.MemorySendChannel[_Item]) -> None:
        """Pass choice ``index``'s items on; never raises (a failure is passed on too)."""
        async with send, aclosing(items):  # closing the generation cancels it on the runner
            try:
                first = True
                async for item in items:
                    await send.send((index, item))
                    if isinstance(item, GenerationEnd):
                        return
                    if first:  # hold the admission place until every choice has one
                        first = False
                        await self._go.wait()
                err = ApiError.server_error("generation ended without a result", code="internal")
            except SERVING_ERRORS as exc:
                err = serving_error(exc, self.request)
            except Exception:
                log.exception("choice %d of a request failed", index)
                err = ApiError.server_error("internal server error", code="internal")
            await send.send((index, err))

    async def _next(self) -> tuple[int, str | GenerationEnd]:
        try:
            index, item = await self._receive.receive()
        except trio.EndOfChannel:  # every pump ended without its end: cancelled from outside
            raise ApiError.server_error("the choices ended early", code="internal") from None
        if isinstance(item, ApiError):
            raise item
        return index, item

    async def _wait_firsts(self) -> None:
        """Wait until every choice has its first item; raise the first failure instead."""
        pending = set(range(len(self._choices)))
        while pending:
            index, item = await self._next()
            self._firsts.append((index, item))
            pending.discard(index)

    async def _items(self) -> AsyncGenerator[tuple[int, str | GenerationEnd], None]:
        """Every choice's items as they come (the first ones, then the rest) until every
        choice has ended; raises a choice's failure."""
        if self._go.is_set():
            raise RuntimeError("OpenedChoices read twice")
        self._go.set()
        firsts, self._firsts = self._firsts, []
        ended = 0
        for index, item in firsts:
            ended += isinstance(item, GenerationEnd)
            yield index, item
        while ended < len(self._choices):
            index, item = await self._next()
            ended += isinstance(item, GenerationEnd)
            yield index, item

    async def events(self) -> AsyncGenerator[Event, None]:
        """The format's events: each choice's opening, then the choices' items as they come,
        each choice's end, and the closing events with the combined usage once all have
        ended. Raises :class:`ApiError` when a choice fails mid-way (answer it with
        :meth:`failure`; :meth:`aclose` cancels the others)."""
        r = self._renderer
        usages: dict[int, Usage] = {}
        async with aclosing(self._items()) as items:
            for index in range(len(self._choices)):
                for event in r.opening(index):
                    yield event
            async for index, item in items:
                if isinstance(item, GenerationEnd):
                    usages[index] = item.usage
                    events = r.finish(index, item)
                else:
                    events = r.delta(index, item) if item or logprobs_of(item) else []
                for event in events:
                    yield event
        for event in r.closing(combined_usage([usages[i] for i in sorted(usages)])):
            yield event

    async def whole(self) -> dict[str, object]:
        """Run every choice to its end: the whole (non-streamed) response. Raises
        :class:`ApiError` when a choice fails (:meth:`aclose` cancels the others)."""
        texts: dict[int, list[str]] = {i: [] for i in range(len(self._choices))}
        ends: dict[int, GenerationEnd] = {}
        async with aclosing(self._items()) as items:
            async for index, item in items:
                if isinstance(item, GenerationEnd):
                    ends[index] = item
                else:
                    texts[index].append(item)
        results = [(join_scored(texts[i]), ends[i]) for i in range(len(self._choices))]
        return self._renderer.whole(results, combined_usage([e.usage for _, e in results]))

    def failure(self, err: ApiError) -> list[Event]:
        """The events that end this stream after ``err``."""
        return self._renderer.failure(err)

    async def aclose(self) -> None:
        """Cancel every choice still running and wait until they have ended; idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._cancel is None:  # never started: no generation was ever begun
            return
        self._cancel.cancel()
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_DEADLINE):
            await self._ended.wait()


async def open_choices(
    nursery: trio.Nursery, choices: Sequence[Items], request: Request
) -> OpenedChoices:
    """Start ``request``'s choices (``choices``: their generations, not started yet) in tasks of
    ``nursery`` — for a stream, one that outlives the response body, such as the app's — and
    wait until each has its first item.

    Raises :class:`ApiError` if any choice fails first; the others are cancelled and have
    ended by then. Otherwise the caller owns the returned :class:`OpenedChoices` and must close
    it.
    """
    opened = OpenedChoices(request, choices)
    try:
        await nursery.start(opened._supervise)
        await opened._wait_firsts()
    except BaseException:  # a failure, cancelled while waiting, or a bug: leave nothing running
        await opened.aclose()
        raise
    return opened


async def complete_choices(choices: Sequence[Items], request: Request) -> dict[str, object]:
    """The whole response of a non-streamed request with several choices (``choices``: their
    generations, not started yet), run concurrently in a nursery of its own and committed as a
    stream is (:func:`open_choices`). Raises :class:`ApiError` (the first failure of any
    choice) once the others have been cancelled and have ended."""
    outcome: list[dict[str, object] | Exception] = []
    async with trio.open_nursery() as nursery:
        try:
            async with aclosing(await open_choices(nursery, choices, request)) as opened:
                outcome.append(await opened.whole())
        except Exception as exc:  # raised below: from inside the nursery it would be a group
            outcome.append(exc)
    [result] = outcome
    if isinstance(result, Exception):
        raise result
    return result
