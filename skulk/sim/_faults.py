"""Fault plans: timed actions on the simulated network, nodes, disks and cluster.

A plan is a list of :class:`Action` values sorted by ``at`` (a tick). The same type serves the
three sources of plans -- :func:`random_plan` (seeded, ``run`` mode), scenario files
(``specs/scenarios/*.toml``) and Hypothesis strategies -- and is what a repro file stores, so
a failing run can be replayed exactly.

Each :data:`OPS` entry names the fields its action reads; :func:`validate` refuses an action
with a missing or unknown field or a node that does not exist (:class:`PlanError`).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from typing import Any

import attrs


class PlanError(ValueError):
    """An action that cannot be run (unknown op, missing field, unknown node...)."""


@attrs.frozen
class Action:
    """One timed action. Which fields matter depends on ``op`` (see :data:`OPS`):

    ``node``/``peer`` name nodes (``"@leader"``: whichever node leads when the action runs; the
    action is skipped if none does); ``groups`` are partition sides; ``p`` is a probability;
    ``lo``/``hi`` a delay range in ticks; ``n`` a count or period; ``msg`` restricts a network
    action to one message type (a payload class name such as ``"AppendRequest"``).
    """

    at: int
    op: str
    node: str = ""
    peer: str = ""
    groups: tuple[tuple[str, ...], ...] = ()
    p: float = 0.0
    lo: int = 0
    hi: int = 0
    n: int = 0
    msg: str = ""

    def to_json(self) -> dict[str, Any]:
        """A JSON object with the fields that differ from their defaults."""
        out: dict[str, Any] = {"at": self.at, "op": self.op}
        for field in attrs.fields(Action):
            if field.name in ("at", "op"):
                continue
            value = getattr(self, field.name)
            if value != field.default:
                out[field.name] = [list(g) for g in value] if field.name == "groups" else value
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Action:
        """Inverse of :meth:`to_json` (also reads scenario TOML tables); raises PlanError."""
        known = {f.name for f in attrs.fields(Action)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise PlanError(f"action {raw!r}: unknown field(s) {', '.join(unknown)}")
        if "at" not in raw or "op" not in raw:
            raise PlanError(f"action {raw!r}: needs 'at' and 'op'")
        try:
            return cls(
                at=int(raw["at"]),
                op=str(raw["op"]),
                node=str(raw.get("node", "")),
                peer=str(raw.get("peer", "")),
                groups=tuple(tuple(str(n) for n in g) for g in raw.get("groups", ())),
                p=float(raw.get("p", 0.0)),
                lo=int(raw.get("lo", 0)),
                hi=int(raw.get("hi", 0)),
                n=int(raw.get("n", 0)),
                msg=str(raw.get("msg", "")),
            )
        except (TypeError, ValueError) as exc:
            raise PlanError(f"action {raw!r}: {exc}") from exc


# op -> (fields it requires, fields it may use, description)
OPS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    # network
    "partition": (("groups",), (), "nodes in different groups cannot talk; unlisted nodes "
                  "reach everyone (a bridge)"),
    "isolate": (("node",), (), "cut node off from every other node, both ways"),
    "cut": (("node", "peer"), ("msg",), "one-way: messages node -> peer (of type msg) are lost"),
    "flap": (("node", "peer", "n"), (), "the node<->peer link goes down/up every n ticks"),
    "heal": ((), (), "remove every partition, cut and flapping link"),
    "drop": ((), ("node", "peer", "p", "msg"), "loss probability p (one directed link if "
             "node+peer, one message type if msg)"),
    "dup": ((), ("node", "peer", "p", "msg"), "duplication probability p"),
    "delay": (("hi",), ("node", "peer", "lo", "msg"), "delay drawn from [lo, hi] ticks "
              "(lo >= 1)"),
    # nodes
    "crash": (("node",), (), "process dies; un-fsynced writes are lost (disk.crash)"),
    "restart": (("node",), (), "start a crashed node from what its disk holds"),
    "pause": (("node",), (), "freeze a node: no ticks, incoming messages queue"),
    "resume": (("node",), (), "unfreeze; queued messages are delivered"),
    "crash_during_write": (("node", "n"), (), "crash at the n-th next disk write"),
    "crash_on_snapshot": (("node",), ("n",), "crash at the n-th disk write of the next "
                          "persist that carries a snapshot"),
    # disks
    "disk_full": (("node",), (), "writes fail with ENOSPC"),
    "disk_ok": (("node",), (), "the disk has space again"),
    "fsync_error": (("node",), (), "the next fsync fails (the node crashes)"),
    "flip_bit": (("node",), ("p", "n"), "flip one durable bit, then crash and restart the node"),
    # cluster
    "propose": ((), ("node", "n"), "the scenario client submits n (default 1) commands"),
    "transfer": (("node",), (), "ask the leader to hand leadership to node"),
    "add_learner": (("node",), (), "ask the leader to add node as a learner"),
    "promote": (("node",), (), "ask the leader to promote learner node to voter"),
    "remove": (("node",), (), "ask the leader to remove node"),
    "compact": (("node",), (), "node snapshots its state machine now"),
    "heal_all": ((), (), "heal network, reset loss/delay/dup, restart, resume, disks ok"),
}

NODE_FIELDS = ("node", "peer")
LEADER = "@leader"
MESSAGE_TYPES = (
    "AppendRequest", "AppendReply", "VoteRequest", "VoteReply", "SnapshotChunk",
    "SnapshotReply", "TimeoutNow",
)


def validate(action: Action, node_ids: Sequence[str]) -> None:
    """Raise :class:`PlanError` unless ``action`` can run in a cluster of ``node_ids``."""
    spec = OPS.get(action.op)
    if spec is None:
        raise PlanError(f"unknown op {action.op!r} (known: {', '.join(sorted(OPS))})")
    required, optional, _ = spec
    if action.at < 0:
        raise PlanError(f"{action.op} at {action.at}: negative time")
    defaults = {f.name: f.default for f in attrs.fields(Action)}
    for name in required:
        if getattr(action, name) == defaults[name]:
            raise PlanError(f"{action.op} at {action.at}: needs {name}")
    for name in defaults:
        if name in ("at", "op") or name in required or name in optional:
            continue
        if getattr(action, name) != defaults[name]:
            raise PlanError(f"{action.op} at {action.at}: does not take {name}")
    known = {*node_ids, LEADER}
    if action.msg and action.msg not in MESSAGE_TYPES:
        raise PlanError(f"{action.op} at {action.at}: unknown message type {action.msg!r}")
    for name in NODE_FIELDS:
        value = getattr(action, name)
        if value and value not in known:
            raise PlanError(f"{action.op} at {action.at}: unknown node {value!r}")
    for group in action.groups:
        for node in group:
            if node not in known:
                raise PlanError(f"{action.op} at {action.at}: unknown node {node!r}")
    if not 0.0 <= action.p <= 1.0:
        raise PlanError(f"{action.op} at {action.at}: p must be within [0, 1]")
    if action.op == "delay" and not 1 <= max(action.lo, 1) <= action.hi:
        raise PlanError(f"delay at {action.at}: need 1 <= lo <= hi")
    if action.op == "flap" and action.n < 1:
        raise PlanError(f"flap at {action.at}: period n must be >= 1")


def sort_plan(actions: Iterable[Action]) -> tuple[Action, ...]:
    """Actions in time order; actions at the same tick keep their given order."""
    return tuple(sorted(actions, key=lambda a: a.at))


def plan_to_json(plan: Sequence[Action]) -> list[dict[str, Any]]:
    return [a.to_json() for a in plan]


def plan_from_json(raw: Sequence[dict[str, Any]]) -> tuple[Action, ...]:
    return sort_plan(Action.from_json(a) for a in raw)


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


def random_plan(rng: random.Random, node_ids: Sequence[str], shape: PlanShape) -> tuple[
    Action, ...
]:
    """A seeded random fault plan over ``[0, shape.until)`` followed by ``heal_all``.

    Every temporary fault is undone by a later action (which may come after ``until``'s
    ``heal_all`` is already in effect -- the undo is then a no-op and is left out; a voter
    removed too late to be added back before ``until`` stays out). At most one bit flip per
    plan, so at most one node is lost for good to a refused (corrupt) disk.
    """
    nodes = list(node_ids)
    out: list[Action] = []
    t = rng.randint(5, shape.mean_gap)
    flipped = False
    kinds = [
        ("partition", 4), ("isolate", 3), ("cut", 2), ("flap", 2), ("crash", 4), ("pause", 3),
        ("drop", 2), ("delay", 2), ("dup", 2),
        ("disk_full", 1 if shape.disk_faults else 0),
        ("fsync_error", 1 if shape.disk_faults else 0),
        ("crash_during_write", 2 if shape.disk_faults else 0),
        ("crash_on_snapshot", 1 if shape.disk_faults else 0),
        ("flip_bit", 1 if shape.bit_flips else 0),
        ("transfer", 1 if shape.transfers else 0),
        ("churn", 1 if shape.membership and len(nodes) > 1 else 0),
    ]
    names = [k for k, w in kinds if w]
    weights = [w for _, w in kinds if w]

    def later(lo: int, hi: int) -> int:
        return t + rng.randint(lo, hi)

    def add(at: int, op: str, **kw: Any) -> None:
        if at < shape.until:
            out.append(Action(at=at, op=op, **kw))

    while t < shape.until:
        kind = rng.choices(names, weights)[0]
        node = rng.choice(nodes)
        peer = rng.choice([n for n in nodes if n != node]) if len(nodes) > 1 else node
        if kind == "partition":
            shuffled = nodes[:]
            rng.shuffle(shuffled)
            bridge = rng.random() < 0.3 and len(nodes) >= 3
            body = shuffled[1:] if bridge else shuffled
            cut = rng.randint(1, max(1, len(body) - 1))
            add(t, "partition", groups=(tuple(sorted(body[:cut])), tuple(sorted(body[cut:]))))
            add(later(10, 200), "heal")
        elif kind == "isolate":
            add(t, "isolate", node=node)
            add(later(10, 150), "heal")
        elif kind == "cut":
            add(t, "cut", node=node, peer=peer)
            add(later(10, 200), "heal")
        elif kind == "flap":
            add(t, "flap", node=node, peer=peer, n=rng.randint(2, 15))
            add(later(20, 200), "heal")
        elif kind == "crash":
            add(t, "crash", node=node)
            add(later(1, 150), "restart", node=node)
        elif kind == "pause":
            add(t, "pause", node=node)
            add(later(1, 120), "resume", node=node)
        elif kind == "drop":
            add(t, "drop", p=round(rng.uniform(0.05, 0.4), 3))
            add(later(10, 150), "drop", p=0.0)
        elif kind == "delay":
            add(t, "delay", lo=1, hi=rng.randint(3, 12))
            add(later(10, 150), "delay", lo=1, hi=3)
        elif kind == "dup":
            add(t, "dup", p=round(rng.uniform(0.05, 0.3), 3))
            add(later(10, 150), "dup", p=0.0)
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
            add(back + rng.randint(20, 120), "promote", node=node)
        t += rng.randint(1, 2 * shape.mean_gap)
    out.append(Action(at=shape.until, op="heal_all"))
    return sort_plan(out)
