"""The Raft driver's :class:`~._transport.Transport` over the federation mesh: messages on each
link's ``raft`` topic, forwarded submissions as rpc calls of :data:`SUBMIT_METHOD`."""

from __future__ import annotations

import functools

import attrs
import trio

from skulk.federation import Link, LinkBusy, Mesh, PeerUnreachable, RpcFailed, RpcTimeout
from skulk.wire import Codec, WireError
from skulk.wire.link import LINK_MAX_FRAME_SIZE
from skulk.wire.raft import (
    AppendReply,
    AppendRequest,
    RaftPayload,
    SnapshotChunk,
    SnapshotReply,
    VoteReply,
    VoteRequest,
)

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
from ._transport import OfferHandler
from ._types import Message, NodeId

SUBMIT_METHOD = "raft.submit"
"""The rpc method a :class:`MeshTransport` answers forwarded submissions on."""

PAYLOAD_CODEC: Codec[RaftPayload] = Codec(RaftPayload, max_frame_size=LINK_MAX_FRAME_SIZE - 1024)
"""One :data:`~skulk.wire.raft.RaftPayload` per ``RaftMessage`` body (``specs/wire.cddl``): the
sender and receiver are the link's authenticated ends, so the payload names neither. The
margin leaves room for the link frame around it."""


MESSAGE_KINDS = ("append", "heartbeat", "append_reply", "vote", "snapshot", "timeout_now")
"""What :func:`message_kind` names: an AppendRequest carrying entries, one without (a
heartbeat), an AppendReply, a (pre-)vote request or reply, an InstallSnapshot chunk or reply,
a TimeoutNow."""


def message_kind(payload: RaftPayload) -> str:
    """The :data:`MESSAGE_KINDS` name of ``payload`` (the transport counts bytes by it)."""
    if isinstance(payload, AppendRequest):
        return "append" if payload.entries else "heartbeat"
    if isinstance(payload, AppendReply):
        return "append_reply"
    if isinstance(payload, VoteRequest | VoteReply):
        return "vote"
    if isinstance(payload, SnapshotChunk | SnapshotReply):
        return "snapshot"
    return "timeout_now"


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
    #: bytes of the raft frames queued on links, by :func:`message_kind`
    bytes_sent: dict[str, int]


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
        self._bytes_sent: dict[str, int] = dict.fromkeys(MESSAGE_KINDS, 0)

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
            bytes_sent=dict(self._bytes_sent),
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
            size = link.send_raft_nowait(self._encode(message.payload))
        except LinkBusy:
            self._busy += 1
        except PeerUnreachable:
            self._no_link += 1
        except WireError:
            self._unencodable += 1
        else:
            self._sent += 1
            self._bytes_sent[message_kind(message.payload)] += size
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
