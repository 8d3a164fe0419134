"""A request served on another node: rpc admission, then the answer on a data stream.

API node A, for an instance whose rank 0 runs on node B (both sides are :class:`RemoteRouting`)::

    A: generate()  ── rpc route.generate(RouteRequest) ──▶  B: handle_rpc(): look up, check
                   ◀──────── "admitted" / RpcFailed ─────     ready, admit (or refuse, typed)
    A: handle_stream() ◀── data stream: RouteHeader, RouteDelta… (RouteKeepalive while
                           silent), then RouteEnd | RouteFailed | RouteNotReady ── B
    A: generate() yields the deltas, then the GenerationEnd

Never through the leader, never in the log. The caller is the rpc's authenticated peer
(:func:`~skulk.federation.rpc_peer`): B streams the answer back on its link to that node, so a
request cannot name another node to send an answer to. Each item is one chunk of one stream:
a text delta costs one data frame, never an rpc, and deltas waiting while the stream is held
back by flow control are merged into one (the runner's deltas are merged already, every
``stream_interval``, by the :class:`~skulk.worker.ModelService`).

Cancellation: closing A's generator (a client disconnect) closes the receiver, which stops the
stream; B's next send (the next delta, or the next keepalive while the model is silent: within
``keepalive``) sees :class:`~skulk.federation.StreamStopped` and closes the service's
generator, which cancels the request on the runner. B also cancels the generation as soon as
its link to A has closed. A stream B gives up (a stalled receiver, a bug) ends on A at the
idle deadline; one B stops serving (shutdown) ends at once with ``runner_stopped``.

Deadlines (:class:`RouteTimeouts`, which says what each bounds): ``admit`` 5 s (the rpc, then
the stream's opening), ``header`` 5 s (an incoming stream naming its request), ``send`` 30 s
(one chunk waiting for A's credit on B: a stalled receiver cannot hold a runner slot longer),
``keepalive`` 2 s (B's longest silence), ``idle`` 10 s (A's longest wait for the next chunk).
A lost link is noticed sooner than ``idle``: at once for a closed connection, within the
link's liveness timeout (5 s by default) for a silent peer.

Refusals are typed: :class:`~skulk.routing.Overloaded` (B's admission bound; the API answers
429 with ``Retry-After``), :class:`~skulk.routing.RemoteUnavailable` (the instance is not
ready on B, or no longer there: 503), :class:`~skulk.routing.NodeUnreachable` (a
``RequestFailure("node_unreachable")``: B lost), and ``RequestFailure`` with the runner's own
reasons, unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable

import attrs
import trio

from skulk.federation import DataReceiver, Mesh
from skulk.wire.runner import EmbedInput, GenerationEnd, Prompt, SamplingParams
from skulk.worker import Embedding, ModelService

from ._admission import Admission
from ._calling import RouteCaller
from ._hop import ASK_METHOD, ROUTE_METHOD, RouteTimeouts
from ._serving import RouteServer

__all__ = ["ASK_METHOD", "ROUTE_METHOD", "RemoteRouting", "RouteTimeouts", "RoutingStatistics"]


@attrs.frozen
class RoutingStatistics:
    """A snapshot of :class:`RemoteRouting`."""

    #: generations this node serves for other nodes now, and since the start
    serving: int
    served: int
    #: served generations cancelled because the caller stopped, stalled or was lost
    abandoned: int
    #: route requests refused (bad, not here, not ready, overloaded)
    refused: int
    #: this node's requests waiting for, or reading, an answer stream
    waiting: int
    #: incoming streams closed for want of a valid header naming an awaited request
    streams_refused: int


class RemoteRouting:
    """Both ends of the remote hop (see the module doc).

    ``lookup(instance)`` is the service running ``instance``'s rank 0 on this node (``None``:
    not here). Wiring: :meth:`run` in the node's nursery; :meth:`handle_rpc` answers
    :data:`ROUTE_METHOD` and :data:`ASK_METHOD` in the mesh's rpc handler;
    :meth:`handle_stream` is the mesh's ``stream_handler``; the API side calls
    :meth:`generate`, :meth:`count_tokens` and :meth:`embed`. Requests served here go through
    ``admission``, as local requests do.
    """

    def __init__(
        self,
        mesh: Mesh,
        lookup: Callable[[str], ModelService | None],
        admission: Admission,
        *,
        timeouts: RouteTimeouts = RouteTimeouts(),  # noqa: B008 - frozen, so sharing is safe
    ) -> None:
        self.timeouts = timeouts
        self._server = RouteServer(mesh, lookup, admission, timeouts)
        self._caller = RouteCaller(mesh, timeouts)

    def statistics(self) -> RoutingStatistics:
        server, caller = self._server, self._caller
        return RoutingStatistics(
            serving=server.serving,
            served=server.served,
            abandoned=server.abandoned,
            refused=server.refused,
            waiting=caller.waiting,
            streams_refused=caller.streams_refused,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the generations this node serves for others, until cancelled (which cancels
        them; each tells its caller ``runner_stopped`` if it can, within a second)."""
        await self._server.run(task_status=task_status)

    # ---- the serving node ----

    async def handle_rpc(self, method: str, body: bytes) -> bytes:
        """Admit a :class:`~skulk.wire.routing.RouteRequest` from the calling peer and start
        serving it; answers ``b"admitted"``, or raises ``RpcFailed`` with reason
        ``bad_request``, ``instance_not_here``, ``not_ready``, ``overloaded`` (message: the
        seconds to wait), ``not_serving`` (:meth:`run` is not running) or ``no_link``. Answers
        only calls that came over a mesh link (:func:`~skulk.federation.rpc_peer` names the
        caller, which the answer stream goes back to)."""
        return await self._server.handle_rpc(method, body)

    # ---- the API node ----

    async def handle_stream(self, peer: str, receiver: DataReceiver) -> None:
        """The mesh's stream handler: hand an answer stream to the request waiting for it,
        and return once that request is done with it. A stream whose first chunk is not the
        header of a request this node asked ``peer`` (and still waits for), or that brings
        none within the header deadline, is closed at once, which cancels it on the sender."""
        await self._caller.handle_stream(peer, receiver)

    def generate(
        self, node: str, instance: str, prompt: Prompt, params: SamplingParams
    ) -> AsyncGenerator[str | GenerationEnd, None]:
        """Serve one request on ``instance``, whose rank 0 runs on ``node``: yield text
        deltas, then one :class:`~skulk.wire.runner.GenerationEnd` (as ``ModelService.generate``).

        Raises before any output :class:`~skulk.routing.Overloaded`,
        :class:`~skulk.routing.RemoteUnavailable` or ``RequestFailure`` (``invalid_request``:
        the request cannot be encoded; ``prompt_too_long``: it is larger than a link frame);
        at any point :class:`~skulk.routing.NodeUnreachable` or the runner's
        ``RequestFailure``. Every wait is bounded (:class:`RouteTimeouts`). Closing the
        generator early cancels the generation on ``node``.
        """
        return self._caller.generate(node, instance, prompt, params)

    async def count_tokens(self, node: str, instance: str, prompt: Prompt) -> int:
        """``prompt``'s token count from ``instance`` on ``node`` (rpc ``route.ask``, bounded
        by ``timeouts.ask``); raises what :meth:`generate` raises before any output."""
        return await self._caller.count_tokens(node, instance, prompt)

    async def embed(
        self, node: str, instance: str, inputs: tuple[EmbedInput, ...], truncate: bool = False
    ) -> Embedding:
        """``inputs`` embedded by ``instance`` on ``node`` (rpc ``route.ask``)."""
        return await self._caller.embed(node, instance, inputs, truncate)
