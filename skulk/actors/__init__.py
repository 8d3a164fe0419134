"""The actor kernel: supervised Trio tasks, bounded mailboxes, request/reply.

Domain-free building blocks every Skulk subsystem is made of:

* :class:`Mailbox` — a bounded FIFO over ``trio.open_memory_channel`` (never unbounded).
* :class:`Actor` / :class:`Request` — request/reply with one-slot reply channels; a crashed or
  stopped actor fails all its callers at once (:class:`ActorDied`, :class:`ActorStopped`).
* :class:`Supervisor` — one-for-one restarts with exponential backoff and jitter from an
  injectable RNG; a crash-loop breaker escalates with :class:`CrashLoopError`.
* :class:`RestartPolicy`, :class:`CrashLoopBreaker` — the sans-IO restart logic the supervisor
  drives, testable without Trio.

Everything has a ``statistics()`` returning a frozen record.
"""

from ._actor import Actor, ActorState, ActorStatistics, Request
from ._errors import (
    ActorDied,
    ActorError,
    ActorStopped,
    CrashLoopError,
    MailboxClosed,
    MailboxFull,
)
from ._mailbox import Mailbox, MailboxStatistics
from ._policy import (
    Cooldown,
    CooldownPolicy,
    CrashLoopBreaker,
    HalfOpenBreaker,
    Restart,
    RestartDecision,
    RestartPolicy,
    Trip,
)
from ._supervisor import (
    ChildState,
    ChildStatistics,
    RestartMode,
    Supervisor,
    SupervisorStatistics,
)

__all__ = [
    "Actor",
    "ActorDied",
    "ActorError",
    "ActorState",
    "ActorStatistics",
    "ActorStopped",
    "ChildState",
    "ChildStatistics",
    "Cooldown",
    "CooldownPolicy",
    "CrashLoopBreaker",
    "CrashLoopError",
    "HalfOpenBreaker",
    "Mailbox",
    "MailboxClosed",
    "MailboxFull",
    "MailboxStatistics",
    "Request",
    "Restart",
    "RestartDecision",
    "RestartMode",
    "RestartPolicy",
    "Supervisor",
    "SupervisorStatistics",
    "Trip",
]
