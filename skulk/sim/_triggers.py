"""Triggered actions: faults timed by what the cluster does rather than by the clock.

The bugs that matter live in narrow windows -- a leader isolated before its first append
leaves it, or crashed after an old-term entry reached a majority but before its own no-op
did (Raft's Figure 8). A fault at a random tick almost never lands in such a window; a fault
*triggered* by the event that opens it lands there every time.

An :class:`~skulk.sim._faults.Action` with ``on`` set is *armed* when its tick ``at`` comes.
The first :data:`~skulk.sim._faults.EVENTS` event of that kind at or after that tick *fires*
it: it runs ``after`` ticks (>= 1) after the event, at the start of that tick (before any
message of that tick is delivered, so a message sent at the event's tick is still in flight),
with ``@leader`` bound to the node the event is about -- the node just elected, the leader that
just appended -- whoever leads by the time it runs. Each armed action fires once.

Armed actions queue per event: each event fires the actions armed earliest for it -- all those
armed at that same tick, which is how a plan pairs a fault with its undo ("1 tick after the
next election, isolate the new leader; 60 ticks after it, rejoin it") -- and the others wait
for the following events, so that faults armed one after the other hit successive leaders.

:meth:`Triggers.clear` (``heal_all``) disarms everything and drops what has not run yet:
nothing happens after ``heal_all``.

Pure bookkeeping: the world reports events (:meth:`Triggers.fire`) and runs what is due
(:meth:`Triggers.due`); order is the arming order, so a seed still decides everything.
"""

from __future__ import annotations

import heapq

import attrs

from skulk.sim._faults import EVENTS, Action, bind_leader


@attrs.frozen
class TriggerStatistics:
    armed: int
    scheduled: int
    fired: int


class Triggers:
    """Armed actions waiting for their event, and fired ones waiting for their tick."""

    def __init__(self) -> None:
        self._led: dict[str, tuple[int, int]] = {}
        """Per node: the last term it was seen leading, and its commit index when elected
        (-1 once ``first_commit`` was reported for that term)."""
        self._armed: list[Action] = []
        self._due: list[tuple[int, int, Action]] = []
        self._seq = 0
        self._fired = 0

    @property
    def waiting(self) -> bool:
        """Whether anything waits for an event (events need reporting only then)."""
        return bool(self._armed)

    def arm(self, action: Action) -> None:
        """Wait for the next ``action.on`` event (:class:`ValueError` if it has none)."""
        if action.on not in EVENTS or action.after < 1:
            raise ValueError(f"not a triggered action: {action!r}")
        self._armed.append(action)

    def observe_leader(self, node: str, term: int, commit: int, now: int) -> str | None:
        """``node`` leads ``term`` with commit index ``commit`` after a step at ``now``: fires
        (and returns) ``elected`` the first time it is seen leading ``term``, ``first_commit``
        the first time its commit index moves after that; None otherwise."""
        led = self._led.get(node)
        event = None
        if led is None or led[0] != term:
            self._led[node] = (term, commit)
            event = "elected"
        elif led[1] >= 0 and commit > led[1]:
            self._led[node] = (term, -1)
            event = "first_commit"
        if event is not None:
            self.fire(event, node, now)
        return event

    def fire(self, event: str, node: str, now: int) -> None:
        """``event`` happened at ``now``, about ``node``: schedule the actions armed for it
        earliest (all those armed at that same tick); later ones wait for the next event."""
        first = min((a.at for a in self._armed if a.on == event), default=None)
        if first is None:
            return
        keep: list[Action] = []
        for a in self._armed:
            if a.on != event or a.at != first:
                keep.append(a)
            else:
                self._schedule(bind_leader(a, node), now)
        self._armed = keep

    def _schedule(self, a: Action, now: int) -> None:
        at = now + a.after
        self._seq += 1
        heapq.heappush(self._due, (at, self._seq, attrs.evolve(a, at=at, on="", after=0)))

    def due(self, now: int) -> list[Action]:
        """The fired actions whose tick has come, in (tick, arming) order; each only once."""
        out: list[Action] = []
        while self._due and self._due[0][0] <= now:
            out.append(heapq.heappop(self._due)[2])
        self._fired += len(out)
        return out

    def clear(self) -> None:
        """Disarm everything and drop what has not run yet."""
        self._armed.clear()
        self._due.clear()

    def statistics(self) -> TriggerStatistics:
        return TriggerStatistics(
            armed=len(self._armed),
            scheduled=len(self._due),
            fired=self._fired,
        )
