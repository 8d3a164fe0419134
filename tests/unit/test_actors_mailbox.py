"""Bounded mailboxes: capacity, nowait, closing, statistics."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from skulk.actors import Mailbox, MailboxClosed, MailboxFull


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True, float("inf")])
def test_capacity_must_be_a_positive_int(capacity: object) -> None:
    with pytest.raises(ValueError, match="capacity"):
        Mailbox(capacity)  # type: ignore[arg-type]


async def test_send_nowait_raises_mailbox_full_at_capacity() -> None:
    mailbox: Mailbox[int] = Mailbox(2, name="m")
    mailbox.send_nowait(1)
    mailbox.send_nowait(2)
    with pytest.raises(MailboxFull) as info:
        mailbox.send_nowait(3)
    assert (info.value.mailbox, info.value.capacity) == ("m", 2)
    assert isinstance(info.value, trio.WouldBlock)
    stats = mailbox.statistics()
    assert (stats.queued, stats.total_sent, stats.total_rejected_full) == (2, 2, 1)
    assert [await mailbox.receive(), mailbox.receive_nowait()] == [1, 2]


async def test_statistics_count_waiters_and_traffic() -> None:
    mailbox: Mailbox[str] = Mailbox(1, name="stats")
    await mailbox.send("a")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mailbox.send, "b")
        nursery.start_soon(mailbox.send, "c")
        await trio.testing.wait_all_tasks_blocked()
        stats = mailbox.statistics()
        assert stats.name == "stats"
        assert stats.capacity == 1
        assert stats.queued == 1
        assert stats.senders_waiting == 2
        assert stats.receivers_waiting == 0
        assert stats.closed is False
        received = {await mailbox.receive() for _ in range(3)}
    assert received == {"a", "b", "c"}
    stats = mailbox.statistics()
    assert (stats.total_sent, stats.total_received, stats.queued) == (3, 3, 0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(mailbox.receive)
        await trio.testing.wait_all_tasks_blocked()
        assert mailbox.statistics().receivers_waiting == 1
        mailbox.send_nowait("d")


async def test_close_drains_then_ends_iteration() -> None:
    mailbox: Mailbox[int] = Mailbox(4)
    for i in range(3):
        mailbox.send_nowait(i)
    mailbox.close()
    mailbox.close()  # idempotent
    assert mailbox.closed
    with pytest.raises(MailboxClosed):
        mailbox.send_nowait(9)
    with pytest.raises(MailboxClosed):
        await mailbox.send(9)
    assert [m async for m in mailbox] == [0, 1, 2]
    with pytest.raises(trio.EndOfChannel):
        await mailbox.receive()
    stats = mailbox.statistics()
    assert stats.closed and stats.queued == 0 and stats.total_received == 3


async def test_close_wakes_blocked_senders() -> None:
    mailbox: Mailbox[int] = Mailbox(1)
    mailbox.send_nowait(0)
    errors: list[BaseException] = []

    async def sender() -> None:
        try:
            await mailbox.send(1)
        except MailboxClosed as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(sender)
        await trio.testing.wait_all_tasks_blocked()
        mailbox.close()
    assert len(errors) == 1
    assert mailbox.drain_nowait() == [0]
    assert mailbox.statistics().total_drained == 1


async def test_cancelled_send_queues_nothing(autojump_clock: trio.testing.MockClock) -> None:
    mailbox: Mailbox[int] = Mailbox(1)
    mailbox.send_nowait(0)
    with trio.move_on_after(1):
        await mailbox.send(1)
    assert mailbox.drain_nowait() == [0]
    assert mailbox.statistics().total_sent == 1
