"""A request served on another node: rpc admission, then the answer on a data stream.

API node A, for an instance whose rank 0 runs on node B (both sides are :class:`RemoteRouting`)::

    A: generate()  ── rpc route.generate(RouteRequest) ──▶  B: handle_rpc(): look up, check
                                                               ready, admit (or refuse typed)
    A: handle_stream() ◀── data stream: RouteHeader, RouteDelta…, RouteEnd | RouteFailed ── B
    A: generate() yields the deltas, then the Generation

Never through the leader, never in the log. The stream is credit-controlled: a client that reads
slowly slows B's sends; a receiver that grants nothing for :data:`SEND_TIMEOUT` s has its
generation cancelled. Closing A's generator (a client disconnect) closes the receiver, which
stops B's stream, which cancels the generation on B's runner. A lost link or a dead B ends A's
generator with ``RequestFailure("node_unreachable")`` as soon as the link is seen closed (a
reset socket at once; a silent peer after the link's liveness timeout, 5 s by default).

Refusals are typed: ``Overloaded`` (B's admission bound; the API answers 429 with
``Retry-After``), :class:`RemoteUnavailable` (the instance is not ready on B, or no longer
there: 503), ``RequestFailure`` (the runner's own reasons, unchanged).
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing

import attrs
import trio

from skulk.federation import (
    DataReceiver,
    DataSender,
    LinkError,
    Mesh,
    PeerUnreachable,
    RpcFailed,
    StreamStopped,
)
from skulk.wire import Codec, WireError
from skulk.wire.routing import (
    RouteDelta,
    RouteEnd,
    RouteFailed,
    RouteHeader,
    RouteItem,
    RouteRequest,
)
from skulk.wire.runner import Prompt, SamplingParams
from skulk.worker import Generation, ModelService, ModelUnavailable, RequestFailure

from ._admission import Admission, Overloaded

log = logging.getLogger("skulk.routing")

ROUTE_METHOD = "route.generate"
REQUEST_CODEC: Codec[RouteRequest] = Codec(RouteRequest)
ITEM_CODEC: Codec[RouteItem] = Codec(RouteItem)

#: Seconds the API node waits for admission, and then for the answer stream to open.
ADMIT_TIMEOUT = 5.0
#: Seconds an opened stream has to name its request (else it is closed).
HEADER_TIMEOUT = 5.0
#: Seconds one chunk may wait for the receiver's credit before the generation is cancelled.
SEND_TIMEOUT = 30.0


class RemoteUnavailable(Exception):
    """The instance cannot take the request on ``node`` now (not ready, or not there)."""

    def __init__(self, node: str, message: str) -> None:
        super().__init__(f"node {node}: {message}")
        self.node = node


def unreachable(node: str, why: object) -> RequestFailure:
    return RequestFailure("node_unreachable", f"node {node} serving the request was lost: {why}")


@attrs.frozen
class _Handoff:
    receiver: DataReceiver
    done: trio.Event


class RemoteRouting:
    """Both ends (see the module doc). ``lookup(instance)`` is the service running the
    instance's rank 0 on this node (``None``: not here)."""

    def __init__(
        self,
        mesh: Mesh,
        lookup: Callable[[str], ModelService | None],
        admission: Admission,
        *,
        admit_timeout: float = ADMIT_TIMEOUT,
        send_timeout: float = SEND_TIMEOUT,
    ) -> None:
        self._mesh = mesh
        self._lookup = lookup
        self._admission = admission
        self._admit_timeout = admit_timeout
        self._send_timeout = send_timeout
        self._waiting: dict[str, trio.MemorySendChannel[_Handoff]] = {}
        self._nursery: trio.Nursery | None = None
        self.served = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the generations this node serves for others (until cancelled)."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            await trio.sleep_forever()

    # ---- the serving node ----

    async def handle_rpc(self, method: str, body: bytes) -> bytes:
        """Admit a :class:`RouteRequest` (the mesh rpc handler for :data:`ROUTE_METHOD`)."""
        try:
            request = REQUEST_CODEC.decode(body)
        except WireError as exc:
            raise RpcFailed("bad_request", str(exc)[:200]) from None
        service = self._lookup(request.instance)
        if service is None:
            raise RpcFailed("instance_not_here", f"instance {request.instance} does not run here")
        status = service.status()
        if not status.ready:
            raise RpcFailed("not_ready", f"instance {request.instance} is {status.state}")
        link = self._mesh.link(request.caller)
        if link is None or self._nursery is None:
            raise RpcFailed("no_link", f"no link back to {request.caller}")
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(self._admission.admit(request.instance))
        except Overloaded as exc:
            raise RpcFailed("overloaded", f"{exc.retry_after:g}") from None
        try:
            sender = link.open_stream()
        except LinkError as exc:
            stack.close()
            raise RpcFailed("busy", str(exc)[:200]) from None
        self._nursery.start_soon(self._serve, request, service, sender, stack)
        return b"admitted"

    async def _serve(
        self,
        request: RouteRequest,
        service: ModelService,
        sender: DataSender,
        admitted: contextlib.ExitStack,
    ) -> None:
        with admitted:
            self.served += 1
            final: RouteItem | None = None
            try:
                await self._send(sender, RouteHeader(request.request_id))
                async with aclosing(service.generate(request.prompt, request.params)) as items:
                    async for item in items:
                        if isinstance(item, Generation):
                            await self._send(sender, RouteEnd(item.finish_reason, item.usage), True)
                            return
                        await self._send(sender, RouteDelta(item))
                final = RouteFailed("runner_stopped", "the generation ended without a result")
            except ModelUnavailable as exc:
                final = RouteFailed("not_ready", str(exc))
            except RequestFailure as exc:
                final = RouteFailed(exc.reason, exc.message)
            except (StreamStopped, PeerUnreachable, trio.TooSlowError) as exc:
                # The caller went away (or stopped reading): closing the generator above
                # cancelled it on the runner; nobody is left to tell.
                log.debug("routed request %s abandoned: %r", request.request_id, exc)
                return
            with contextlib.suppress(LinkError, trio.TooSlowError):
                await self._send(sender, final, True)

    async def _send(self, sender: DataSender, item: RouteItem, end: bool = False) -> None:
        with trio.fail_after(self._send_timeout):
            await sender.send(ITEM_CODEC.encode(item), end=end)

    # ---- the API node ----

    async def handle_stream(self, peer: str, receiver: DataReceiver) -> None:
        """The mesh stream handler: hand an answer stream to the request waiting for it.
        Returning closes the stream (which cancels it on the sender)."""
        done = trio.Event()
        handed = False
        with trio.move_on_after(HEADER_TIMEOUT):
            handed = await self._hand_over(receiver, done)
        if handed:
            await done.wait()  # the stream is the request's now

    async def _hand_over(self, receiver: DataReceiver, done: trio.Event) -> bool:
        try:
            header = ITEM_CODEC.decode(await receiver.receive())
        except (WireError, trio.EndOfChannel, PeerUnreachable):
            return False
        if not isinstance(header, RouteHeader):
            return False
        slot = self._waiting.get(header.request_id)
        if slot is None:
            return False  # the request gave up already
        try:
            slot.send_nowait(_Handoff(receiver, done))
        except (trio.WouldBlock, trio.BrokenResourceError):
            return False
        return True

    async def generate(
        self, node: str, instance: str, prompt: Prompt, params: SamplingParams
    ) -> AsyncGenerator[str | Generation, None]:
        """Serve one request on ``instance`` at ``node``: deltas, then one Generation."""
        link = self._mesh.link(node)
        if link is None:
            raise unreachable(node, "no link")
        request_id = uuid.uuid4().hex
        slot, arrivals = trio.open_memory_channel[_Handoff](1)
        self._waiting[request_id] = slot
        handoff: _Handoff | None = None
        try:
            request = RouteRequest(request_id, self._mesh.node_id, instance, prompt, params)
            try:
                await link.call(ROUTE_METHOD, REQUEST_CODEC.encode(request), self._admit_timeout)
            except RpcFailed as exc:
                raise _refusal(node, instance, exc) from None
            except LinkError as exc:
                raise unreachable(node, exc) from None
            with trio.move_on_after(self._admit_timeout):
                handoff = await arrivals.receive()
            if handoff is None:
                raise unreachable(node, "its answer stream never opened")
            while True:
                try:
                    item = ITEM_CODEC.decode(await handoff.receiver.receive())
                except (trio.EndOfChannel, PeerUnreachable) as exc:
                    raise unreachable(node, exc or "the stream ended early") from None
                except WireError as exc:
                    raise unreachable(node, f"bad answer: {exc}") from None
                match item:
                    case RouteDelta(text=text):
                        yield text
                    case RouteEnd(finish_reason=reason, usage=usage):
                        yield Generation(reason, usage)
                        return
                    case RouteFailed(reason="not_ready", message=message):
                        raise RemoteUnavailable(node, message)
                    case RouteFailed(reason=reason, message=message):
                        raise RequestFailure(reason, message)
                    case RouteHeader():
                        raise unreachable(node, "a second header")
        finally:
            del self._waiting[request_id]
            slot.close()
            late = handoff
            with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel):
                late = late or arrivals.receive_nowait()  # arrived after we stopped waiting
            if late is not None:
                with trio.CancelScope(shield=True):
                    await late.receiver.aclose()  # stops the stream: cancels it on the node
                late.done.set()


def _refusal(node: str, instance: str, exc: RpcFailed) -> Exception:
    if exc.reason == "overloaded":
        try:
            retry = float(exc.message)
        except ValueError:
            retry = 1.0
        return Overloaded(instance, 0, retry)
    if exc.reason in ("not_ready", "instance_not_here"):
        return RemoteUnavailable(node, exc.message)
    return unreachable(node, f"{exc.reason}: {exc.message}")
