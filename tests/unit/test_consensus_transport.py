"""The mesh transport's receive path: raft bodies are decoded in the link's own receive task and
offered to the driver there (no task switch), in arrival order; bodies that waited in a link's
inbox before the transport took the link over are queued for the driver's reader task instead
(the take-over can happen inside the driver's own send), and so is every body after them until
the queue is empty again. Sent bytes are counted by message kind. Over a real :class:`Link`
pair in memory.
"""

from __future__ import annotations

import attrs
import trio
import trio.testing

from skulk.consensus import (
    AppendReply,
    AppendRequest,
    Entry,
    EntryKind,
    MeshTransport,
    Message,
    VoteRequest,
)
from skulk.consensus._meshtransport import MESSAGE_KINDS, PAYLOAD_CODEC, message_kind
from skulk.federation import Link, LinkView
from skulk.wire.raft import SnapshotReply, TimeoutNow, VoteReply

from .test_link import link_pair, wait_for


@attrs.define
class OneLinkMesh:
    """What :class:`MeshTransport` uses of a mesh, holding one link (and not listing it, so
    only a send takes it over)."""

    node_id: str
    peer: Link

    def link(self, peer_id: str) -> Link | None:
        return self.peer if peer_id == self.peer.peer_id else None

    def links(self) -> tuple[LinkView, ...]:
        return ()


def _reply(index: int) -> bytes:
    return PAYLOAD_CODEC.encode(AppendReply(1, True, index))


async def test_bodies_that_waited_are_queued_then_new_ones_are_offered_in_order(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with link_pair() as (a, b), trio.open_nursery() as nursery:
        transport = MeshTransport(OneLinkMesh("node-b", b))  # type: ignore[arg-type]
        await nursery.start(transport.run)
        offered: list[int] = []

        def offer(message: Message) -> bool:
            assert isinstance(message.payload, AppendReply)
            offered.append(message.payload.index)
            return True

        transport.offer_to(offer)
        for index in (1, 2):
            a.send_raft_nowait(_reply(index))
        await wait_for(lambda: b.statistics().raft_queued == 2)
        transport.send(Message("node-b", "node-a", AppendReply(1, True, 0)))  # takes b over
        assert offered == [] and transport.inbound.statistics().current_buffer_used == 2
        a.send_raft_nowait(_reply(3))  # behind queued ones: queued too, to keep the order
        await wait_for(lambda: transport.statistics().received == 3)
        assert offered == []
        queued = [transport.inbound.receive_nowait() for _ in range(3)]
        assert [m.payload.index for m in queued if isinstance(m.payload, AppendReply)] == [1, 2, 3]
        assert all(m.src == "node-a" and m.dst == "node-b" for m in queued)
        a.send_raft_nowait(_reply(4))  # nothing queued now: offered in the link's task
        await wait_for(lambda: offered == [4])
        stats = transport.statistics()
        assert stats.taken_at_once == 1 and stats.received == 4 and stats.readers == 1
        nursery.cancel_scope.cancel()


async def test_a_refused_offer_is_queued(autojump_clock: trio.testing.MockClock) -> None:
    async with link_pair() as (a, b), trio.open_nursery() as nursery:
        transport = MeshTransport(OneLinkMesh("node-b", b))  # type: ignore[arg-type]
        await nursery.start(transport.run)
        transport.offer_to(lambda message: False)
        transport.send(Message("node-b", "node-a", AppendReply(1, True, 0)))
        a.send_raft_nowait(_reply(7))
        with trio.fail_after(5):
            message = await transport.inbound.receive()
        assert message.payload == AppendReply(1, True, 7)
        assert transport.statistics().taken_at_once == 0
        nursery.cancel_scope.cancel()


async def test_bytes_sent_are_counted_by_message_kind(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with link_pair() as (_a, b), trio.open_nursery() as nursery:
        transport = MeshTransport(OneLinkMesh("node-b", b))  # type: ignore[arg-type]
        await nursery.start(transport.run)
        entry = Entry(index=1, term=1, kind=EntryKind.COMMAND, data=b"x" * 100)
        sent = {
            "append": AppendRequest(1, 0, 0, (entry,), 0),
            "heartbeat": AppendRequest(1, 0, 0, (), 0),
            "append_reply": AppendReply(1, True, 0),
            "vote": VoteRequest(1, 0, 0),
        }
        for payload in sent.values():
            transport.send(Message("node-b", "node-a", payload))
        got = transport.statistics().bytes_sent
        assert set(got) == set(MESSAGE_KINDS)
        for kind, payload in sent.items():
            # the link frame around the payload adds a few bytes, never fewer
            body = len(PAYLOAD_CODEC.encode(payload))
            assert body < got[kind] < body + 32
        assert got["append"] > got["heartbeat"] + 100
        assert got["snapshot"] == got["timeout_now"] == 0
        assert message_kind(TimeoutNow(1)) == "timeout_now"
        assert message_kind(VoteReply(1, False)) == "vote"
        assert message_kind(SnapshotReply(1, 1, 0, False)) == "snapshot"
        nursery.cancel_scope.cancel()
