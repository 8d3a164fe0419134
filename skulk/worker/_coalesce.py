"""Merging a request's token chunks into fewer, larger text deltas."""

from __future__ import annotations

import math
from collections.abc import AsyncGenerator

import trio

from skulk.runner import RequestEvent
from skulk.wire.runner import Finished, RequestFailed, TokenChunk, TokenLogprob
from skulk.worker._scored import ScoredText


async def coalesce(
    events: trio.MemoryReceiveChannel[RequestEvent], interval: float
) -> AsyncGenerator[str | Finished | RequestFailed, None]:
    """Yield text deltas, then the request's terminal event (if the channel delivers one).

    The first text goes out at once; after that at most one delta per ``interval`` seconds,
    holding everything that arrived in between. Text waiting when the request ends is yielded
    before the terminal event. Empty text (a held-back partial character) is never yielded,
    unless it carries log-probabilities (a :class:`ScoredText` holding the chunks' entries).
    One larger delta per interval costs the node and the client far less than one per token.
    """
    next_flush = -math.inf
    async for first in events:
        event: RequestEvent = first
        if isinstance(event, TokenChunk) and trio.current_time() < next_flush:
            await trio.sleep_until(next_flush)
        text: list[str] = []
        logprobs: list[TokenLogprob] = []
        while isinstance(event, TokenChunk):
            text.append(event.text)
            logprobs.extend(event.logprobs)
            try:
                event = events.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        joined = "".join(text)
        if joined or logprobs:  # a token may add no text yet its entry must go out
            next_flush = trio.current_time() + interval
            yield ScoredText(joined, logprobs) if logprobs else joined
        if isinstance(event, (Finished, RequestFailed)):  # a generation's end (never Embedded)
            yield event
            return
