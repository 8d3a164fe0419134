"""Fault schedules as data: a seed, the cluster's shape and a list of timed fault events.

A schedule is drawn from a seed (:func:`generate`): the same seed, node count and length give
the same schedule, byte for byte, so a failing run is replayed from its file
(:func:`Schedule.to_json`, ``python -m skulk.chaos replay FILE``). Faults are sequential by
default: one node at a time is faulted, so a 3-node cluster keeps its Raft quorum (with
``overlap`` they are not, and it may lose it for a while). Every fault has a moment where it
*heals* (the killed node is restarted, the stopped node continued). The first
:data:`WARMUP_S` seconds and the last :data:`HEAL_TAIL_S` seconds are fault-free: load runs
against a healthy cluster before, and the checkers watch it settle after.
"""

from __future__ import annotations

import json
import random
from typing import Literal

import attrs

FaultKind = Literal["kill", "pause", "cut", "oneway", "delay", "bandwidth", "clock", "disk"]
#: Faults of a node process.
KINDS: tuple[FaultKind, ...] = ("kill", "pause")
#: Faults of the link between two nodes (a run with ``links``: every link passes a proxy).
LINK_KINDS: tuple[FaultKind, ...] = ("cut", "oneway", "delay", "bandwidth")
#: A node's wall clock jumps by ``amount`` seconds (a run with ``clock``).
CLOCK_KINDS: tuple[FaultKind, ...] = ("clock",)
#: A node's data dir fills up (a run with ``disks``: each data dir is a small filesystem).
DISK_KINDS: tuple[FaultKind, ...] = ("disk",)
ALL_KINDS = KINDS + LINK_KINDS + CLOCK_KINDS + DISK_KINDS
#: The schedule file format (a file of another version is refused).
VERSION = 1
#: No fault starts in the first this many seconds (the cluster forms, the first instance loads).
WARMUP_S = 20.0
#: No fault is active in the last this many seconds of a run.
HEAL_TAIL_S = 10.0
#: Seconds between one fault healing and the next starting.
GAP_S = (4.0, 12.0)
#: With ``overlap``: a node is faulted again at least this long after its last fault healed.
HEAL_MARGIN_S = 0.5
#: With ``overlap``: seconds between one fault starting and the next.
OVERLAP_GAP_S = (1.0, 6.0)
#: How long a fault lasts: a killed node is restarted, a stopped one continued, after this.
DURATION_S: dict[FaultKind, tuple[float, float]] = {
    "kill": (2.0, 10.0),
    "pause": (1.0, 8.0),
    "cut": (1.0, 10.0),
    "oneway": (1.0, 10.0),
    "delay": (2.0, 10.0),
    "bandwidth": (2.0, 10.0),
    "clock": (5.0, 30.0),
    "disk": (3.0, 15.0),
}
#: A ``delay`` fault holds each chunk this long; a ``bandwidth`` fault passes this many bytes/s.
DELAY_S = (0.05, 0.5)
BANDWIDTH = (2e3, 64e3)
#: A ``clock`` fault jumps this many seconds, forward or back.
CLOCK_JUMP_S = (30, 3600)


class ScheduleError(ValueError):
    """A schedule file that is not a schedule (the message names the field)."""


@attrs.frozen
class FaultEvent:
    """``kind`` on node ``node`` (1-based) at ``at`` seconds into the run, healed
    ``duration`` seconds later: ``kill`` is SIGKILL then a restart on the same data dir,
    ``pause`` is SIGSTOP then SIGCONT. A link fault is between ``node`` and ``peer``
    (``oneway``: ``node`` → ``peer`` falls silent); ``amount`` is a ``delay`` fault's seconds
    or a ``bandwidth`` fault's bytes/s, or a ``clock`` fault's jump in seconds (negative: back;
    healing jumps the clock back to the machine's). ``disk`` fills the node's data dir until
    healed. ``node`` 0 in a process fault means the node that
    leads the cluster when the fault fires."""

    at: float
    kind: FaultKind
    node: int
    duration: float
    peer: int = 0
    amount: float = 0.0

    @property
    def heals_at(self) -> float:
        return self.at + self.duration


@attrs.frozen
class Schedule:
    """One run: ``nodes`` nodes for ``seconds`` seconds, with ``events`` in time order;
    ``links``: every inter-node link passes a fault proxy (needed by link faults); ``clock``:
    every node's wall clock can be moved (needed by clock faults); ``disks``: every node's
    data dir is a small filesystem of its own (needed by disk faults)."""

    seed: int
    nodes: int
    seconds: float
    events: tuple[FaultEvent, ...]
    links: bool = False
    clock: bool = False
    disks: bool = False

    def kinds(self) -> tuple[FaultKind, ...]:
        """The fault kinds this run can inject."""
        return allowed_kinds(links=self.links, clock=self.clock, disks=self.disks)

    def to_json(self) -> str:
        doc = {"version": VERSION, **attrs.asdict(self)}
        return json.dumps(doc, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Schedule:
        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise ScheduleError(f"not JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise ScheduleError("$: not an object")
        if doc.get("version") != VERSION:
            raise ScheduleError(f"$.version: {doc.get('version')!r}, expected {VERSION}")
        seed, nodes, seconds = doc.get("seed"), doc.get("nodes"), doc.get("seconds")
        if not isinstance(seed, int):
            raise ScheduleError("$.seed: not an integer")
        if not isinstance(nodes, int) or not 1 <= nodes <= 16:
            raise ScheduleError("$.nodes: not an integer in 1..16")
        if not isinstance(seconds, int | float) or seconds <= 0:
            raise ScheduleError("$.seconds: not a positive number")
        flags = {name: doc.get(name, False) for name in ("links", "clock", "disks")}
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise ScheduleError(f"$.{name}: not a boolean")
        kinds = allowed_kinds(**flags)
        raw = doc.get("events")
        if not isinstance(raw, list):
            raise ScheduleError("$.events: not a list")
        events = []
        for i, e in enumerate(raw):
            path = f"$.events[{i}]"
            if not isinstance(e, dict):
                raise ScheduleError(f"{path}: not an object")
            kind, node, at, duration = e.get("kind"), e.get("node"), e.get("at"), e.get("duration")
            peer, amount = e.get("peer", 0), e.get("amount", 0.0)
            if kind not in kinds:
                raise ScheduleError(f"{path}.kind: {kind!r}, expected one of {', '.join(kinds)}")
            lowest = 0 if kind in KINDS else 1  # 0: the leader, for a process fault
            if not isinstance(node, int) or not lowest <= node <= nodes:
                raise ScheduleError(f"{path}.node: not a node number in {lowest}..{nodes}")
            if kind in LINK_KINDS and (
                not isinstance(peer, int) or not 1 <= peer <= nodes or peer == node
            ):
                raise ScheduleError(f"{path}.peer: not another node number in 1..{nodes}")
            for name, value in (("at", at), ("duration", duration), ("amount", amount)):
                signed = name == "amount" and kind in CLOCK_KINDS  # a jump back is negative
                if not isinstance(value, int | float) or isinstance(value, bool):
                    raise ScheduleError(f"{path}.{name}: not a number")
                if value < 0 and not signed:
                    raise ScheduleError(f"{path}.{name}: not a non-negative number")
            assert isinstance(at, int | float) and isinstance(duration, int | float)
            assert isinstance(peer, int) and isinstance(amount, int | float)
            events.append(FaultEvent(float(at), kind, node, float(duration), peer, float(amount)))
        events.sort(key=lambda e: e.at)
        return cls(seed, nodes, float(seconds), tuple(events), **flags)


def allowed_kinds(
    *, links: bool, clock: bool = False, disks: bool = False
) -> tuple[FaultKind, ...]:
    """The fault kinds a run with these flags can inject: process faults always."""
    return (
        KINDS
        + (LINK_KINDS if links else ())
        + (CLOCK_KINDS if clock else ())
        + (DISK_KINDS if disks else ())
    )


def generate(
    seed: int,
    nodes: int,
    seconds: float,
    *,
    links: bool = False,
    clock: bool = False,
    disks: bool = False,
    kinds: tuple[FaultKind, ...] | None = None,
    overlap: bool = False,
    leader: bool = False,
) -> Schedule:
    """The schedule of ``seed``: faults one after another from :data:`WARMUP_S` on, each on a
    node (and a peer, for a link fault) and of a kind drawn from ``random.Random(seed)``, none
    active in the last :data:`HEAL_TAIL_S` seconds; ``kinds`` defaults to the process faults,
    and the link, clock and disk faults too with ``links``, ``clock`` and ``disks``.

    With ``overlap`` a fault starts every :data:`OVERLAP_GAP_S` seconds whether or not the
    last one healed, on a node no active fault holds, while at least one node is left
    unfaulted (so two of three nodes may be down at once: no quorum). With ``leader`` half the
    process faults hit whichever node leads when they fire (``node`` 0; not with ``overlap``).
    Pure: same arguments, same schedule."""
    allowed = allowed_kinds(links=links, clock=clock, disks=disks)
    if kinds is None:
        kinds = allowed
    for kind in set(kinds) - set(allowed):
        flag = "links" if kind in LINK_KINDS else "clock" if kind in CLOCK_KINDS else "disks"
        raise ValueError(f"{kind} faults need {flag}=True")
    if leader and overlap:
        raise ValueError("leader faults are sequential: not with overlap=True")
    rng = random.Random(seed)
    events: list[FaultEvent] = []
    t = WARMUP_S
    end = seconds - HEAL_TAIL_S
    while kinds:
        kind = rng.choice(kinds)
        lo, hi = DURATION_S[kind]
        duration = round(rng.uniform(lo, hi), 2)
        if t + duration > end:
            break
        peer, amount = 0, 0.0
        if kind in LINK_KINDS and nodes < 2:
            break
        if overlap:
            active = [e for e in events if e.at <= t < e.heals_at]
            free = [
                n for n in range(1, nodes + 1) if all(n not in (e.node, e.peer) for e in active)
            ]
            # A fault holds one node (a link fault two); one node at least stays unfaulted.
            if len(free) < (3 if kind in LINK_KINDS else 2):
                if not active:
                    break
                t = min(e.heals_at for e in active) + HEAL_MARGIN_S
                continue
            node = rng.choice(free)
            others = [n for n in free if n != node]
        else:
            node = rng.randint(1, nodes)
            others = [n for n in range(1, nodes + 1) if n != node]
        if leader and kind in KINDS and rng.random() < 0.5:
            node = 0
        if kind in LINK_KINDS:
            peer = rng.choice(others)
            if kind == "delay":
                amount = round(rng.uniform(*DELAY_S), 3)
            elif kind == "bandwidth":
                amount = round(rng.uniform(*BANDWIDTH))
        elif kind == "clock":
            amount = float(rng.choice((-1, 1)) * rng.randint(*CLOCK_JUMP_S))
        events.append(FaultEvent(round(t, 2), kind, node, duration, peer, amount))
        t += rng.uniform(*OVERLAP_GAP_S) if overlap else duration + rng.uniform(*GAP_S)
    return Schedule(seed, nodes, float(seconds), tuple(events), links, clock, disks)
