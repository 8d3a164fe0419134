"""Fault hooks for tests and hang repro scripts: make a runner crash, hang or slow down.

Enabled only by the node's ``--runner-faults`` option (``SKULK_RUNNER_FAULTS``), which the node
passes to its runners in their environment; never by anything a request carries. A spec is a
``;``-separated list of items::

    ACTION@PHASE[:ARG][#INCARNATION]      e.g.  hang@decode:3#1   crash@load   slow@decode:0.2
    ignore-sigterm

* actions: ``crash`` (exit at once with code 13), ``hang`` (block the runner's main thread
  forever: no frames, no heartbeats), ``slow`` (sleep ARG seconds at every hit of its phase:
  ``decode``, ``prefill`` and ``exit`` only);
* phases: ``hello`` (before sending Hello), ``connect`` (a rank of a sharded instance, before it
  announces ``GroupJoining``: ``hang@connect`` is a rank that never joins its group), ``load``
  (during the model load), ``warm`` (before the warm-up generation), ``prefill`` (between two
  prefill chunks of a prompt, on every rank of a sharded instance; ARG = after that many
  chunks of the request, default 0; for ``slow``, the seconds), ``decode`` (inside a decode
  step; ARG = after that many tokens of a request, default 0), ``cancel`` (while handling a
  Cancel; rank 0 only), ``exit`` (a rank of a sharded instance, after its last frame, before
  its process exits);
* ``#N`` limits the item to the runner's Nth incarnation (the node's first runner is 1, its
  relaunches 2, 3, …); without it the item applies to every incarnation;
* ``ignore-sigterm`` makes the runner ignore SIGTERM, so only the SIGKILL that follows the
  shutdown grace stops it.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Literal

import attrs

ENV = "SKULK_RUNNER_FAULTS"
CRASH_EXIT_CODE = 13

Action = Literal["crash", "hang", "slow"]
Phase = Literal["hello", "connect", "load", "warm", "prefill", "decode", "cancel", "exit"]
_ACTIONS: tuple[Action, ...] = ("crash", "hang", "slow")
_PHASES: tuple[Phase, ...] = (
    "hello", "connect", "load", "warm", "prefill", "decode", "cancel", "exit"
)  # fmt: skip
#: Phases ``slow`` applies to.
_SLOWED: tuple[Phase, ...] = ("prefill", "decode", "exit")
#: Phases whose hits are counted (tokens of a request in ``decode``, chunks in ``prefill``).
_COUNTED: tuple[Phase, ...] = ("prefill", "decode")


class FaultSpecError(ValueError):
    """A fault spec that does not parse; the message names the offending item."""


@attrs.frozen
class Fault:
    action: Action
    phase: Phase
    arg: float = 0.0
    incarnation: int | None = None


@attrs.frozen
class Faults:
    """The faults that apply to one runner incarnation."""

    items: tuple[Fault, ...] = ()
    ignore_sigterm: bool = False

    @classmethod
    def parse(cls, spec: str, incarnation: int) -> Faults:
        """Parse ``spec`` and keep the items for ``incarnation``; raises :class:`FaultSpecError`."""
        items: list[Fault] = []
        ignore = False
        for raw in (part.strip() for part in spec.split(";")):
            if not raw:
                continue
            if raw == "ignore-sigterm":
                ignore = True
                continue
            fault = _parse_item(raw)
            if fault.incarnation in (None, incarnation):
                items.append(fault)
        return cls(tuple(items), ignore)

    @classmethod
    def from_env(cls, incarnation: int) -> Faults:
        return cls.parse(os.environ.get(ENV, ""), incarnation)

    def arm(self) -> None:
        """Apply process-wide faults (``ignore-sigterm``)."""
        if self.ignore_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def hit(self, phase: Phase, count: int = 0) -> None:
        """Call at ``phase`` (``count``: tokens of the request so far in ``decode``, prefill
        chunks of the request done in ``prefill``)."""
        for fault in self.items:
            if fault.phase != phase:
                continue
            if fault.action == "slow":
                threading.Event().wait(fault.arg)
            elif phase not in _COUNTED or count >= fault.arg:
                if fault.action == "crash":
                    os._exit(CRASH_EXIT_CODE)
                threading.Event().wait()  # hang: block this thread forever


def _parse_item(raw: str) -> Fault:
    head, _, incarnation = raw.partition("#")
    head, _, arg = head.partition(":")
    action, at, phase = head.partition("@")
    if action not in _ACTIONS or not at or phase not in _PHASES:
        raise FaultSpecError(
            f"bad fault {raw!r}: expected ACTION@PHASE[:ARG][#N] with ACTION one of "
            f"{', '.join(_ACTIONS)} and PHASE one of {', '.join(_PHASES)}, or ignore-sigterm"
        )
    try:
        value = float(arg) if arg else 0.0
        number = int(incarnation) if incarnation else None
    except ValueError:
        raise FaultSpecError(f"bad fault {raw!r}: ARG must be a number, N an integer") from None
    if value < 0 or (number is not None and number < 1):
        raise FaultSpecError(f"bad fault {raw!r}: ARG must be >= 0 and N >= 1")
    if action == "slow" and phase not in _SLOWED:
        raise FaultSpecError(
            f"bad fault {raw!r}: slow applies to the decode, prefill and exit phases"
        )
    return Fault(action, phase, value, number)
