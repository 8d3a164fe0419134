"""Typed errors of the actor kernel.

Every failure the kernel reports is an exception class with named fields, so callers branch on
types and attributes, never on message strings.
"""

from __future__ import annotations

import trio

__all__ = [
    "ActorDied",
    "ActorError",
    "ActorStopped",
    "CrashLoopError",
    "MailboxClosed",
    "MailboxFull",
]


class MailboxFull(trio.WouldBlock):
    """``Mailbox.send_nowait`` found the mailbox at capacity; nothing was queued.

    Subclasses :class:`trio.WouldBlock`, which is what the underlying memory channel raises.
    """

    def __init__(self, mailbox: str, capacity: int) -> None:
        super().__init__(f"mailbox {mailbox!r} is full ({capacity} queued)")
        self.mailbox = mailbox
        self.capacity = capacity


class MailboxClosed(trio.ClosedResourceError):
    """A send was attempted on (or was waiting on) a mailbox whose send side is closed.

    Subclasses :class:`trio.ClosedResourceError`, which is what the underlying memory channel
    raises.
    """

    def __init__(self, mailbox: str) -> None:
        super().__init__(f"mailbox {mailbox!r} is closed")
        self.mailbox = mailbox


class ActorError(Exception):
    """Base class of the errors a caller gets instead of a reply."""

    def __init__(self, message: str, actor: str, cause: BaseException | None) -> None:
        super().__init__(message)
        self.actor = actor
        self.cause = cause
        # Chain the cause so tracebacks show why the actor went away.
        self.__cause__ = cause


class ActorDied(ActorError):
    """The actor crashed (its task raised ``cause``) before replying.

    Raised at once to every caller that was waiting for a reply, every caller whose request was
    still queued, every caller blocked on a full mailbox, and every new caller until the actor
    runs again (for example after its supervisor restarts it).
    """

    cause: BaseException

    def __init__(self, actor: str, cause: BaseException) -> None:
        super().__init__(f"actor {actor!r} died: {cause!r}", actor, cause)


class ActorStopped(ActorError):
    """The actor is not accepting requests: it was closed, it returned, or it was cancelled.

    ``cause`` is the ``trio.Cancelled`` that stopped it when it was cancelled, else ``None``.
    """

    def __init__(self, actor: str, cause: BaseException | None = None) -> None:
        super().__init__(f"actor {actor!r} is stopped", actor, cause)


class CrashLoopError(Exception):
    """A supervised child crashed too often: the supervisor gives up and escalates.

    Raised out of :meth:`Supervisor.run` (and so to the supervisor's parent nursery) when a
    child's crash-loop breaker trips: ``crashes`` crashes fell within ``window`` seconds, more
    than the policy's restart budget. ``last_exception`` (also ``__cause__``) is the exception of
    the crash that tripped the breaker, or ``None`` when that "crash" was a ``permanent``
    child returning normally.
    """

    def __init__(
        self,
        child_name: str,
        crashes: int,
        window: float,
        last_exception: BaseException | None,
    ) -> None:
        super().__init__(
            f"child {child_name!r} crashed {crashes} times within {window:g} s; "
            f"last error: {last_exception!r}"
        )
        self.child_name = child_name
        self.crashes = crashes
        self.window = window
        self.last_exception = last_exception
        self.__cause__ = last_exception
