"""Requests to a serving runner: generations (a stream of events), counts and embeddings (one
answer each), and their cancellation.

A request is refused before anything is sent when it cannot be served or carried (see
:meth:`Requests.open`); otherwise it is registered, sent whole, and its events come through a
channel of its own. A consumer that leaves before its request ended sends ``Cancel``, which the
runner must answer within ``cancel_timeout`` (the :class:`Watchdog` holds it to that). The
first request in flight moves the runner to ``busy`` and starts its progress window; the last
one to end moves it back to ``ready``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from skulk.runner._config import RunnerConfig
from skulk.runner._errors import RequestRejected, RunnerCrashed, RunnerError
from skulk.runner._lifecycle import Lifecycle
from skulk.runner._link import RunnerLink, encode_request
from skulk.runner._request_table import RequestEvent, RequestTable
from skulk.runner._watchdog import Watchdog
from skulk.wire.runner import (
    Cancel,
    Embed,
    Embedded,
    Generate,
    RequestFailed,
    ShardSpec,
    Tokenize,
    Tokenized,
)


class Requests:
    """The request side of one runner incarnation (or one rank of a sharded instance:
    ``shard``)."""

    def __init__(
        self,
        config: RunnerConfig,
        shard: ShardSpec | None,
        lifecycle: Lifecycle,
        table: RequestTable,
        link: RunnerLink,
        watchdog: Watchdog,
    ) -> None:
        self._config = config
        self._shard = shard
        self._lifecycle = lifecycle
        self._table = table
        self._link = link
        self._watchdog = watchdog

    async def ask(self, frame: Tokenize | Embed) -> Tokenized | Embedded | RequestFailed | None:
        """The one answer to ``frame`` (see :meth:`Runner.ask <skulk.runner.Runner.ask>`)."""
        async with self.open(frame) as events:
            async for event in events:
                if isinstance(event, (Tokenized, Embedded, RequestFailed)):
                    return event
        return None

    @asynccontextmanager
    async def open(
        self, frame: Generate | Tokenize | Embed
    ) -> AsyncIterator[trio.MemoryReceiveChannel[RequestEvent]]:
        """Send ``frame``; yields the channel of its events (see :meth:`Runner.open_request
        <skulk.runner.Runner.open_request>` for what is refused, and how)."""
        request_id = frame.request_id
        if self._shard is not None and self._shard.rank != 0:
            raise RequestRejected(
                "not_rank_zero",
                f"rank {self._shard.rank} of a sharded instance takes no requests; rank 0 does",
            )
        if not self._lifecycle.serving:
            raise RunnerCrashed(f"runner is {self._lifecycle.phase}")
        if self._table.in_use(request_id):
            raise ValueError(f"request id {request_id!r} already active")
        # Encode first: a request that cannot be sent must leave nothing behind — no channel,
        # no in-flight entry, and above all no Cancel for a request the runner never saw.
        data = encode_request(frame)
        receive = self._table.open(request_id)
        if not self._table.inflight:
            self._watchdog.heard()
            self._lifecycle.move("busy")
        self._table.start(request_id)
        self._watchdog.rearm()
        sent = False
        try:
            await self._link.send_bytes(data)
            sent = True
            async with receive:
                yield receive
        finally:
            # Still open ⇒ the runner has not finished it: stop the work there.
            if self._table.close(request_id):
                if not sent:  # the runner never got it (its socket failed): just forget it
                    self._forget(request_id)
                elif request_id in self._table.inflight and self._lifecycle.phase == "busy":
                    await self.cancel(request_id)

    async def cancel(self, request_id: str) -> None:
        """Ask the runner to drop a request; it must acknowledge within ``cancel_timeout``."""
        self._table.cancelling(request_id, trio.current_time() + self._config.cancel_timeout)
        self._watchdog.rearm()
        with trio.move_on_after(self._config.cancel_timeout, shield=True):
            try:
                await self._link.send(Cancel(request_id=request_id))
            except RunnerError:
                pass  # the runner is gone; run() reports why

    def _forget(self, request_id: str) -> None:
        """Drop a request the runner never received."""
        if self._table.forget(request_id):
            if not self._table.inflight and self._lifecycle.phase == "busy":
                self._lifecycle.move("ready")
            self._watchdog.rearm()
