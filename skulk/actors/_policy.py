"""Sans-IO restart policy: exponential backoff with jitter and a crash-loop circuit breaker.

Nothing here knows about Trio or the clock: the driver passes timestamps in (seconds on any
monotonic clock; the supervisor uses ``trio.current_time()``) and an injected
:class:`random.Random` supplies the jitter, so every decision is reproducible from a seed.
"""

from __future__ import annotations

import math
import random
from collections import deque

import attrs

__all__ = [
    "CooldownPolicy",
    "CrashLoopBreaker",
    "HalfOpenBreaker",
    "Restart",
    "RestartDecision",
    "RestartPolicy",
    "Trip",
]


def _non_negative(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{attr.name} must be a finite number >= 0, got {value!r}")


def _positive(_inst: object, attr: attrs.Attribute[float], value: float) -> None:
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{attr.name} must be a finite number > 0, got {value!r}")


@attrs.frozen
class RestartPolicy:
    """How a supervisor restarts one child: backoff shape and crash-loop budget.

    Backoff: the *k*-th consecutive crash of a streak (``k = 0, 1, 2, …``) waits
    ``min(max_backoff, initial_backoff * multiplier**k)`` seconds (:meth:`base_backoff`), scaled
    down by jitter to a value in ``[base * (1 - jitter), base]`` (:meth:`backoff`). Jitter only
    shortens, so ``max_backoff`` is a true upper bound and un-jittered delays never decrease
    within a streak. A streak ends when a child has run for at least :attr:`stable_after`
    seconds before crashing: its next crash starts over at ``initial_backoff``.

    Breaker: at most ``max_restarts`` restarts within any ``window`` seconds (Erlang's
    restart intensity). The crash that would be restart number ``max_restarts + 1`` within the
    window — i.e. the moment ``max_restarts + 1`` crashes fall in the half-open interval
    ``(now - window, now]`` — trips the breaker instead; the supervisor then escalates with
    :class:`~skulk.actors.CrashLoopError`. ``max_restarts=0`` means "never restart".
    """

    initial_backoff: float = attrs.field(default=0.1, validator=_non_negative)
    max_backoff: float = attrs.field(default=30.0, validator=_non_negative)
    multiplier: float = attrs.field(default=2.0)
    jitter: float = attrs.field(default=0.1)
    max_restarts: int = attrs.field(default=5)
    window: float = attrs.field(default=60.0, validator=_positive)
    reset_after: float | None = attrs.field(default=None)

    @multiplier.validator
    def _check_multiplier(self, _attr: attrs.Attribute[float], value: float) -> None:
        if not (value >= 1 and math.isfinite(value)):
            raise ValueError(f"multiplier must be a finite number >= 1, got {value!r}")

    @jitter.validator
    def _check_jitter(self, _attr: attrs.Attribute[float], value: float) -> None:
        if not 0 <= value <= 1:
            raise ValueError(f"jitter is a fraction in [0, 1], got {value!r}")

    @max_restarts.validator
    def _check_max_restarts(self, _attr: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"max_restarts must be an int >= 0, got {value!r}")

    @reset_after.validator
    def _check_reset_after(self, _attr: attrs.Attribute[float | None], value: float | None) -> None:
        if value is not None and not (value > 0 and math.isfinite(value)):
            raise ValueError(f"reset_after must be None or a finite number > 0, got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.max_backoff < self.initial_backoff:
            raise ValueError(
                f"max_backoff ({self.max_backoff!r}) < initial_backoff ({self.initial_backoff!r})"
            )

    @property
    def stable_after(self) -> float:
        """Uptime (seconds) after which a crash starts a new backoff streak.

        ``reset_after`` when set, else ``window``.
        """
        return self.window if self.reset_after is None else self.reset_after

    def base_backoff(self, streak_index: int) -> float:
        """The un-jittered delay before restart number ``streak_index`` (0-based) of a streak."""
        if streak_index < 0:
            raise ValueError(f"streak_index must be >= 0, got {streak_index}")
        try:
            delay = self.initial_backoff * self.multiplier**streak_index
        except OverflowError:
            delay = math.inf
        return min(self.max_backoff, delay)

    def backoff(self, streak_index: int, rng: random.Random) -> float:
        """The jittered delay: uniform in ``[base * (1 - jitter), base]``.

        Draws exactly one number from ``rng`` when ``jitter > 0`` and none otherwise.
        """
        base = self.base_backoff(streak_index)
        if self.jitter == 0:
            return base
        return base * (1.0 - self.jitter * rng.random())


@attrs.frozen
class Restart:
    """Decision: restart the child after ``delay`` seconds.

    ``attempt`` counts the crashes of the current streak, this one included (1 for the first).
    """

    delay: float
    attempt: int


@attrs.frozen
class Trip:
    """Decision: do not restart; ``crashes`` crashes fell within ``window`` seconds."""

    crashes: int
    window: float


RestartDecision = Restart | Trip


class CrashLoopBreaker:
    """Per-child restart bookkeeping: feed it crashes, it answers :class:`Restart` or :class:`Trip`.

    Pure state machine: no I/O, no clock, randomness only from the injected ``rng``. Once it
    has tripped it stays tripped and answers the same :class:`Trip` to every later crash.
    """

    def __init__(self, policy: RestartPolicy, rng: random.Random) -> None:
        self.policy = policy
        self._rng = rng
        self._crash_times: deque[float] = deque()
        self._streak = 0
        self._last_now = -math.inf
        self._trip: Trip | None = None

    @property
    def tripped(self) -> bool:
        """Whether the breaker has tripped (until :meth:`reset`)."""
        return self._trip is not None

    def reset(self) -> None:
        """Close the breaker: forget the trip, the crash history and the backoff streak."""
        self._crash_times.clear()
        self._streak = 0
        self._trip = None

    @property
    def streak(self) -> int:
        """Crashes in the current backoff streak."""
        return self._streak

    @property
    def crash_times(self) -> tuple[float, ...]:
        """Timestamps of the crashes inside the window as of the latest crash, oldest first."""
        return tuple(self._crash_times)

    def record_crash(self, now: float, uptime: float) -> RestartDecision:
        """Record a crash at time ``now`` of an incarnation that had run ``uptime`` seconds.

        ``now`` must not go backwards between calls. A normal return of a ``permanent`` child
        counts as a crash too (otherwise a child that returns at once would spin hot).
        """
        if now < self._last_now:
            raise ValueError(f"time went backwards: {now!r} < {self._last_now!r}")
        if uptime < 0:
            raise ValueError(f"uptime must be >= 0, got {uptime!r}")
        self._last_now = now
        if self._trip is not None:
            return self._trip
        horizon = now - self.policy.window
        while self._crash_times and self._crash_times[0] <= horizon:
            self._crash_times.popleft()
        self._crash_times.append(now)
        if len(self._crash_times) > self.policy.max_restarts:
            self._trip = Trip(crashes=len(self._crash_times), window=self.policy.window)
            return self._trip
        if uptime >= self.policy.stable_after:
            self._streak = 0
        delay = self.policy.backoff(self._streak, self._rng)
        self._streak += 1
        return Restart(delay=delay, attempt=self._streak)


@attrs.frozen
class CooldownPolicy:
    """How long a tripped breaker stays open before one more attempt is allowed.

    The *n*-th trip in a row (``n = 1, 2, …``) waits ``min(maximum, initial * multiplier**(n-1))``
    seconds. Trips stop being "in a row" once a child runs for the restart policy's
    :attr:`~RestartPolicy.stable_after` seconds.
    """

    initial: float = attrs.field(default=30.0, validator=_positive)
    maximum: float = attrs.field(default=600.0, validator=_positive)
    multiplier: float = attrs.field(default=2.0)

    @multiplier.validator
    def _check_multiplier(self, _attr: attrs.Attribute[float], value: float) -> None:
        if not (value >= 1 and math.isfinite(value)):
            raise ValueError(f"multiplier must be a finite number >= 1, got {value!r}")

    def __attrs_post_init__(self) -> None:
        if self.maximum < self.initial:
            raise ValueError(f"maximum ({self.maximum!r}) < initial ({self.initial!r})")

    def delay(self, trips: int) -> float:
        """The cool-down after trip number ``trips`` (1-based) of a row."""
        if trips < 1:
            raise ValueError(f"trips must be >= 1, got {trips}")
        try:
            delay = self.initial * self.multiplier ** (trips - 1)
        except OverflowError:
            delay = math.inf
        return min(self.maximum, delay)


@attrs.frozen
class Cooldown:
    """Decision: the breaker is open; try once more after ``delay`` seconds (half-open)."""

    delay: float
    trips: int
    crashes: int
    window: float


class HalfOpenBreaker:
    """A crash-loop breaker that recovers: closed → open (cool-down) → half-open → closed.

    *Closed*: crashes are answered as :class:`CrashLoopBreaker` answers them (:class:`Restart`
    with backoff) until too many fall in the window; that crash opens the breaker and is
    answered with :class:`Cooldown`. After the cool-down the driver calls :meth:`half_open` and
    makes exactly one attempt: :meth:`succeeded` (the child came up) closes the breaker with a
    fresh crash history; a crash while half-open opens it again at once, with a longer
    cool-down (:class:`CooldownPolicy`). Pure, like :class:`CrashLoopBreaker`.
    """

    def __init__(self, policy: RestartPolicy, cooldown: CooldownPolicy, rng: random.Random) -> None:
        self.policy = policy
        self.cooldown = cooldown
        self._breaker = CrashLoopBreaker(policy, rng)
        self._state = "closed"
        self._trips = 0

    @property
    def state(self) -> str:
        """``closed``, ``open`` (cooling down) or ``half_open`` (one attempt running)."""
        return self._state

    @property
    def trips(self) -> int:
        """Times the breaker opened in a row (reset once a child runs stably)."""
        return self._trips

    def record_crash(self, now: float, uptime: float) -> Restart | Cooldown:
        """Record a crash at ``now`` of a child that ran ``uptime`` seconds."""
        if uptime >= self.policy.stable_after:
            self._trips = 0
        if self._state == "closed":
            decision = self._breaker.record_crash(now, uptime)
            if isinstance(decision, Restart):
                return decision
            crashes = decision.crashes
        else:  # the one half-open attempt failed (or a crash arrived while open)
            crashes = 1
        self._state = "open"
        self._trips += 1
        return Cooldown(self.cooldown.delay(self._trips), self._trips, crashes, self.policy.window)

    def half_open(self) -> None:
        """The cool-down is over (or an operator asked): allow exactly one attempt."""
        self._breaker.reset()
        self._state = "half_open"

    def succeeded(self) -> None:
        """The attempt came up: close the breaker (a no-op when it is closed already)."""
        self._state = "closed"
