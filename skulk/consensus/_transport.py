"""The Raft driver's network: lossy message delivery plus one forwarding call.

A :class:`Transport` gives the driver three things:

* :meth:`~Transport.send` -- queue one :class:`Message` for its ``dst``; never blocks, may
  drop (Raft retries on its own: heartbeats, probes, elections);
* :attr:`~Transport.inbound` -- a bounded receive channel of the messages addressed to this
  node (a full channel drops; the source of each message is authenticated by the transport);
  a transport may first offer each message to the handler given to
  :meth:`~Transport.offer_to`, in the task that received it, and queue it only if refused;
* :meth:`~Transport.forward` -- hand a submission to the node believed to lead and wait for
  its result, under the caller's deadline. On the leader the transport calls the handler the
  driver registered with :meth:`~Transport.serve_submissions`.

:meth:`~Transport.forward` returns the command's result or raises the driver's typed errors as
the leader raised them (:class:`NotLeader`, :class:`NoQuorum`, :class:`SubmitTimeout`,
:class:`Unavailable`), :class:`SubmitTimeout` at the deadline, and :class:`ForwardFailed` when
the peer cannot be reached.

Two implementations: :class:`MemoryNetwork` (in-process, for tests: partitions and node
isolation on demand) and :class:`~._meshtransport.MeshTransport` (the federation mesh's ``raft``
topic for messages, its ``rpc`` topic, method :data:`~._meshtransport.SUBMIT_METHOD`, for
forwarding). Both encode forwarded submissions with the same codec (:mod:`._forwarding`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import attrs
import trio

from skulk.wire import WireError

from ._errors import ForwardFailed, SubmitTimeout
from ._forwarding import (
    REPLY_CODEC,
    REQUEST_CODEC,
    SubmitHandler,
    SubmitRequest,
    remaining_ms,
    result_of,
    serve_request,
)
from ._types import Message, NodeId

OfferHandler = Callable[[Message], bool]
"""``handler(message)``, called in the task that received ``message``: True if it took the
message (it must not block), False to have it queued in :attr:`Transport.inbound` instead (in
order: a transport queues every later message too while any is queued)."""


class Transport(Protocol):
    """What :class:`~skulk.consensus.RaftDriver` needs from the network (see the module doc)."""

    @property
    def node_id(self) -> NodeId: ...

    @property
    def inbound(self) -> trio.MemoryReceiveChannel[Message]:
        """Messages for this node, in arrival order; bounded (full: newer ones dropped)."""
        ...

    def send(self, message: Message) -> None:
        """Queue ``message`` for ``message.dst``; never blocks, never raises for a peer that is
        down, busy or unknown (the message is dropped and counted)."""
        ...

    async def forward(self, leader: NodeId, request: SubmitRequest, deadline: float) -> bytes:
        """Submit ``request`` on ``leader`` (see the module doc for the errors)."""
        ...

    def serve_submissions(self, handler: SubmitHandler | None) -> None:
        """Answer forwarded submissions with ``handler`` from now on (``None``: answer
        ``unavailable``/``stopped``)."""
        ...

    async def wait_sent(self) -> None:
        """Wait until the messages given to :meth:`send` so far are written to the network
        (or can no longer be). Latency only, never correctness: the driver calls it, under a
        short deadline, before it blocks the Trio thread with an fsync, so that the
        AppendRequests it just sent are on the wire meanwhile."""
        ...

    def offer_to(self, handler: OfferHandler | None) -> None:
        """Offer received messages to ``handler`` before queueing them in :attr:`inbound`
        (``None``: stop). Latency only: it saves the task switch to the reader of
        :attr:`inbound`; a transport may ignore it."""
        ...


# --- in-process network for tests -----------------------------------------------------------


@attrs.frozen
class NetworkStatistics:
    delivered: int
    dropped_full: int
    dropped_cut: int
    forwards: int


class MemoryNetwork:
    """Connects in-process transports: ``net.join("n1")`` gives node n1's :class:`Transport`.

    Messages are delivered at once into the destination's bounded inbox (``inbox`` messages;
    full: dropped). :meth:`cut` / :meth:`isolate` drop traffic (both messages and forwards)
    between node pairs until :meth:`heal`. Forwarded submissions go through the same codec as
    on the mesh, so their typed errors round-trip as they would over the wire.
    """

    def __init__(self, *, inbox: int = 1024) -> None:
        self._inbox = inbox
        self._nodes: dict[NodeId, MemoryTransport] = {}
        self._cut: set[frozenset[NodeId]] = set()
        self._isolated: set[NodeId] = set()
        self.delivered = self.dropped_full = self.dropped_cut = self.forwards = 0

    def join(self, node_id: NodeId) -> MemoryTransport:
        """The transport of ``node_id`` (a fresh inbox if the node joins again after
        :meth:`leave`, as a restarted process would have)."""
        transport = MemoryTransport(self, node_id, self._inbox)
        self._nodes[node_id] = transport
        return transport

    def leave(self, node_id: NodeId) -> None:
        """Forget ``node_id``: traffic to it is dropped until it joins again."""
        self._nodes.pop(node_id, None)

    def cut(self, a: NodeId, b: NodeId) -> None:
        """Drop all traffic between ``a`` and ``b`` (both ways)."""
        self._cut.add(frozenset((a, b)))

    def isolate(self, node_id: NodeId) -> None:
        """Drop all traffic to and from ``node_id``."""
        self._isolated.add(node_id)

    def heal(self) -> None:
        """Undo every :meth:`cut` and :meth:`isolate`."""
        self._cut.clear()
        self._isolated.clear()

    def connected(self, a: NodeId, b: NodeId) -> bool:
        return (
            a not in self._isolated
            and b not in self._isolated
            and frozenset((a, b)) not in self._cut
        )

    def statistics(self) -> NetworkStatistics:
        return NetworkStatistics(self.delivered, self.dropped_full, self.dropped_cut, self.forwards)

    def _deliver(self, message: Message) -> None:
        target = self._nodes.get(message.dst)
        if target is None or not self.connected(message.src, message.dst):
            self.dropped_cut += 1
            return
        try:
            target._send_channel.send_nowait(message)
            self.delivered += 1
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self.dropped_full += 1

    async def _forward(
        self, src: NodeId, leader: NodeId, request: SubmitRequest, deadline: float
    ) -> bytes:
        self.forwards += 1
        target = self._nodes.get(leader)
        if target is None or not self.connected(src, leader):
            raise ForwardFailed(leader, "not connected")
        timeout = max(0.0, deadline - trio.current_time())
        with trio.move_on_at(deadline):
            body = REQUEST_CODEC.encode(attrs.evolve(request, timeout_ms=remaining_ms(deadline)))
            answer = await serve_request(target._handler, body, deadline)
            if not self.connected(src, leader):  # cut while the leader worked: answer lost
                raise ForwardFailed(leader, "connection cut")
            try:
                reply = REPLY_CODEC.decode(answer)
            except WireError as exc:  # pragma: no cover - our own encoder made it
                raise ForwardFailed(leader, f"bad answer: {exc}") from None
            return result_of(reply, leader, timeout)
        raise SubmitTimeout(timeout)


class MemoryTransport:
    """One node's end of a :class:`MemoryNetwork` (see :class:`Transport`)."""

    def __init__(self, network: MemoryNetwork, node_id: NodeId, inbox: int) -> None:
        self._network = network
        self._node_id = node_id
        self._send_channel, self._inbound = trio.open_memory_channel[Message](inbox)
        self._handler: SubmitHandler | None = None

    @property
    def node_id(self) -> NodeId:
        return self._node_id

    @property
    def inbound(self) -> trio.MemoryReceiveChannel[Message]:
        return self._inbound

    def send(self, message: Message) -> None:
        self._network._deliver(message)

    async def forward(self, leader: NodeId, request: SubmitRequest, deadline: float) -> bytes:
        return await self._network._forward(self._node_id, leader, request, deadline)

    def serve_submissions(self, handler: SubmitHandler | None) -> None:
        self._handler = handler

    async def wait_sent(self) -> None:
        await trio.lowlevel.checkpoint()  # delivered already, in send()

    def offer_to(self, handler: OfferHandler | None) -> None:
        """Ignored: messages always travel through :attr:`inbound` here (a send never steps
        the receiving node within the sender's task)."""
