"""The requests on one runner, as bookkeeping (no I/O): who waits for which request's events,
which requests the runner still works on, and which Cancels it has not answered yet.

Three maps, because the three lifetimes differ. A request's *channel* lives while its consumer
wants events; it is *in flight* from the moment it is sent until the runner ends it (a request
whose consumer left stays in flight until the runner acknowledges the Cancel); a *pending
cancel* lives from the Cancel until the runner's one ``Finished(cancelled)`` answer, which may
come after the request ended by itself. An id is free again only when it is in none of them.

:meth:`RequestTable.deliver` hands one frame from the runner to its request's channel and never
waits: a consumer that falls :data:`REQUEST_BUFFER` chunks behind is ended with
``client_too_slow`` and its request is to be cancelled (the caller sends the Cancel).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import attrs
import trio

from skulk.runner._recorder import FlightRecorder
from skulk.tracing import current_request_id
from skulk.wire.runner import (
    Embedded,
    Finished,
    PrefillProgress,
    RequestFailed,
    TokenChunk,
    Tokenized,
)

RequestEvent = TokenChunk | Finished | Tokenized | Embedded | RequestFailed
#: Chunks buffered per request; a consumer that falls this far behind is failed with
#: ``client_too_slow`` (the runner's reader never waits for one consumer).
REQUEST_BUFFER = 1024
#: Times to first token kept (the most recent requests'), for the node's health readings.
RECENT_TTFTS = 64


@attrs.frozen
class Delivery:
    """What the caller of :meth:`RequestTable.deliver` must do next: move the runner to
    ``ready`` (``idle``: the last request in flight ended) and send a ``Cancel`` for
    ``cancel`` (its consumer fell too far behind)."""

    idle: bool = False
    cancel: str | None = None


class RequestTable:
    """The requests of one runner incarnation; events go to ``recorder``, and the text of every
    chunk the runner sent for a request in flight to ``produced`` (its recorded id and the
    text), when given."""

    def __init__(
        self, recorder: FlightRecorder, produced: Callable[[str, str], None] | None = None
    ) -> None:
        self._recorder = recorder
        self._produced = produced
        self._channels: dict[str, trio.MemorySendChannel[RequestEvent]] = {}
        #: Requests the runner works on: request id → its first token was seen.
        self.inflight: dict[str, bool] = {}
        #: Cancels not answered yet: request id → the deadline for the answer.
        self.pending_cancels: dict[str, float] = {}
        self.tokens_out = 0
        self.cancelled = 0
        #: Seconds from send to first token of the last :data:`RECENT_TTFTS` requests.
        self.ttfts: deque[float] = deque(maxlen=RECENT_TTFTS)
        self._sent_at: dict[str, float] = {}  # request id → when it went to the runner
        self._admitted: set[str] = set()  # in flight, and in the runner's KV budget
        #: The id each request is recorded under: the API request's id (x-request-id) when it
        #: was started while one was handled, else its own.
        self._names: dict[str, str] = {}

    def in_use(self, request_id: str) -> bool:
        """Whether ``request_id`` may not be used for a new request yet."""
        return (
            request_id in self._channels
            or request_id in self.inflight
            or request_id in self.pending_cancels
        )

    def open(self, request_id: str) -> trio.MemoryReceiveChannel[RequestEvent]:
        """A new channel for ``request_id``'s events."""
        # One slot more than the chunks it may hold: room for a final client_too_slow.
        send, receive = trio.open_memory_channel[RequestEvent](REQUEST_BUFFER + 1)
        self._channels[request_id] = send
        return receive

    def start(self, request_id: str) -> None:
        """``request_id`` is on its way to the runner: in flight."""
        self.inflight[request_id] = False
        self._sent_at[request_id] = trio.current_time()
        traced = current_request_id()
        self._names[request_id] = traced or request_id
        detail = f"runner request {request_id}" if traced else ""
        self._recorder.record("request.start", detail, self._names[request_id])

    def close(self, request_id: str) -> bool:
        """The consumer of ``request_id`` left: close its channel. True when it was still open,
        that is, the runner had not ended the request."""
        send = self._channels.pop(request_id, None)
        if send is None:
            return False
        send.close()
        return True

    def forget(self, request_id: str) -> bool:
        """Drop a request the runner never received; True when it was in flight."""
        self._sent_at.pop(request_id, None)
        self._admitted.discard(request_id)
        if self.inflight.pop(request_id, None) is None:
            return False
        self._recorder.record("request.fail", "never sent", self._name(request_id))
        self._tidy(request_id)
        return True

    def cancelling(self, request_id: str, deadline: float) -> None:
        """A Cancel for ``request_id`` is being sent; its answer is due by ``deadline``."""
        self.pending_cancels[request_id] = deadline
        self._recorder.record("request.cancel", request_id=self._name(request_id))

    def late_cancels(self, now: float) -> list[str]:
        """The requests whose Cancel is unanswered past its deadline, sorted."""
        return sorted(r for r, d in self.pending_cancels.items() if d <= now)

    def prefilled(self, frame: PrefillProgress) -> None:
        """Write a request's admission to the KV budget (its first ``PrefillProgress``) or one
        of its prefill chunks into the flight recorder; a frame for a request not in flight is
        ignored."""
        rid = frame.request_id
        if rid not in self.inflight:
            return
        if rid in self._admitted:
            self._recorder.record(
                "request.prefill", f"{frame.done} of {frame.total} prompt tokens", self._name(rid)
            )
            return
        self._admitted.add(rid)
        waited = trio.current_time() - self._sent_at.get(rid, trio.current_time())
        self._recorder.record(
            "request.admitted_kv",
            f"after {waited:.3f} s on the runner; {frame.done} of {frame.total} prompt tokens "
            "from the prefix cache",
            self._name(rid),
        )

    def deliver(self, frame: RequestEvent) -> Delivery:
        """Hand ``frame`` to its request's consumer, without waiting."""
        try:
            return self._deliver(frame)
        finally:
            self._tidy(frame.request_id)

    def _deliver(self, frame: RequestEvent) -> Delivery:
        rid = frame.request_id
        if isinstance(frame, Finished) and frame.end.finish_reason == "cancelled":
            # The runner answers every Cancel with exactly one Finished(cancelled): the end of
            # the request, or a bare acknowledgement when the request had already ended (it
            # finished or failed while the Cancel was on its way). Only that answer clears the
            # deadline, so an id is never reused while an answer for it may still arrive.
            self.pending_cancels.pop(rid, None)
        if rid not in self.inflight:
            return Delivery()  # not ours (a late acknowledgement, a duplicate): ignore
        idle = False
        if isinstance(frame, TokenChunk):
            self.tokens_out += len(frame.token_ids)
            if self._produced is not None:
                self._produced(self._name(rid), frame.text)
            if not self.inflight[rid]:
                self.inflight[rid] = True
                if (sent := self._sent_at.pop(rid, None)) is not None:
                    self.ttfts.append(trio.current_time() - sent)
                self._recorder.record("request.first_token", request_id=self._name(rid))
        else:
            del self.inflight[rid]
            self._sent_at.pop(rid, None)
            self._admitted.discard(rid)
            self._record_end(frame)
            idle = not self.inflight
        send = self._channels.get(rid)
        if send is None:
            return Delivery(idle)  # the consumer left; its Cancel is on the way
        terminal, cancel = not isinstance(frame, TokenChunk), None
        if not terminal and send.statistics().current_buffer_used >= REQUEST_BUFFER:
            # Never wait for one consumer: that would stall every request and the heartbeats.
            # The slot kept free for this says why the request ends.
            self._recorder.record("request.fail", "client_too_slow", self._name(rid))
            frame, terminal = _too_slow(rid), True
            if rid in self.inflight:
                cancel = rid
        if terminal:
            del self._channels[rid]
        try:
            send.send_nowait(frame)
        except (trio.BrokenResourceError, trio.WouldBlock):
            pass  # its consumer left (a full channel here is impossible: one slot is kept)
        if terminal:
            send.close()
        return Delivery(idle, cancel)

    def end_all(self, why: str) -> None:
        """The runner is going away (``why``): close every channel at once, so that no consumer
        waits for a client-side timeout, and forget every request."""
        for rid in self.inflight:
            self._recorder.record("request.fail", why, self._name(rid))
        for send in self._channels.values():
            send.close()
        self._channels.clear()
        self.inflight.clear()
        self._sent_at.clear()
        self._admitted.clear()
        self.pending_cancels.clear()
        self._names.clear()

    def _name(self, request_id: str) -> str:
        return self._names.get(request_id, request_id)

    def _tidy(self, request_id: str) -> None:
        """Forget the name of a request whose id is free again."""
        if not self.in_use(request_id):
            self._names.pop(request_id, None)

    def _record_end(self, frame: Finished | Tokenized | Embedded | RequestFailed) -> None:
        rid = self._name(frame.request_id)
        if isinstance(frame, Finished):
            if frame.end.finish_reason == "cancelled":
                self.cancelled += 1
            usage = frame.end.usage
            detail = (
                f"{frame.end.finish_reason}, {usage.completion_tokens} tokens "
                f"(prompt {usage.prompt_tokens}, {usage.cached_tokens} cached)"
            )
            self._recorder.record("request.finish", detail, rid)
        elif isinstance(frame, RequestFailed):
            self._recorder.record("request.fail", f"{frame.reason}: {frame.message}", rid)
        else:
            self._recorder.record("request.finish", type(frame).__name__.lower(), rid)


def _too_slow(request_id: str) -> RequestFailed:
    return RequestFailed(
        request_id,
        "client_too_slow",
        f"the client fell {REQUEST_BUFFER} chunks behind the runner; the request was cancelled",
    )
