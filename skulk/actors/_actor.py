"""Actors with request/reply over a bounded mailbox and one-slot reply channels."""

from __future__ import annotations

import enum
from typing import Generic, TypeVar

import attrs
import outcome
import trio

from ._errors import ActorDied, ActorError, ActorStopped, MailboxClosed
from ._mailbox import Mailbox, MailboxStatistics

__all__ = ["Actor", "ActorState", "ActorStatistics", "Request"]

Q = TypeVar("Q")
R = TypeVar("R")


class Request(Generic[Q, R]):
    """One message in an actor's mailbox: a ``payload`` and, for a call, the caller's reply slot.

    The reply slot is a one-slot memory channel, so :meth:`reply` and :meth:`fail` never block.
    The actor may answer later than the moment it received the request (keep the request, reply
    when the work is done); if the actor goes down first, the caller is failed for it.
    """

    __slots__ = ("_abandoned", "_reply_to", "payload")

    def __init__(
        self, payload: Q, reply_to: trio.MemorySendChannel[outcome.Outcome[R]] | None
    ) -> None:
        self.payload = payload
        self._reply_to = reply_to
        self._abandoned = False

    def __repr__(self) -> str:
        return f"<Request {self.payload!r} expects_reply={self.expects_reply}>"

    @property
    def expects_reply(self) -> bool:
        """True for :meth:`Actor.call` requests not yet answered; False for ``tell`` messages."""
        return self._reply_to is not None

    @property
    def abandoned(self) -> bool:
        """True once the caller stopped waiting (its timeout fired, or it was cancelled)."""
        return self._abandoned

    def reply(self, value: R) -> bool:
        """Answer the caller with ``value``.

        Returns True if the value was handed over; False if there is nobody to hand it to
        (a ``tell`` message, a caller that gave up, or a request already answered or failed).
        """
        return self._complete(outcome.Value(value))

    def fail(self, error: BaseException) -> bool:
        """Make the caller's ``call`` raise ``error``; same return value as :meth:`reply`."""
        return self._complete(outcome.Error(error))

    def _complete(self, result: outcome.Outcome[R]) -> bool:
        reply_to, self._reply_to = self._reply_to, None
        if reply_to is None:
            return False
        try:
            reply_to.send_nowait(result)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False
        finally:
            reply_to.close()
        return True


class ActorState(enum.Enum):
    """Lifecycle of an :class:`Actor` across incarnations."""

    #: never run; requests queue up for the first incarnation
    IDLE = "idle"
    RUNNING = "running"
    #: its last incarnation raised; calls fail with :class:`ActorDied` until it runs again
    DEAD = "dead"
    #: its last incarnation returned or was cancelled, or it was closed; calls fail with
    #: :class:`ActorStopped` (until it runs again, unless closed)
    STOPPED = "stopped"


@attrs.frozen
class ActorStatistics:
    """A snapshot of an :class:`Actor` (see :meth:`Actor.statistics`)."""

    name: str
    state: ActorState
    #: times :meth:`Actor.run` has been entered
    incarnations: int
    #: callers waiting for a reply now (queued or being worked on)
    calls_waiting: int
    #: callers and tellers blocked on the full mailbox now
    senders_blocked: int
    total_calls: int
    #: callers (and blocked tellers) failed because the actor went down
    total_failed_by_death: int
    mailbox: MailboxStatistics


@attrs.define(eq=False)
class _PendingSend:
    is_call: bool
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    error: ActorError | None = None


class Actor(Generic[Q, R]):
    """A task that serves requests of type ``Q`` with replies of type ``R`` from a bounded mailbox.

    Subclass and override :meth:`handle` (one request at a time, reply = return value) or, for
    anything richer (replying later, ``tell`` messages, several inputs merged into one
    mailbox), :meth:`main`. Run it with ``await actor.run()`` — usually as a supervised child:
    ``await supervisor.start(actor.run, name=actor.name)``. Each call of :meth:`run` is one
    incarnation; the mailbox and the callers' view of the actor survive restarts.

    Failure contract: when an incarnation ends — it raised (``ActorDied(name, cause)``), it
    returned or was cancelled (``ActorStopped``) — **every** caller waiting for a reply, every
    queued request and every caller blocked on the full mailbox fails *at once*, not at its
    timeout, and the queue is emptied (queued ``tell`` messages are dropped, as in Erlang).
    While the actor is down, new calls fail immediately the same way; once :meth:`run` is
    entered again (a supervisor restart), calls work again. Before the first incarnation
    (:attr:`ActorState.IDLE`) requests queue up.

    Caller timeouts are ordinary Trio cancel scopes around :meth:`call`; a reply to a caller
    that gave up is dropped (:meth:`Request.reply` returns False).

    Clean shutdown: :meth:`close` closes the mailbox: new calls fail with :class:`ActorStopped`,
    queued requests are still served, then the default :meth:`main` returns and the actor is
    STOPPED (a ``transient`` child is then not restarted). A closed actor cannot be reopened,
    so supervise closable actors as ``transient`` (the default): a ``permanent`` child that
    returns is restarted, returns again at once, and ends up tripping its breaker.
    """

    def __init__(self, *, name: str, capacity: int = 16) -> None:
        self.name = name
        self._mailbox: Mailbox[Request[Q, R]] = Mailbox(capacity, name=name)
        self._state = ActorState.IDLE
        self._cause: BaseException | None = None
        self._waiting: set[Request[Q, R]] = set()
        self._senders: set[_PendingSend] = set()
        self._incarnations = 0
        self._total_calls = 0
        self._total_failed_by_death = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} {self._state.value}>"

    @property
    def state(self) -> ActorState:
        return self._state

    # -- the actor's side -----------------------------------------------------------------

    async def handle(self, payload: Q) -> R:
        """Serve one request; the return value is the reply. Raising crashes the actor."""
        raise NotImplementedError(f"{type(self).__name__} must override handle() or main()")

    async def main(self, inbox: Mailbox[Request[Q, R]]) -> None:
        """The body of one incarnation. Default: ``handle`` each request in order until closed.

        Override for custom loops; reply through :meth:`Request.reply` whenever ready. Return
        to stop; raise to crash (let it crash: the supervisor restarts, callers are failed).
        """
        async for request in inbox:
            request.reply(await self.handle(request.payload))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run one incarnation: :meth:`main` over the mailbox, failing all callers when it ends.

        Signals ``task_status.started()`` once it accepts requests. Re-raises whatever
        :meth:`main` raised (so a supervisor sees the crash) after failing the callers.
        """
        if self._state is ActorState.RUNNING:
            raise RuntimeError(f"actor {self.name!r} is already running")
        self._state = ActorState.RUNNING
        self._cause = None
        self._incarnations += 1
        try:
            task_status.started()
            await self.main(self._mailbox)
        except BaseException as exc:  # bookkeeping only: re-raised unchanged
            self._go_down(exc)
            raise
        else:
            self._go_down(None)

    # -- the callers' side ----------------------------------------------------------------

    async def call(self, payload: Q) -> R:
        """Send ``payload`` and wait for the reply (backpressure: waits while the mailbox is full).

        Raises :class:`ActorDied` / :class:`ActorStopped` as soon as the actor is or goes down,
        or whatever error the actor passed to :meth:`Request.fail`. Wrap in
        ``trio.fail_after``/``move_on_after`` for a deadline.
        """
        self._raise_if_not_accepting()
        reply_to, replies = trio.open_memory_channel[outcome.Outcome[R]](1)
        request = Request(payload, reply_to)
        self._total_calls += 1
        self._waiting.add(request)
        try:
            with replies:
                await self._enqueue(request)
                result = await replies.receive()
        finally:
            self._waiting.discard(request)
            request._abandoned = True
        return result.unwrap()

    async def tell(self, payload: Q) -> None:
        """Queue a message that expects no reply; waits while the mailbox is full.

        Raises :class:`ActorDied` / :class:`ActorStopped` if the actor is or goes down before
        the message is queued. A queued message is dropped if the actor dies before taking it.
        """
        self._raise_if_not_accepting()
        await self._enqueue(Request(payload, None))

    def tell_nowait(self, payload: Q) -> None:
        """Queue a message now or raise :class:`MailboxFull`, :class:`ActorDied`,
        :class:`ActorStopped`."""
        self._raise_if_not_accepting()
        try:
            self._mailbox.send_nowait(Request(payload, None))
        except MailboxClosed:
            raise ActorStopped(self.name) from None

    def close(self) -> None:
        """Stop accepting requests; queued ones are still served (clean shutdown). Idempotent."""
        self._mailbox.close()

    def statistics(self) -> ActorStatistics:
        """A frozen snapshot of state, incarnations, waiting callers and the mailbox."""
        return ActorStatistics(
            name=self.name,
            state=self._state,
            incarnations=self._incarnations,
            calls_waiting=len(self._waiting),
            senders_blocked=len(self._senders),
            total_calls=self._total_calls,
            total_failed_by_death=self._total_failed_by_death,
            mailbox=self._mailbox.statistics(),
        )

    # -- internals ------------------------------------------------------------------------

    def _death_error(self) -> ActorError:
        if self._state is ActorState.DEAD:
            assert self._cause is not None
            return ActorDied(self.name, self._cause)
        return ActorStopped(self.name, self._cause)

    def _raise_if_not_accepting(self) -> None:
        if self._mailbox.closed:
            raise ActorStopped(self.name, self._cause)
        if self._state in (ActorState.DEAD, ActorState.STOPPED):
            raise self._death_error()

    async def _enqueue(self, request: Request[Q, R]) -> None:
        pending = _PendingSend(is_call=request.expects_reply)
        self._senders.add(pending)
        try:
            with pending.scope:
                await self._mailbox.send(request)
        except MailboxClosed:
            raise ActorStopped(self.name, self._cause) from None
        finally:
            self._senders.discard(pending)
        if pending.error is not None:
            raise pending.error

    def _go_down(self, exc: BaseException | None) -> None:
        # Runs synchronously at the end of an incarnation: no checkpoint between the actor
        # going down and every caller being failed.
        if exc is None or _is_cancellation(exc):
            self._state = ActorState.STOPPED
        else:
            self._state = ActorState.DEAD
        self._cause = exc
        for pending in self._senders:
            pending.error = self._death_error()
            pending.scope.cancel()
        failed = sum(not pending.is_call for pending in self._senders)
        for request in self._waiting:
            if request.fail(self._death_error()):
                failed += 1
        self._total_failed_by_death += failed
        # Requests were failed above; queued tells die with the incarnation. Blocked senders
        # were cancelled first, so draining cannot pull in their messages.
        self._mailbox.drain_nowait()


def _is_cancellation(exc: BaseException) -> bool:
    """True for ``trio.Cancelled`` and for groups made only of ``Cancelled``."""
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        _, rest = exc.split(trio.Cancelled)
        return rest is None
    return False
