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
isolation on demand) and :class:`MeshTransport` (the federation mesh's ``raft`` topic for
messages, its ``rpc`` topic, method :data:`SUBMIT_METHOD`, for forwarding). Both encode
forwarded submissions with the same codec.
"""

from __future__ import annotations

import enum
import functools
import math
from collections.abc import Awaitable, Callable
from typing import Protocol

import attrs
import trio

from skulk.federation import Link, LinkBusy, Mesh, PeerUnreachable, RpcFailed, RpcTimeout
from skulk.wire import Codec, WireError
from skulk.wire.link import LINK_MAX_FRAME_SIZE
from skulk.wire.raft import RaftPayload

from ._errors import (
    ForwardFailed,
    NoQuorum,
    NotLeader,
    SubmitTimeout,
    Unavailable,
    UnavailableReason,
)
from ._types import Message, NodeId

# --- forwarded submissions ----------------------------------------------------------------


@attrs.frozen
class SubmitRequest:
    """A command forwarded to the leader; ``timeout_ms`` is what is left of the caller's
    deadline when it was sent (the leader answers before it runs out)."""

    command: bytes
    client_id: str
    seq: int
    timeout_ms: int


@attrs.frozen
class Applied:
    """The forwarded command committed; ``result`` is what the state machine returned."""

    result: bytes


class RejectReason(enum.Enum):
    NOT_LEADER = "not_leader"
    NO_QUORUM = "no_quorum"
    TIMEOUT = "timeout"
    UNAVAILABLE = "unavailable"


@attrs.frozen
class Rejected:
    """The forwarded command failed on the receiver: ``reason`` maps back to the driver's typed
    error; ``leader`` is the receiver's leader hint (``not_leader``); ``unavailable`` carries
    the :class:`UnavailableReason` value in ``detail``."""

    reason: RejectReason
    leader: NodeId | None = None
    detail: str = ""


SubmitReply = Applied | Rejected

REQUEST_CODEC: Codec[SubmitRequest] = Codec(SubmitRequest)
REPLY_CODEC: Codec[SubmitReply] = Codec(SubmitReply)

OfferHandler = Callable[[Message], bool]
"""``handler(message)``, called in the task that received ``message``: True if it took the
message (it must not block), False to have it queued in :attr:`Transport.inbound` instead (in
order: a transport queues every later message too while any is queued)."""

SubmitHandler = Callable[[SubmitRequest, float], Awaitable[bytes]]
"""``await handler(request, deadline)``: submit on this node without forwarding (``deadline``
on the Trio clock); returns the result or raises the driver's typed errors."""


def remaining_ms(deadline: float) -> int:
    """Milliseconds left until ``deadline`` (at least 1), for :attr:`SubmitRequest.timeout_ms`."""
    return max(1, math.floor((deadline - trio.current_time()) * 1000))


def reply_for(error: Exception) -> Rejected | None:
    """The :class:`Rejected` a typed driver error travels as (``None`` for anything else)."""
    if isinstance(error, NotLeader):
        return Rejected(RejectReason.NOT_LEADER, error.leader)
    if isinstance(error, NoQuorum):
        return Rejected(RejectReason.NO_QUORUM, detail=error.detail)
    if isinstance(error, SubmitTimeout):
        return Rejected(RejectReason.TIMEOUT, detail=f"{error.timeout:.6f}")
    if isinstance(error, Unavailable):
        return Rejected(RejectReason.UNAVAILABLE, detail=error.reason.value)
    return None


def result_of(reply: SubmitReply, peer: NodeId, timeout: float) -> bytes:
    """The result an answer carries, or the typed error it stands for."""
    if isinstance(reply, Applied):
        return reply.result
    if reply.reason is RejectReason.NOT_LEADER:
        raise NotLeader(reply.leader)
    if reply.reason is RejectReason.NO_QUORUM:
        raise NoQuorum(f"{peer}: {reply.detail}" if reply.detail else peer)
    if reply.reason is RejectReason.TIMEOUT:
        raise SubmitTimeout(timeout)
    try:
        why = UnavailableReason(reply.detail)
    except ValueError:
        raise ForwardFailed(peer, f"unknown unavailable reason {reply.detail!r:.40}") from None
    raise Unavailable(why, f"on {peer}")


async def serve_request(handler: SubmitHandler | None, body: bytes, deadline: float) -> bytes:
    """Decode a forwarded submission, run ``handler`` on it and encode its answer (typed errors
    become :class:`Rejected`). The receiving side of :meth:`Transport.forward`."""
    if handler is None:
        reply: SubmitReply = Rejected(
            RejectReason.UNAVAILABLE, detail=UnavailableReason.STOPPED.value
        )
        return REPLY_CODEC.encode(reply)
    request = REQUEST_CODEC.decode(body)  # WireError: the caller answers "bad request"
    # Answer a little before the caller's deadline, so the answer (not a timeout) reaches it.
    budget = request.timeout_ms / 1000
    deadline = min(deadline, trio.current_time() + budget * 0.95)
    try:
        reply = Applied(await handler(request, deadline))
    except (NotLeader, NoQuorum, SubmitTimeout, Unavailable) as exc:
        rejected = reply_for(exc)
        assert rejected is not None
        reply = rejected
    return REPLY_CODEC.encode(reply)


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


# --- the federation mesh ----------------------------------------------------------------------

SUBMIT_METHOD = "raft.submit"
"""The rpc method a :class:`MeshTransport` answers forwarded submissions on."""

PAYLOAD_CODEC: Codec[RaftPayload] = Codec(RaftPayload, max_frame_size=LINK_MAX_FRAME_SIZE - 1024)
"""One :data:`~skulk.wire.raft.RaftPayload` per ``RaftMessage`` body (``specs/wire.cddl``): the
sender and receiver are the link's authenticated ends, so the payload names neither. The
margin leaves room for the link frame around it."""


@attrs.frozen
class MeshTransportStatistics:
    sent: int
    received: int
    #: messages not sent: no open link to ``dst`` / its control queue full / not encodable
    dropped_no_link: int
    dropped_busy: int
    dropped_unencodable: int
    #: received bodies that did not decode
    rejected_in: int
    #: received messages dropped because :attr:`MeshTransport.inbound` was full
    dropped_full: int
    #: received messages the :meth:`~MeshTransport.offer_to` handler took (the rest were queued)
    taken_at_once: int
    readers: int
    forwards: int
    forwards_served: int


class MeshTransport:
    """A :class:`Transport` over a :class:`~skulk.federation.Mesh`.

    Messages travel on each link's ``raft`` topic as their payload alone
    (:data:`PAYLOAD_CODEC`): a received one is from the link's authenticated peer, to this
    node. Forwarded submissions are rpc calls of :data:`SUBMIT_METHOD`: pass
    :meth:`handle_rpc` (or a handler that delegates that method to it) as the mesh's
    ``rpc_handler``::

        transport: MeshTransport | None = None

        async def rpc(method: str, body: bytes) -> bytes:
            assert transport is not None
            return await transport.handle_rpc(method, body)

        mesh = Mesh(node_id, secret, listen=..., join=..., rpc_handler=rpc)
        transport = MeshTransport(mesh)
        nursery.start_soon(mesh.run); await nursery.start(transport.run)

    While :meth:`run` runs, every open link hands its raft bodies to this transport in the
    link's own receive task (:meth:`Link.receive_raft_with`): they are decoded there and put
    in :attr:`inbound`, with no task of ours in between. Links come and go: the mesh's
    ``events`` channel belongs to the telemetry gossip, so :meth:`run` polls
    :meth:`Mesh.links` every ``poll_interval`` seconds, and :meth:`send` takes over a link it
    finds unwatched; a link's messages wait in its own bounded inbox until then.
    """

    def __init__(self, mesh: Mesh, *, inbox: int = 1024, poll_interval: float = 0.1) -> None:
        self._mesh = mesh
        self._send_channel, self._inbound = trio.open_memory_channel[Message](inbox)
        self._poll_interval = poll_interval
        self._handler: SubmitHandler | None = None
        self._offer: OfferHandler | None = None
        self._last: tuple[RaftPayload, bytes] | None = None  # the last payload sent, encoded
        self._readers: set[Link] = set()
        self._unsent: set[Link] = set()  # links sent to since the last wait_sent
        self._running = False
        self._queue_only = False  # _watch is handing over a link's queued bodies
        self._sent = self._received = self._rejected_in = self._dropped_full = 0
        self._no_link = self._busy = self._unencodable = 0
        self._forwards = self._served = self._taken = 0

    @property
    def node_id(self) -> NodeId:
        return self._mesh.node_id

    @property
    def inbound(self) -> trio.MemoryReceiveChannel[Message]:
        return self._inbound

    def serve_submissions(self, handler: SubmitHandler | None) -> None:
        self._handler = handler

    def offer_to(self, handler: OfferHandler | None) -> None:
        self._offer = handler

    def statistics(self) -> MeshTransportStatistics:
        return MeshTransportStatistics(
            sent=self._sent,
            received=self._received,
            dropped_no_link=self._no_link,
            dropped_busy=self._busy,
            dropped_unencodable=self._unencodable,
            rejected_in=self._rejected_in,
            dropped_full=self._dropped_full,
            taken_at_once=self._taken,
            readers=len(self._readers),
            forwards=self._forwards,
            forwards_served=self._served,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Take the links' raft topics until cancelled."""
        self._running = True
        task_status.started()
        try:
            while True:
                self._readers = {link for link in self._readers if link.closed is None}
                for view in self._mesh.links():
                    if view.peer_id is not None:
                        link = self._mesh.link(view.peer_id)
                        if link is not None:
                            self._watch(link)
                await trio.sleep(self._poll_interval)
        finally:
            self._running = False

    def send(self, message: Message) -> None:
        link = self._mesh.link(message.dst)
        if link is None:
            self._no_link += 1
            return
        self._watch(link)
        try:
            link.send_raft_nowait(self._encode(message.payload))
        except LinkBusy:
            self._busy += 1
        except PeerUnreachable:
            self._no_link += 1
        except WireError:
            self._unencodable += 1
        else:
            self._sent += 1
            self._unsent.add(link)

    def _encode(self, payload: RaftPayload) -> bytes:
        """``payload`` encoded; a leader sends the same AppendRequest to each caught-up
        follower, so the last encoding is reused for an equal payload."""
        last = self._last
        if last is not None and last[0] == payload:
            return last[1]
        body = PAYLOAD_CODEC.encode(payload)
        self._last = (payload, body)
        return body

    async def wait_sent(self) -> None:
        links, self._unsent = self._unsent, set()
        for link in links:
            await link.wait_sent()
        await trio.lowlevel.checkpoint()

    async def forward(self, leader: NodeId, request: SubmitRequest, deadline: float) -> bytes:
        self._forwards += 1
        timeout = deadline - trio.current_time()
        if timeout <= 0:
            raise SubmitTimeout(0.0)
        link = self._mesh.link(leader)
        if link is None:
            raise ForwardFailed(leader, "no open link")
        body = REQUEST_CODEC.encode(attrs.evolve(request, timeout_ms=remaining_ms(deadline)))
        try:
            answer = await link.call(SUBMIT_METHOD, body, timeout)
        except RpcTimeout:
            raise SubmitTimeout(timeout) from None
        except RpcFailed as exc:
            if exc.reason == "deadline_exceeded":
                raise SubmitTimeout(timeout) from None
            raise ForwardFailed(leader, f"{exc.reason}: {exc.message}"[:200]) from None
        except (PeerUnreachable, LinkBusy) as exc:
            raise ForwardFailed(leader, str(exc)[:200]) from None
        try:
            reply = REPLY_CODEC.decode(answer)
        except WireError as exc:
            raise ForwardFailed(leader, f"bad answer: {exc}"[:200]) from None
        return result_of(reply, leader, timeout)

    async def handle_rpc(self, method: str, body: bytes) -> bytes:
        """The mesh ``rpc_handler`` for :data:`SUBMIT_METHOD` (other methods:
        ``RpcFailed("no_such_method")``; an undecodable body: ``RpcFailed("bad_request")``)."""
        if method != SUBMIT_METHOD:
            raise RpcFailed("no_such_method", method[:100])
        self._served += 1
        deadline = trio.current_effective_deadline()
        try:
            return await serve_request(self._handler, body, deadline)
        except WireError as exc:
            raise RpcFailed("bad_request", str(exc)[:200]) from None

    def _watch(self, link: Link) -> None:
        if link in self._readers or not self._running or link.closed is not None:
            return
        self._readers.add(link)
        # Bodies that waited in the link's inbox arrive here at once, possibly inside the
        # driver's own send(): queue them rather than step the driver re-entrantly.
        self._queue_only = True
        try:
            link.receive_raft_with(functools.partial(self._on_body, link.peer_id))
        finally:
            self._queue_only = False

    def _on_body(self, peer: NodeId, body: bytes) -> None:
        """A raft body from ``peer``'s link, in that link's receive task (never blocks)."""
        if not self._running:
            return  # stopped: as if the link's inbox were never read
        try:
            payload = PAYLOAD_CODEC.decode(body)
        except WireError:
            self._rejected_in += 1
            return
        self._received += 1
        message = Message(peer, self.node_id, payload)
        offer = self._offer
        if (
            offer is not None
            and not self._queue_only
            and not self._send_channel.statistics().current_buffer_used
            and offer(message)
        ):
            self._taken += 1
            return
        try:
            self._send_channel.send_nowait(message)
        except trio.WouldBlock:
            self._dropped_full += 1
