"""The checks a scenario file may assert (``[[expect.checks]]``): what each measures on the
world and how it judges the value measured (at ``at``, against the one at ``since``).
:data:`CHECKS` is the table; ``python -m skulk.sim scenario`` and :mod:`._scenario` use it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from skulk.consensus import Role
from skulk.sim._world import World

Value = int | str | list[str] | None


class ScenarioError(ValueError):
    """A scenario file that cannot be run (bad TOML, unknown key, op, check or node)."""


@attrs.frozen
class Check:
    check: str
    at: int | None = None
    since: int | None = None
    node: str = ""
    value: Value = None

    def label(self) -> str:
        parts = [self.check]
        if self.node:
            parts.append(self.node)
        if self.value is not None:
            parts.append(repr(self.value))
        if self.since is not None:
            parts.append(f"since {self.since}")
        parts.append(f"at {self.at}" if self.at is not None else "at end")
        return " ".join(parts)


# --- measurements ------------------------------------------------------------------------

Measure = Callable[[World, Check], Any]


def _leader(w: World, c: Check) -> str | None:
    node = w.leader()
    return node.node_id if node else None


def _role(w: World, c: Check) -> str:
    core = w.nodes[c.node].core
    return core.role.value if core is not None else "none"


def _term(w: World, c: Check) -> int:
    core = w.nodes[c.node].core
    return core.term if core is not None else w.checker.track(c.node).hs.term


def _commit(w: World, c: Check) -> int:
    core = w.nodes[c.node].core
    return core.commit if core is not None else 0


def _applied(w: World, c: Check) -> int:
    if c.node:
        return w.nodes[c.node].state.applied
    up = [n.state.applied for n in w.nodes.values() if n.up]
    return min(up, default=0)


def _acks_from(w: World, c: Check) -> int:
    return sum(1 for a in w.workload.acks if a.node == c.node)


def _voters(w: World, c: Check) -> list[str] | None:
    node = w.leader()
    return list(node.core.conf.voters) if node and node.core else None


def _duplicates(w: World, c: Check) -> int:
    seen: dict[tuple[str, int], int] = {}
    for e in w.checker.applied_entries.values():
        if e.client_id:
            seen[(e.client_id, e.seq)] = seen.get((e.client_id, e.seq), 0) + 1
    return sum(1 for n in seen.values() if n > 1)


def _admin_accepted(w: World, c: Check) -> bool:
    return any(
        op == c.value and node == c.node and result.startswith("accepted")
        for _, op, node, result in w.admin.log
    )


def _int(v: Value) -> int:
    if not isinstance(v, int):
        raise ScenarioError(f"expected an integer value, got {v!r}")
    return v


Judge = Callable[[Any, Any, Check], bool]

# name -> (needs node, measure, judge(now, then, check)); ``then`` is the value at ``since``.
CHECKS: dict[str, tuple[bool, Measure, Judge, str]] = {
    "leader": (
        False,
        _leader,
        lambda now, then, c: now is not None and (not c.value or now == c.value),
        "a leader runs (value: that node)",
    ),
    "no_leader": (False, _leader, lambda now, then, c: now is None, "no node leads"),
    "not_leader": (
        True,
        _role,
        lambda now, then, c: now != Role.LEADER.value,
        "node does not lead",
    ),
    "role": (True, _role, lambda now, then, c: now == c.value, "node's role is value"),
    "status": (
        True,
        lambda w, c: w.nodes[c.node].status.value,
        lambda now, then, c: now == c.value,
        "node's status is value",
    ),
    "term_unchanged": (
        True,
        _term,
        lambda now, then, c: now == then,
        "node's term is what it was at since",
    ),
    "term_at_most": (
        True,
        _term,
        lambda now, then, c: now <= _int(c.value),
        "node's term <= value",
    ),
    "max_term_at_most": (
        False,
        lambda w, c: max([_term(w, attrs.evolve(c, node=n)) for n in w.node_ids]),
        lambda now, then, c: now <= _int(c.value),
        "no node's term exceeds value",
    ),
    "leader_changed": (
        False,
        _leader,
        lambda now, then, c: now is not None and now != then,
        "a different node leads than at since",
    ),
    "leader_same": (
        False,
        _leader,
        lambda now, then, c: now is not None and now == then,
        "the same node leads as at since",
    ),
    "leader_terms_at_most": (
        False,
        lambda w, c: len(w.checker.leaders),
        lambda now, then, c: now - (then or 0) <= _int(c.value),
        "at most value terms had a leader (since since)",
    ),
    "leader_terms_at_least": (
        False,
        lambda w, c: len(w.checker.leaders),
        lambda now, then, c: now - (then or 0) >= _int(c.value),
        "at least value terms had a leader (since since)",
    ),
    "committed_at_least": (
        False,
        lambda w, c: w.checker.max_committed(),
        lambda now, then, c: now >= _int(c.value),
        "the cluster committed index value",
    ),
    "commit_at_least": (
        True,
        _commit,
        lambda now, then, c: now >= _int(c.value),
        "node's commit index >= value",
    ),
    "applied_at_least": (
        False,
        _applied,
        lambda now, then, c: now >= _int(c.value),
        "node (default: every running node) applied >= value",
    ),
    "acked_at_least": (
        False,
        lambda w, c: len(w.workload.acks),
        lambda now, then, c: now - (then or 0) >= _int(c.value),
        "clients got value acknowledgements (since since)",
    ),
    "acked_at_most": (
        False,
        lambda w, c: len(w.workload.acks),
        lambda now, then, c: now - (then or 0) <= _int(c.value),
        "clients got at most value acknowledgements (since since)",
    ),
    "acks_from_at_most": (
        True,
        _acks_from,
        lambda now, then, c: now - (then or 0) <= _int(c.value),
        "node acknowledged at most value commands (since since)",
    ),
    "truncated_at_least": (
        True,
        lambda w, c: w.checker.track(c.node).truncations,
        lambda now, then, c: now - (then or 0) >= _int(c.value or 1),
        "node's log was truncated (value times)",
    ),
    "truncated_at_most": (
        False,
        lambda w, c: sum(
            w.checker.track(n).truncations for n in ([c.node] if c.node else w.node_ids)
        ),
        lambda now, then, c: now - (then or 0) <= _int(c.value or 0),
        "node's (default: every node's) log was truncated at most value times",
    ),
    "crashed_at_least": (
        True,
        lambda w, c: w.crashes_by_node[c.node],
        lambda now, then, c: now - (then or 0) >= _int(c.value or 1),
        "node crashed (value times), whatever the cause",
    ),
    "degraded_at_least": (
        True,
        lambda w, c: w.degraded_by_node[c.node],
        lambda now, then, c: now - (then or 0) >= _int(c.value or 1),
        "node's storage refused writes (disk full) (value times)",
    ),
    "torn_writes_at_least": (
        True,
        lambda w, c: w.disks[c.node].statistics().torn_writes,
        lambda now, then, c: now - (then or 0) >= _int(c.value or 1),
        "a crash left a torn (partial) un-synced write on node's disk",
    ),
    "restored_at_least": (
        True,
        lambda w, c: w.restores_by_node[c.node],
        lambda now, then, c: now - (then or 0) >= _int(c.value or 1),
        "node installed a leader's snapshot (value times)",
    ),
    "voters": (
        False,
        _voters,
        lambda now, then, c: now == c.value,
        "the leader's voters are value",
    ),
    "duplicates_at_least": (
        False,
        _duplicates,
        lambda now, then, c: now >= _int(c.value),
        "value commands reached the log more than once (retries)",
    ),
    "admin_accepted": (
        True,
        _admin_accepted,
        lambda now, then, c: bool(now),
        "a leader accepted admin op value for node",
    ),
}
