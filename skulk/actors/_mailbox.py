"""Bounded mailboxes over ``trio.open_memory_channel``."""

from __future__ import annotations

from typing import Generic, TypeVar

import attrs
import trio

from ._errors import MailboxClosed, MailboxFull

__all__ = ["Mailbox", "MailboxStatistics"]

T = TypeVar("T")


@attrs.frozen
class MailboxStatistics:
    """A snapshot of a :class:`Mailbox` (see :meth:`Mailbox.statistics`)."""

    name: str
    capacity: int
    #: messages buffered now
    queued: int
    #: tasks blocked in :meth:`Mailbox.send` waiting for room
    senders_waiting: int
    #: tasks blocked in :meth:`Mailbox.receive` waiting for a message
    receivers_waiting: int
    #: messages accepted into the buffer since creation
    total_sent: int
    #: messages handed to receivers since creation (drained ones excluded)
    total_received: int
    #: ``send_nowait`` calls refused with :class:`MailboxFull`
    total_rejected_full: int
    #: messages discarded by :meth:`Mailbox.drain_nowait`
    total_drained: int
    #: whether :meth:`Mailbox.close` has been called
    closed: bool


class Mailbox(Generic[T]):
    """A bounded FIFO of messages of type ``T``, one owner of both ends of a memory channel.

    ``capacity`` must be a positive int: there is deliberately no unbounded mode, and no
    zero-capacity rendezvous mode either (a full mailbox is what gives senders backpressure).
    Pick the capacity from how many messages may reasonably pile up behind one slow step of the
    receiver; a sender that must never block uses :meth:`send_nowait` and handles
    :class:`MailboxFull` (shed load, reply "busy", …).

    Closing: :meth:`close` closes the *send* side. Senders blocked in :meth:`send` and later
    senders get :class:`MailboxClosed`; the receiver still gets every message already queued,
    then :class:`trio.EndOfChannel` (``async for`` just ends). That is the clean-shutdown path
    of an actor: close its mailbox, let it drain, let it return.

    Cancellation: :meth:`send` and :meth:`receive` are cancellable like the channel methods they
    wrap; a cancelled ``send`` queued nothing, a cancelled ``receive`` took nothing.
    """

    def __init__(self, capacity: int, *, name: str = "mailbox") -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"mailbox capacity must be an int > 0, got {capacity!r}")
        self.name = name
        self.capacity = capacity
        self._send_channel, self._receive_channel = trio.open_memory_channel[T](capacity)
        self._total_sent = 0
        self._total_received = 0
        self._total_rejected_full = 0
        self._total_drained = 0
        self._closed = False

    def __repr__(self) -> str:
        return f"<Mailbox {self.name!r} capacity={self.capacity} closed={self._closed}>"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has been called (queued messages may remain)."""
        return self._closed

    async def send(self, message: T) -> None:
        """Queue ``message``, waiting for room while the mailbox is full.

        Raises :class:`MailboxClosed` if the mailbox is closed, including while waiting.
        """
        try:
            await self._send_channel.send(message)
        except trio.ClosedResourceError:
            raise MailboxClosed(self.name) from None
        except trio.BrokenResourceError:  # pragma: no cover - we own the receive side
            raise MailboxClosed(self.name) from None
        self._total_sent += 1

    def send_nowait(self, message: T) -> None:
        """Queue ``message`` now or raise: :class:`MailboxFull` or :class:`MailboxClosed`."""
        try:
            self._send_channel.send_nowait(message)
        except trio.WouldBlock:
            self._total_rejected_full += 1
            raise MailboxFull(self.name, self.capacity) from None
        except trio.ClosedResourceError:
            raise MailboxClosed(self.name) from None
        except trio.BrokenResourceError:  # pragma: no cover - we own the receive side
            raise MailboxClosed(self.name) from None
        self._total_sent += 1

    async def receive(self) -> T:
        """Take the oldest message, waiting for one.

        Raises :class:`trio.EndOfChannel` once the mailbox is closed and empty.
        """
        message = await self._receive_channel.receive()
        self._total_received += 1
        return message

    def receive_nowait(self) -> T:
        """Take the oldest message now; :class:`trio.WouldBlock` if empty and open,
        :class:`trio.EndOfChannel` if empty and closed."""
        message = self._receive_channel.receive_nowait()
        self._total_received += 1
        return message

    def __aiter__(self) -> Mailbox[T]:
        return self

    async def __anext__(self) -> T:
        try:
            return await self.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def drain_nowait(self) -> list[T]:
        """Remove and return every queued message without blocking (oldest first).

        Like ``receive_nowait``, this also takes the messages of senders blocked in
        :meth:`send` (their ``send`` then returns normally); to refuse those instead, cancel
        them first (as :class:`~skulk.actors.Actor` does when an incarnation goes down).
        """
        drained: list[T] = []
        while True:
            try:
                drained.append(self._receive_channel.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                break
        self._total_drained += len(drained)
        return drained

    def close(self) -> None:
        """Close the send side (idempotent): no new messages; queued ones are still delivered."""
        self._closed = True
        self._send_channel.close()

    def statistics(self) -> MailboxStatistics:
        """A frozen snapshot of capacity, occupancy, waiters and lifetime counters."""
        channel = self._send_channel.statistics()
        return MailboxStatistics(
            name=self.name,
            capacity=self.capacity,
            queued=channel.current_buffer_used,
            senders_waiting=channel.tasks_waiting_send,
            receivers_waiting=channel.tasks_waiting_receive,
            total_sent=self._total_sent,
            total_received=self._total_received,
            total_rejected_full=self._total_rejected_full,
            total_drained=self._total_drained,
            closed=self._closed,
        )
