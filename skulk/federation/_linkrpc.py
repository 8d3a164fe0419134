"""A link's rpc topic: the calls this node makes and the calls its peer makes.

An outgoing call waits for its answer under a deadline that travels with it (the peer runs its
handler under the same one); an incoming call is answered by the ``rpc_handler`` in a task of its
own, at most ``max_concurrent_rpcs`` at once (beyond that: ``busy``). :class:`LinkRpc` is driven
by its :class:`~skulk.federation.Link`, which routes the rpc frames to it and fails the pending
calls when it closes.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
from collections.abc import Awaitable, Callable

import attrs
import trio

from skulk.wire import Codec, WireError
from skulk.wire.link import LinkFrame, RpcError, RpcRequest, RpcResponse

from ._linkbase import (
    LinkBusy,
    LinkClosed,
    LinkCloseReason,
    LinkConfig,
    PeerUnreachable,
    RpcFailed,
    RpcTimeout,
)
from ._outbox import Outbox, OutboxClosed
from ._refusal import quote

log = logging.getLogger("skulk.federation.link")

RpcHandler = Callable[[str, bytes], Awaitable[bytes]]
"""``await handler(method, body)`` answers an incoming call: return the response body, or raise
:class:`RpcFailed` for a typed error. Any other exception answers ``handler_failed``."""


@attrs.define
class _Call:
    event: trio.Event = attrs.Factory(trio.Event)
    result: bytes = b""
    error: Exception | None = None


class LinkRpc:
    """The rpc calls of one link, both ways.

    ``closed`` says how the link ended (``None`` while open); ``violation`` closes the link for
    a peer that breaks the protocol; ``spawn`` starts a task in the link's nursery, guarded so
    that a failure closes the link, never escapes.
    """

    def __init__(
        self,
        peer_id: str,
        config: LinkConfig,
        codec: Codec[LinkFrame],
        outbox: Outbox,
        handler: RpcHandler | None,
        *,
        closed: Callable[[], LinkClosed | None],
        violation: Callable[[LinkCloseReason, str], None],
        spawn: Callable[[Callable[[], Awaitable[None]]], None],
    ) -> None:
        self._peer_id = peer_id
        self._config = config
        self._codec = codec
        self._outbox = outbox
        self._handler = handler
        self._closed = closed
        self._violation = violation
        self._spawn = spawn
        self._calls: dict[int, _Call] = {}
        self._call_ids = itertools.count()
        self._serving: set[int] = set()
        self.dropped = 0
        """Incoming calls refused ``busy``."""

    @property
    def pending(self) -> int:
        """Outgoing calls waiting for their answer."""
        return len(self._calls)

    @property
    def in_flight(self) -> int:
        """Incoming calls being answered."""
        return len(self._serving)

    async def call(self, method: str, body: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        """:meth:`Link.call <skulk.federation.Link.call>`."""
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be finite and > 0, not {timeout!r}")
        closed = self._closed()
        if closed is not None:
            raise PeerUnreachable(closed)
        if len(self._calls) >= self._config.max_pending_calls:
            raise LinkBusy(f"{len(self._calls)} calls to {self._peer_id} are pending")
        call_id = next(self._call_ids)
        timeout_ms = min(math.ceil(timeout * 1000), 2**63)
        frame = self._codec.encode(RpcRequest(call_id, method, body, timeout_ms))
        call = _Call()
        self._calls[call_id] = call
        try:
            with trio.move_on_after(timeout):
                await self._outbox.put_control(frame)
                await call.event.wait()
        except OutboxClosed:
            raise PeerUnreachable(self._closed()) from None
        finally:
            self._calls.pop(call_id, None)
        if not call.event.is_set():
            raise RpcTimeout(method, timeout)
        if call.error is not None:
            raise call.error
        return call.result

    def fail_all(self, error: PeerUnreachable) -> None:
        """The link closed: every pending call fails with ``error`` at once."""
        for call in self._calls.values():
            call.error = error
            call.event.set()

    def on_request(self, frame: RpcRequest) -> None:
        if frame.call_id in self._serving:
            self._violation(
                LinkCloseReason.PROTOCOL_VIOLATION,
                f"rpc call id {frame.call_id} reused while that call is in flight",
            )
            return
        if self._handler is None or len(self._serving) >= self._config.max_concurrent_rpcs:
            reason = "no_handler" if self._handler is None else "busy"
            error = RpcError(frame.call_id, reason, f"{reason.replace('_', ' ')} on this node")
            if reason == "busy":
                self.dropped += 1
            self._outbox.put_control_nowait(self._codec.encode(error))  # full: caller times out
            return
        self._serving.add(frame.call_id)
        self._spawn(functools.partial(self._serve, frame))

    async def _serve(self, frame: RpcRequest) -> None:
        assert self._handler is not None
        timeout = min(max(frame.timeout_ms, 0) / 1000, self._config.max_rpc_timeout)
        reply: RpcResponse | RpcError
        try:
            with trio.move_on_after(timeout) as scope:
                try:
                    body = await self._handler(frame.method, frame.body)
                    reply = RpcResponse(frame.call_id, body)
                except RpcFailed as exc:
                    reply = RpcError(frame.call_id, exc.reason, exc.message)
                except Exception as exc:
                    log.exception("rpc handler for %s failed", quote(frame.method))
                    reply = RpcError(frame.call_id, "handler_failed", type(exc).__name__)
            if scope.cancelled_caught:
                reply = RpcError(frame.call_id, "deadline_exceeded", f"no answer in {timeout} s")
            try:
                encoded = self._codec.encode(reply)
            except WireError as exc:
                reply = RpcError(frame.call_id, "handler_failed", f"bad response: {exc}"[:200])
                encoded = self._codec.encode(reply)
            await self._outbox.put_control(encoded)
        finally:
            self._serving.discard(frame.call_id)

    def on_answer(self, frame: RpcResponse | RpcError) -> None:
        call = self._calls.get(frame.call_id)
        if call is None or call.event.is_set():
            return  # the caller gave up (timeout): a late answer
        if isinstance(frame, RpcResponse):
            call.result = frame.body
        else:
            call.error = RpcFailed(frame.reason, frame.message)
        call.event.set()
