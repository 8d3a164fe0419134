"""Fault plans: timed actions on the simulated network, nodes, disks and cluster.

A plan is a list of :class:`Action` values sorted by ``at`` (a tick). The same type serves the
three sources of plans -- :func:`~skulk.sim._swarm.random_plan` (seeded, ``run`` mode),
scenario files (``specs/scenarios/*.toml``) and Hypothesis strategies -- and is what a repro
file stores, so a failing run can be replayed exactly. An action may be timed by an event
rather than the clock (``on``/``after``: :mod:`skulk.sim._triggers`).

Each :data:`OPS` entry names the fields its action reads; :func:`validate` refuses an action
with a missing or unknown field or a node that does not exist (:class:`PlanError`).
"""

from __future__ import annotations

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

    ``on`` (one of :data:`EVENTS`) makes any action *triggered*: ``at`` only arms it, and it
    runs ``after`` ticks (>= 1) after the next such event, with ``@leader`` meaning the node
    the event is about (see :mod:`skulk.sim._triggers`).
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
    on: str = ""
    after: int = 0

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
                on=str(raw.get("on", "")),
                after=int(raw.get("after", 0)),
            )
        except (TypeError, ValueError) as exc:
            raise PlanError(f"action {raw!r}: {exc}") from exc


# op -> (fields it requires, fields it may use, description)
OPS: dict[str, tuple[tuple[str, ...], tuple[str, ...], str]] = {
    # network
    "partition": (
        ("groups",),
        (),
        "nodes in different groups cannot talk; unlisted nodes reach everyone (a bridge)",
    ),
    "isolate": (("node",), (), "cut node off from every other node, both ways"),
    "cut": (("node", "peer"), ("msg",), "one-way: messages node -> peer (of type msg) are lost"),
    "flap": (("node", "peer", "n"), (), "the node<->peer link goes down/up every n ticks"),
    "heal": ((), (), "remove every partition, isolation, cut and flapping link"),
    "rejoin": (("node",), (), "end node's isolation (partitions, cuts and other isolations stay)"),
    "drop": (
        (),
        ("node", "peer", "p", "msg"),
        "loss probability p (one directed link if node+peer, one message type if msg)",
    ),
    "dup": ((), ("node", "peer", "p", "msg"), "duplication probability p"),
    "delay": (("hi",), ("node", "peer", "lo", "msg"), "delay drawn from [lo, hi] ticks (lo >= 1)"),
    # nodes
    "crash": (("node",), (), "process dies; un-fsynced writes are lost (disk.crash)"),
    "restart": (("node",), (), "start a crashed node from what its disk holds"),
    "pause": (("node",), (), "freeze a node: no ticks, incoming messages queue"),
    "resume": (("node",), (), "unfreeze; queued messages are delivered"),
    "crash_during_write": (("node", "n"), (), "crash at the n-th next disk write"),
    "crash_on_snapshot": (
        ("node",),
        ("n",),
        "crash at the n-th disk write of the next persist that carries a snapshot",
    ),
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
TRIGGER_FIELDS = ("on", "after")
LEADER = "@leader"
EVENTS = ("elected", "first_commit", "proposed")
"""What a triggered action may wait for: a node became leader (``elected``), a leader
advanced its commit index for the first time in its term (``first_commit``: its term is now
established, and so is every entry before it), a leader appended a client command
(``proposed``)."""
MESSAGE_TYPES = (
    "AppendRequest",
    "AppendReply",
    "VoteRequest",
    "VoteReply",
    "SnapshotChunk",
    "SnapshotReply",
    "TimeoutNow",
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
        if name in ("at", "op", *TRIGGER_FIELDS) or name in required or name in optional:
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
    if action.on and action.on not in EVENTS:
        raise PlanError(f"{action.op} at {action.at}: unknown event {action.on!r}")
    if bool(action.on) != (action.after >= 1) or action.after < 0:
        raise PlanError(f"{action.op} at {action.at}: 'on' and 'after' (>= 1) go together")
    if action.op == "flap" and action.n < 1:
        raise PlanError(f"flap at {action.at}: period n must be >= 1")


def bind_leader(action: Action, node: str) -> Action:
    """``action`` with every ``@leader`` replaced by ``node``."""
    return attrs.evolve(
        action,
        node=node if action.node == LEADER else action.node,
        peer=node if action.peer == LEADER else action.peer,
        groups=tuple(tuple(node if n == LEADER else n for n in g) for g in action.groups),
    )


def names_leader(action: Action) -> bool:
    """Whether ``action`` says ``@leader`` anywhere."""
    return LEADER in (action.node, action.peer) or any(LEADER in g for g in action.groups)


def sort_plan(actions: Iterable[Action]) -> tuple[Action, ...]:
    """Actions in time order; actions at the same tick keep their given order."""
    return tuple(sorted(actions, key=lambda a: a.at))


def plan_to_json(plan: Sequence[Action]) -> list[dict[str, Any]]:
    return [a.to_json() for a in plan]


def plan_from_json(raw: Sequence[dict[str, Any]]) -> tuple[Action, ...]:
    return sort_plan(Action.from_json(a) for a in raw)
