"""Random fault plans by swarm testing: each seed draws its own fault mix, then its faults.

A generator that throws every kind of fault at every run in one fixed mix explores the middle
of the space and starves its corners. Raft's Figure 8 needs a leader cut off right after it
appends, the next leader cut off right after its election (its no-op left on no one else),
the first back and elected again, and cut off the moment it first commits, with the second
still away until then: in the full mix the partitions, crashes and heals meant for other bugs
undo that set-up long before it completes. *Swarm testing* (Groce et al., ISSTA 2012) gives each
seed a :class:`Swarm` -- which kinds of fault it injects, at which weights, how often -- so
that many seeds run few kinds of fault, hard. :func:`draw_swarm` picks one of three profiles:

* ``full`` (a quarter of the seeds): every allowed kind at its base weight, the old mix;
* ``hunt`` (a quarter): leader hunting -- only faults aimed at leaders, plus now and then slow
  vote traffic; many short-lived leaders, each leaving a different uncommitted tail;
* ``subset`` (the rest): each kind with probability 1/2, at 1, 2 or 4 times its weight.

Faults aimed at leaders are *triggered* (:mod:`skulk.sim._triggers`): instead of a tick, they
wait for a moment that matters in a leader's term -- ``elected_*`` (it just became leader),
``first_commit_*`` (it just committed for the first time: its term is established),
``proposed_*`` (it just appended a client command) -- and isolate, crash or pause that
leader 1 to 3 ticks later (before what it just sent arrives; after a first commit, always
1 or 2) or after a few round trips, and undo it after a random outage.

Durations (outages, slow links) are drawn for an election timeout of 20 ticks and scaled to
the seed's (``PlanShape.timeout``), so that a fault lasts as many elections whatever the
timing. Every fault is undone later (rejoin, heal, restart, resume, disk ok...), and everything
at ``shape.until`` (``heal_all``), after which the world checks liveness. A seed's plan is drawn
from the ``rng`` given, in a fixed order: one seed, one plan.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import attrs

from skulk.sim._faults import LEADER, MESSAGE_TYPES, Action, sort_plan

BASE_WEIGHTS: tuple[tuple[str, int], ...] = (
    # network
    ("partition", 4),
    ("isolate", 3),
    ("cut", 2),
    ("flap", 2),
    ("drop", 2),
    ("delay", 2),
    ("dup", 2),
    ("slow_msg", 2),
    ("slow_votes", 1),
    ("lossy_msg", 1),
    # nodes
    ("crash", 4),
    ("pause", 3),
    # aimed at leaders, by trigger
    ("elected_isolate", 3),
    ("first_commit_isolate", 3),
    ("proposed_isolate", 3),
    ("elected_crash", 1),
    ("first_commit_crash", 1),
    ("proposed_crash", 1),
    ("elected_pause", 1),
    ("first_commit_pause", 1),
    ("proposed_pause", 1),
    # disks
    ("disk_full", 1),
    ("fsync_error", 1),
    ("crash_during_write", 2),
    ("crash_on_snapshot", 1),
    ("flip_bit", 1),
    # cluster
    ("transfer", 1),
    ("churn", 1),
)
"""Every kind :func:`random_plan` knows, with its weight in the full mix."""

DISK_KINDS = frozenset({"disk_full", "fsync_error", "crash_during_write", "crash_on_snapshot"})
TRIGGERED = {
    f"{event}_{op}": (event, op, undo)
    for event in ("elected", "first_commit", "proposed")
    for op, undo in (("isolate", "rejoin"), ("crash", "restart"), ("pause", "resume"))
}
"""Triggered kinds: the event, the fault, and the action that undoes it."""
HUNT_CORE = ("elected_isolate", "first_commit_isolate", "proposed_isolate")
"""What every ``hunt`` seed does; each other triggered kind, and ``slow_votes``, joins it
with probability 1/4."""
PROFILES = (("full", 1), ("hunt", 1), ("subset", 2))


@attrs.frozen
class PlanShape:
    """What :func:`random_plan` may do. ``until`` is when everything is healed (``heal_all``);
    nothing else happens after it."""

    until: int
    mean_gap: int = 25
    disk_faults: bool = True
    bit_flips: bool = True
    transfers: bool = True
    membership: bool = True
    """Remove a voter now and then, and add it back later (learner, then promotion)."""
    timeout: int = 20
    """The longest election timeout (ticks): durations are drawn for 20 and scaled to it."""

    def allows(self, kind: str, nodes: int) -> bool:
        """Whether ``kind`` may appear in a plan for ``nodes`` nodes."""
        if kind in DISK_KINDS:
            return self.disk_faults
        if kind == "flip_bit":
            return self.bit_flips
        if kind == "transfer":
            return self.transfers
        if kind == "churn":
            return self.membership and nodes > 1
        return True


@attrs.frozen
class Swarm:
    """One seed's fault mix.

    ``profile``: how it was drawn (see the module docstring); ``weights``: the enabled kinds
    (from :data:`BASE_WEIGHTS`) and their weights; ``mean_gap``: mean ticks between two
    faults; ``leader_share``: the probability that a plain crash, isolation or pause hits the
    leader (the next one to append a command) rather than a node drawn in advance.
    """

    profile: str
    weights: tuple[tuple[str, int], ...]
    mean_gap: int
    leader_share: float


def draw_swarm(rng: random.Random, shape: PlanShape, nodes: int) -> Swarm:
    """A seed's mix (:data:`PROFILES`, with their odds), among the kinds ``shape`` allows."""
    allowed = [(k, w) for k, w in BASE_WEIGHTS if shape.allows(k, nodes)]
    profile = rng.choices([p for p, _ in PROFILES], [w for _, w in PROFILES])[0]
    weights: list[tuple[str, int]] = []
    if profile == "full":
        weights = allowed
    elif profile == "hunt":
        for k, w in allowed:
            if k in HUNT_CORE:
                weights.append((k, w * rng.choice((1, 2, 4))))
            elif (k in TRIGGERED or k == "slow_votes") and rng.random() < 0.25:
                weights.append((k, w))
    else:
        weights = [(k, w * rng.choice((1, 2, 4))) for k, w in allowed if rng.random() < 0.5]
        while len(weights) < 2:
            extra = rng.choice(allowed)
            if extra[0] not in dict(weights):
                weights.append(extra)
    gap = max(2, int(shape.mean_gap * rng.choice((0.4, 0.7, 1.0, 1.0, 1.5))))
    return Swarm(profile, tuple(weights), gap, rng.choice((0.0, 0.0, 0.3, 0.7)))


def random_plan(
    rng: random.Random, node_ids: Sequence[str], shape: PlanShape, swarm: Swarm | None = None
) -> tuple[Action, ...]:
    """A seeded random fault plan over ``[0, shape.until)`` followed by ``heal_all``.

    ``swarm`` None: the seed's :class:`Swarm` is drawn first (from ``rng``), then the faults
    (pass one to get a plan of a given mix). Every temporary
    fault is undone by a later action (left out when it would come at or after ``until``, where
    ``heal_all`` undoes everything; a voter removed too late to be added back before ``until``
    stays out). At most one bit flip per plan, so at most one node is lost for good to a
    refused (corrupt) disk.
    """
    nodes = list(node_ids)
    swarm = swarm or draw_swarm(rng, shape, len(nodes))
    names = [k for k, _ in swarm.weights]
    weights = [w for _, w in swarm.weights]
    out: list[Action] = []
    t = rng.randint(5, max(5, swarm.mean_gap))
    flipped = False

    scale = shape.timeout / 20

    def span(lo: int, hi: int) -> int:
        return rng.randint(lo, max(lo, round(hi * scale)))

    def later(lo: int, hi: int) -> int:
        return t + span(lo, hi)

    def add(at: int, op: str, **kw: Any) -> None:
        if at < shape.until:
            out.append(Action(at=at, op=op, **kw))

    def target() -> str:
        return LEADER if rng.random() < swarm.leader_share else rng.choice(nodes)

    def fault_and_undo(op: str, undo: str, lo: int, hi: int) -> None:
        """``op`` on a target now (or on the leader right after it appends), ``undo`` on the
        same node ``lo``..``hi`` ticks later. Both leader actions are armed together, so the
        undo names the node that was hit, not whoever leads by then (and comes after it)."""
        victim = target()
        if victim == LEADER:
            add(t, op, node=LEADER, on="proposed", after=1)
            add(t, undo, node=LEADER, on="proposed", after=span(max(lo, 2), hi))
        else:
            add(t, op, node=victim)
            add(later(lo, hi), undo, node=victim)

    while t < shape.until:
        kind = rng.choices(names, weights)[0]
        node = rng.choice(nodes)
        peer = rng.choice([n for n in nodes if n != node]) if len(nodes) > 1 else node
        if kind in TRIGGERED:
            on, op, undo = TRIGGERED[kind]
            if on == "first_commit":
                after = rng.randint(1, 2)
            elif rng.random() < 0.6:
                after = rng.randint(1, 3)
            else:
                after = span(4, 30)
            add(t, op, node=LEADER, on=on, after=after)
            add(t, undo, node=LEADER, on=on, after=after + span(1, 150))
        elif kind == "partition":
            shuffled = nodes[:]
            rng.shuffle(shuffled)
            bridge = rng.random() < 0.3 and len(nodes) >= 3
            body = shuffled[1:] if bridge else shuffled
            cut = rng.randint(1, max(1, len(body) - 1))
            add(t, "partition", groups=(tuple(sorted(body[:cut])), tuple(sorted(body[cut:]))))
            add(later(10, 200), "heal")
        elif kind == "isolate":
            fault_and_undo("isolate", "rejoin", 10, 150)
        elif kind == "cut":
            add(t, "cut", node=node, peer=peer)
            add(later(10, 200), "heal")
        elif kind == "flap":
            add(t, "flap", node=node, peer=peer, n=rng.randint(2, 15))
            add(later(20, 200), "heal")
        elif kind == "crash":
            fault_and_undo("crash", "restart", 1, 150)
        elif kind == "pause":
            fault_and_undo("pause", "resume", 1, 120)
        elif kind == "drop":
            add(t, "drop", p=round(rng.uniform(0.05, 0.4), 3))
            add(later(10, 150), "drop", p=0.0)
        elif kind == "delay":
            add(t, "delay", lo=1, hi=rng.randint(3, 12))
            add(later(10, 150), "delay", lo=1, hi=3)
        elif kind == "dup":
            add(t, "dup", p=round(rng.uniform(0.05, 0.3), 3))
            add(later(10, 150), "dup", p=0.0)
        elif kind == "slow_msg":
            # one message type slow (and so reordered against the others), e.g. vote replies
            # that arrive after their election is over
            msg = rng.choice(MESSAGE_TYPES)
            add(t, "delay", msg=msg, lo=rng.randint(1, 5), hi=rng.randint(6, 40))
            add(later(20, 300), "delay", msg=msg, lo=1, hi=3)
        elif kind == "slow_votes":
            # (pre-)vote traffic slower than an election timeout: replies arrive after their
            # election is over, often once their candidate moved to a later term
            msgs = rng.choice((("VoteReply",), ("VoteRequest",), ("VoteRequest", "VoteReply")))
            hi = span(10, 40)
            for msg in msgs:
                add(t, "delay", msg=msg, lo=rng.randint(1, hi // 2), hi=hi)
            back = later(50, 300)
            for msg in msgs:
                add(back, "delay", msg=msg, lo=1, hi=3)
        elif kind == "lossy_msg":
            msg = rng.choice(MESSAGE_TYPES)
            add(t, "drop", msg=msg, p=round(rng.uniform(0.2, 0.8), 3))
            add(later(10, 200), "drop", msg=msg, p=0.0)
        elif kind == "disk_full":
            add(t, "disk_full", node=node)
            add(later(5, 120), "disk_ok", node=node)
        elif kind == "fsync_error":
            add(t, "fsync_error", node=node)
        elif kind == "crash_during_write":
            add(t, "crash_during_write", node=node, n=rng.randint(1, 6))
        elif kind == "crash_on_snapshot":
            add(t, "crash_on_snapshot", node=node, n=rng.randint(1, 4))
        elif kind == "flip_bit" and not flipped:
            flipped = True
            add(t, "flip_bit", node=node, p=round(rng.random(), 4), n=rng.randint(0, 1 << 16))
        elif kind == "transfer":
            add(t, "transfer", node=node)
        elif kind == "churn":
            back = later(30, 250)
            add(t, "remove", node=node)
            add(back, "add_learner", node=node)
            add(back + span(20, 120), "promote", node=node)
        t += rng.randint(1, 2 * swarm.mean_gap)
    out.append(Action(at=shape.until, op="heal_all"))
    return sort_plan(out)
