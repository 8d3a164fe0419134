"""The calling end of the remote hop: ask a node to serve a request, read its answer stream.

:meth:`RouteCaller.generate` registers the request id, calls ``route.generate`` on the serving
node and waits for the stream that :meth:`RouteCaller.handle_stream` (the mesh's stream
handler) hands over once its header names the request; then it reads the items, each wait
bounded. The receiver belongs to the request from the hand-over on; which streams are
refused, and why the handler waits until the request has closed the receiver, is
:class:`~skulk.federation.StreamClaims`' contract.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator

import trio

from skulk.federation import (
    DataReceiver,
    Link,
    LinkBusy,
    LinkError,
    Mesh,
    PeerUnreachable,
    RpcFailed,
    StreamClaim,
    StreamClaims,
)
from skulk.tracing import current_request_id, note
from skulk.wire import FrameTooLarge, WireError
from skulk.wire.routing import (
    RouteAsk,
    RouteCounted,
    RouteDelta,
    RouteEmbed,
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
from skulk.wire.runner import EmbedInput, GenerationEnd, Prompt, SamplingParams
from skulk.worker import Embedding, RequestFailure, ScoredText

from ._errors import RETRY_AFTER, NodeUnreachable, Overloaded, RemoteUnavailable
from ._hop import (
    ADMITTED,
    ANSWER_CODEC,
    ASK_CODEC,
    ASK_METHOD,
    ITEM_CODEC,
    MAX_RETRY_AFTER,
    REQUEST_CODEC,
    ROUTE_METHOD,
    RouteTimeouts,
)


class RouteCaller:
    """Routes this node's requests to the nodes serving them (see the module doc)."""

    def __init__(self, mesh: Mesh, timeouts: RouteTimeouts) -> None:
        self._mesh = mesh
        self._t = timeouts
        self._claims = StreamClaims(ITEM_CODEC.decode, RouteHeader, header_timeout=timeouts.header)

    @property
    def waiting(self) -> int:
        return self._claims.waiting

    @property
    def streams_refused(self) -> int:
        return self._claims.streams_refused

    async def handle_stream(self, peer: str, receiver: DataReceiver) -> None:
        await self._claims.handle_stream(peer, receiver)

    async def generate(
        self, node: str, instance: str, prompt: Prompt, params: SamplingParams
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        request_id = uuid.uuid4().hex
        try:
            ask = RouteRequest(request_id, instance, prompt, params, current_request_id())
            body = REQUEST_CODEC.encode(ask)
        except WireError as exc:
            raise RequestFailure("invalid_request", f"the request cannot be sent: {exc}") from None
        link = self._mesh.link(node)
        if link is None:
            raise NodeUnreachable(node, "no link to it")
        async with self._claims.expect(request_id, node) as claim:
            note("route.hop", f"to node {node} (route {request_id})")
            await self._ask(link, node, instance, body)
            receiver = await self._answer_stream(link, node, claim)
            note("route.stream", f"node {node} answers")
            while True:
                match await self._next_item(node, receiver):
                    case RouteDelta(text=text, logprobs=logprobs):
                        yield ScoredText(text, logprobs) if logprobs else text
                    case RouteKeepalive():
                        pass
                    case RouteEnd(end=end):
                        yield end
                        return
                    case RouteFailed(reason=reason, message=message):
                        raise RequestFailure(reason, message)
                    case RouteNotReady(message=message):
                        raise RemoteUnavailable(node, instance, message)
                    case RouteHeader():
                        raise NodeUnreachable(node, "a second header on its answer stream")

    async def count_tokens(self, node: str, instance: str, prompt: Prompt) -> int:
        """``prompt``'s token count from ``instance``, whose rank 0 runs on ``node``."""
        answer = await self._ask_once(node, RouteTokenize(uuid.uuid4().hex, instance, prompt))
        if not isinstance(answer, RouteCounted):
            raise NodeUnreachable(node, "an answer of the wrong kind")
        return answer.prompt_tokens

    async def embed(
        self, node: str, instance: str, inputs: tuple[EmbedInput, ...], truncate: bool
    ) -> Embedding:
        """``inputs`` embedded by ``instance``, whose rank 0 runs on ``node``."""
        ask = RouteEmbed(uuid.uuid4().hex, instance, inputs, truncate)
        answer = await self._ask_once(node, ask)
        if not isinstance(answer, RouteEmbedded):
            raise NodeUnreachable(node, "an answer of the wrong kind")
        return Embedding(answer.vectors, answer.prompt_tokens)

    async def _ask_once(self, node: str, ask: RouteAsk) -> RouteCounted | RouteEmbedded:
        """One ``route.ask`` rpc: the answer, or the typed error it stands for."""
        try:
            body = ASK_CODEC.encode(ask)
        except WireError as exc:
            raise RequestFailure("invalid_request", f"the request cannot be sent: {exc}") from None
        link = self._mesh.link(node)
        if link is None:
            raise NodeUnreachable(node, "no link to it")
        try:
            raw = await link.call(ASK_METHOD, body, self._t.ask)
        except RpcFailed as exc:
            raise _refusal(node, ask.instance, exc) from None
        except LinkBusy as exc:
            raise Overloaded(ask.instance, RETRY_AFTER, f"cannot be asked now: {exc}") from None
        except LinkError as exc:  # PeerUnreachable, RpcTimeout
            raise NodeUnreachable(node, str(exc)) from None
        except FrameTooLarge as exc:
            raise RequestFailure(
                "prompt_too_long", f"the request is too large to route to node {node}: {exc}"
            ) from None
        try:
            answer = ANSWER_CODEC.decode(raw)
        except WireError as exc:
            raise NodeUnreachable(node, f"a malformed answer: {exc}") from None
        match answer:
            case RouteFailed(reason=reason, message=message):
                raise RequestFailure(reason, message)
            case RouteNotReady(message=message):
                raise RemoteUnavailable(node, ask.instance, message)
            case _:
                return answer

    async def _ask(self, link: Link, node: str, instance: str, body: bytes) -> None:
        try:
            answer = await link.call(ROUTE_METHOD, body, self._t.admit)
        except RpcFailed as exc:
            raise _refusal(node, instance, exc) from None
        except LinkBusy as exc:
            raise Overloaded(instance, RETRY_AFTER, f"cannot be asked now: {exc}") from None
        except LinkError as exc:  # PeerUnreachable, RpcTimeout
            raise NodeUnreachable(node, str(exc)) from None
        except FrameTooLarge as exc:
            raise RequestFailure(
                "prompt_too_long", f"the request is too large to route to node {node}: {exc}"
            ) from None
        if answer != ADMITTED:
            raise NodeUnreachable(node, f"an unexpected answer {answer[:40]!r}")

    async def _answer_stream(self, link: Link, node: str, claim: StreamClaim) -> DataReceiver:
        receiver = await claim.wait(link, self._t.admit)
        if receiver is not None:
            return receiver
        if link.closed is not None:
            raise NodeUnreachable(node, str(PeerUnreachable(link.closed)))
        raise NodeUnreachable(node, f"its answer stream did not open within {self._t.admit:g} s")

    async def _next_item(self, node: str, receiver: DataReceiver) -> RouteItem:
        with trio.move_on_after(self._t.idle):
            try:
                chunk = await receiver.receive()
            except trio.EndOfChannel:
                raise NodeUnreachable(node, "its answer stream ended without an end") from None
            except PeerUnreachable as exc:
                raise NodeUnreachable(node, str(exc)) from None
            try:
                return ITEM_CODEC.decode(chunk)
            except WireError as exc:
                raise NodeUnreachable(node, f"a malformed answer chunk: {exc}") from None
        raise NodeUnreachable(node, f"nothing on its answer stream for {self._t.idle:g} s")


def _refusal(node: str, instance: str, exc: RpcFailed) -> Exception:
    """The typed error for a refused admission."""
    if exc.reason == "overloaded":
        try:
            retry = float(exc.message)
        except ValueError:
            retry = RETRY_AFTER
        if not 0 <= retry <= MAX_RETRY_AFTER:  # NaN too
            retry = RETRY_AFTER
        return Overloaded(instance, retry, f"is at its limit on node {node}")
    if exc.reason == "busy":  # the link's own bound on rpcs in flight
        return Overloaded(instance, RETRY_AFTER, f"cannot be asked now: node {node} is busy")
    if exc.reason in ("not_ready", "instance_not_here", "not_serving", "no_handler"):
        return RemoteUnavailable(node, instance, exc.message or exc.reason)
    if exc.reason in ("no_link", "deadline_exceeded"):
        return NodeUnreachable(node, f"{exc.reason}: {exc.message}")
    return RequestFailure("route_refused", f"node {node} refused the request: {exc}")
