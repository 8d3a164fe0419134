"""The serving end of the remote hop: admit a routed request, stream its answer back.

:meth:`RouteServer.handle_rpc` answers ``route.generate``: it looks the instance up, checks it
is ready, takes an admission place and opens a data stream back to the calling peer, then
answers ``admitted`` and serves the generation in :meth:`RouteServer.run`'s nursery. Two
tasks per request: a *pump* runs the service's generator into an unbuffered channel, and the
*forwarder* sends the header, each item (deltas that waited together merged), a keepalive
after each silent interval and, last, the end. The forwarder failing (the stream stopped, the
link lost, a send past its deadline) or the link closing cancels the pump, which closes the
generator, which cancels the request on the runner.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import trio

from skulk.federation import (
    DataSender,
    Link,
    LinkBusy,
    LinkError,
    Mesh,
    PeerUnreachable,
    RpcFailed,
    StreamStopped,
    rpc_peer,
)
from skulk.tracing import check_request_id, note, request_scope
from skulk.wire import WireError
from skulk.wire.routing import (
    RouteAnswer,
    RouteCounted,
    RouteDelta,
    RouteEmbedded,
    RouteEnd,
    RouteFailed,
    RouteHeader,
    RouteItem,
    RouteKeepalive,
    RouteNotReady,
    RouteRequest,
    RouteTokenize,
)
from skulk.wire.runner import GenerationEnd
from skulk.worker import ModelService, ModelUnavailable, RequestFailure, logprobs_of

from ._admission import Admission
from ._errors import Overloaded
from ._hop import (
    ADMITTED,
    ANSWER_CODEC,
    ASK_CODEC,
    ASK_METHOD,
    ITEM_CODEC,
    MAX_DELTA_CHARS,
    MAX_DELTA_LOGPROBS,
    REQUEST_CODEC,
    ROUTE_METHOD,
    RouteTimeouts,
    cancel_when_closed,
)

log = logging.getLogger("skulk.routing")


class RouteServer:
    """Serves the requests other nodes route here (see the module doc)."""

    def __init__(
        self,
        mesh: Mesh,
        lookup: Callable[[str], ModelService | None],
        admission: Admission,
        timeouts: RouteTimeouts,
    ) -> None:
        self._mesh = mesh
        self._lookup = lookup
        self._admission = admission
        self._t = timeouts
        self._nursery: trio.Nursery | None = None
        self.serving = self.served = self.abandoned = self.refused = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    async def handle_rpc(self, method: str, body: bytes) -> bytes:
        await trio.lowlevel.checkpoint()
        try:
            if method == ASK_METHOD:
                return ANSWER_CODEC.encode(await self._answer(body))
            return self._admit(method, body)
        except RpcFailed:
            self.refused += 1
            raise

    async def _answer(self, body: bytes) -> RouteAnswer:
        """Serve a one-answer request (``route.ask``) within the rpc: its deadline, travelling
        from the caller, bounds it; admission as for a generation."""
        try:
            ask = ASK_CODEC.decode(body)
        except WireError as exc:
            raise RpcFailed("bad_request", str(exc)[:200]) from None
        service = self._lookup(ask.instance)
        if service is None:
            raise RpcFailed("instance_not_here", f"instance {ask.instance} does not run here")
        status = service.status()
        if not status.ready:
            raise RpcFailed("not_ready", f"instance {ask.instance} is {status.state}")
        with contextlib.ExitStack() as place:
            try:
                place.enter_context(self._admission.admit(ask.instance))
            except Overloaded as exc:
                raise RpcFailed("overloaded", f"{exc.retry_after:g}") from None
            self.served += 1
            self.serving += 1
            try:
                if isinstance(ask, RouteTokenize):
                    return RouteCounted(await service.count_tokens(ask.prompt))
                done = await service.embed(ask.inputs, ask.truncate)
                return RouteEmbedded(done.vectors, done.prompt_tokens)
            except ModelUnavailable as exc:
                return RouteNotReady(str(exc))
            except RequestFailure as exc:
                return RouteFailed(exc.reason, exc.message)
            finally:
                self.serving -= 1

    def _admit(self, method: str, body: bytes) -> bytes:
        peer = rpc_peer()
        if method != ROUTE_METHOD or peer is None:
            raise RpcFailed("bad_request", f"{method[:64]!r} is not answered here")
        try:
            request = REQUEST_CODEC.decode(body)
            if request.trace_id is not None:
                check_request_id(request.trace_id)
        except (WireError, ValueError) as exc:
            raise RpcFailed("bad_request", str(exc)[:200]) from None
        nursery = self._nursery
        if nursery is None:
            raise RpcFailed("not_serving", "this node does not serve routed requests now")
        service = self._lookup(request.instance)
        if service is None:
            raise RpcFailed("instance_not_here", f"instance {request.instance} does not run here")
        status = service.status()
        if not status.ready:
            raise RpcFailed("not_ready", f"instance {request.instance} is {status.state}")
        link = self._mesh.link(peer)
        if link is None:
            raise RpcFailed("no_link", f"no link back to {peer}")
        place = contextlib.ExitStack()
        try:
            place.enter_context(self._admission.admit(request.instance))
        except Overloaded as exc:
            raise RpcFailed("overloaded", f"{exc.retry_after:g}") from None
        try:
            sender = link.open_stream()
        except LinkBusy:
            place.close()
            raise RpcFailed("overloaded", f"{self._admission.retry_after:g}") from None
        except LinkError as exc:
            place.close()
            raise RpcFailed("no_link", str(exc)[:200]) from None
        self.served += 1
        with contextlib.ExitStack() as traced:
            if request.trace_id is not None:  # the task started runs under the API request's id
                traced.enter_context(request_scope(request.trace_id, instance=request.instance))
                note("route.arrived", f"from node {peer} (route {request.request_id})")
                note("request.admitted", f"instance {request.instance}")
            nursery.start_soon(self._serve, request, service, link, sender, place)
        return ADMITTED

    async def _serve(
        self,
        request: RouteRequest,
        service: ModelService,
        link: Link,
        sender: DataSender,
        place: contextlib.ExitStack,
    ) -> None:
        """Serve one admitted request; never raises but cancellation."""
        self.serving += 1
        failure: RouteFailed | None = None
        try:
            with place:
                await self._stream(request, service, link, sender)
            # The serving node's line per routed request (the API node logs its access line).
            log.info("served a request routed from node %s", link.peer_id)
        except Exception as exc:  # a bug: it fails this request, never run() and its peers
            log.exception("serving routed request %s failed", request.request_id)
            failure = RouteFailed("internal_error", f"{type(exc).__name__} on the serving node")
        except BaseException:  # cancelled: this node is stopping
            failure = RouteFailed("runner_stopped", f"node {self._mesh.node_id} is stopping")
            raise
        finally:
            self.serving -= 1
            if failure is not None and not sender.ended and link.closed is None:
                # Tell the caller rather than leave it to its idle deadline; bounded, and
                # quick to fail if the stream was stopped or has no credit left.
                with trio.move_on_after(min(1.0, self._t.send), shield=True):
                    with contextlib.suppress(LinkError, RuntimeError):
                        await sender.send(ITEM_CODEC.encode(failure), end=True)

    async def _stream(
        self, request: RouteRequest, service: ModelService, link: Link, sender: DataSender
    ) -> None:
        items_in, items_out = trio.open_memory_channel[RouteItem](0)
        why: object = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, request, service, items_in)
            watch = trio.CancelScope()
            nursery.start_soon(cancel_when_closed, link, nursery.cancel_scope, watch)
            try:
                await self._forward(sender, request.request_id, items_out)
            except (StreamStopped, PeerUnreachable, trio.TooSlowError) as exc:
                # The caller went away, or stopped reading: cancelling the pump closes the
                # generator, which cancels the request on the runner. Nobody is left to tell.
                why = exc
                nursery.cancel_scope.cancel()
            else:
                watch.cancel()  # the pump ends by itself: the generator is done
        if why is None and nursery.cancel_scope.cancelled_caught:
            why = "the link closed"  # the watcher cancelled it
        if why is not None:
            self.abandoned += 1
            log.debug("routed request %s abandoned: %s", request.request_id, why)

    async def _pump(
        self,
        request: RouteRequest,
        service: ModelService,
        out: trio.MemorySendChannel[RouteItem],
    ) -> None:
        """Run the generation, putting its items in ``out``; the last one ends the stream."""
        async with out:
            try:
                final = await self._generate_into(request, service, out)
                await out.send(final)
            except trio.BrokenResourceError:
                pass  # the forwarder stopped: the generator is closed already

    async def _generate_into(
        self,
        request: RouteRequest,
        service: ModelService,
        out: trio.MemorySendChannel[RouteItem],
    ) -> RouteItem:
        try:
            async with contextlib.aclosing(
                service.generate(request.prompt, request.params)
            ) as items:
                async for item in items:
                    if isinstance(item, GenerationEnd):
                        return RouteEnd(item)
                    for piece in _pieces(item):
                        await out.send(piece)
            return RouteFailed("runner_stopped", "the generation ended without a result")
        except ModelUnavailable as exc:
            return RouteNotReady(str(exc))
        except RequestFailure as exc:
            return RouteFailed(exc.reason, exc.message)
        except trio.BrokenResourceError:
            raise
        except Exception as exc:
            log.exception("routed request %s: the generation failed", request.request_id)
            return RouteFailed("internal_error", f"{type(exc).__name__} on the serving node")

    async def _forward(
        self, sender: DataSender, request_id: str, items: trio.MemoryReceiveChannel[RouteItem]
    ) -> None:
        """Send the header, then each item (merging deltas that wait together, a keepalive
        after each silent interval), until the final one, sent as the stream's end."""
        async with items:  # closed on the way out: the pump's next send fails
            await self._send(sender, RouteHeader(request_id))
            pending: RouteItem | None = None
            while True:
                item, pending = pending, None
                if item is None:
                    with trio.move_on_after(self._t.keepalive):
                        try:
                            item = await items.receive()
                        except trio.EndOfChannel:
                            item = RouteFailed("internal_error", "the generation vanished")
                    if item is None:
                        await self._send(sender, RouteKeepalive())
                        continue
                if isinstance(item, RouteDelta):
                    item, pending = _merge(item, items)
                final = not isinstance(item, RouteDelta)
                await self._send(sender, item, end=final)
                if final:
                    return

    async def _send(self, sender: DataSender, item: RouteItem, *, end: bool = False) -> None:
        body = ITEM_CODEC.encode(item)
        with trio.fail_after(self._t.send):
            await sender.send(body, end=end)


def _merge(
    delta: RouteDelta, items: trio.MemoryReceiveChannel[RouteItem]
) -> tuple[RouteItem, RouteItem | None]:
    """``delta`` with the deltas already waiting after it (up to :data:`MAX_DELTA_CHARS`), and
    the item that stopped the merge, if one was taken."""
    texts = [delta.text]
    logprobs = list(delta.logprobs)
    size = len(delta.text)
    while True:
        try:
            item = items.receive_nowait()
        except (trio.WouldBlock, trio.EndOfChannel):
            break
        if (
            not isinstance(item, RouteDelta)
            or size + len(item.text) > MAX_DELTA_CHARS
            or len(logprobs) + len(item.logprobs) > MAX_DELTA_LOGPROBS
        ):
            return RouteDelta("".join(texts), tuple(logprobs)), item
        texts.append(item.text)
        logprobs.extend(item.logprobs)
        size += len(item.text)
    return RouteDelta("".join(texts), tuple(logprobs)), None


def _pieces(text: str) -> list[RouteDelta]:
    """A generation's delta as route deltas of at most :data:`MAX_DELTA_CHARS` characters and
    :data:`MAX_DELTA_LOGPROBS` log-probability entries each (text and entries split apart:
    the caller joins them again in order)."""
    entries = logprobs_of(text)
    count = max(-(-len(text) // MAX_DELTA_CHARS), -(-len(entries) // MAX_DELTA_LOGPROBS))
    return [
        RouteDelta(
            str(text[i * MAX_DELTA_CHARS : (i + 1) * MAX_DELTA_CHARS]),
            entries[i * MAX_DELTA_LOGPROBS : (i + 1) * MAX_DELTA_LOGPROBS],
        )
        for i in range(count)
    ]
