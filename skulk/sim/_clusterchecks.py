"""Oracles over the real cluster State, written apart from :func:`skulk.cluster.apply`.

The invariant checker runs them on every replica after every applied entry, with the State
before the entry, the State after it, the decoded command and its result. They restate
``specs/cluster.md`` ("Invariants") in the plainest code possible, so that a bug in ``apply``
does not hide itself by being shared with its oracle. Each answers ``None`` or a
``(violation name, details)`` pair:

==============================  ===============================================================
``rejected_changed_state``      a ``Rejected`` command left the State exactly as it was
``placement_discipline``        an instance enters the State only through an ``Applied``
                                ``PlaceInstance`` of that id, holding the command's model,
                                sharding and shards; those never change afterwards
``placed_on_unavailable_node``  every shard node of a newly placed instance was known and
                                ``up`` in the State the ``PlaceInstance`` applied to (the State
                                at the previous index): nothing is committed onto a node that
                                is ``down`` or ``left`` at that index
``runner_records``              exactly one runner record per (instance, rank) of the existing
                                instances, on that shard's node -- none left for a deleted
                                instance or a rank that does not exist
``state_shape``                 collections sorted by unique keys; every instance's model and
                                shard nodes exist; ranks ``0..n-1`` on distinct nodes; layers
                                as the sharding requires
==============================  ===============================================================
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from skulk.cluster import COMMAND_CODEC, Instance, State, decode_result
from skulk.consensus import Entry
from skulk.wire import WireError
from skulk.wire.cluster import Applied, ClusterCommand, ClusterResult, PlaceInstance, Rejected

Problem = tuple[str, str]


def transition_problem(
    before: State, after: State, command: ClusterCommand | None, result: ClusterResult | None
) -> Problem | None:
    """What is wrong with ``before`` becoming ``after`` through ``command`` answered
    ``result`` (``command`` None: bytes that did not decode), or None."""
    if isinstance(result, Rejected) or command is None:
        if after != before:
            why = f"Rejected({result.reason})" if isinstance(result, Rejected) else "undecodable"
            return "rejected_changed_state", f"{why} {_name(command)} changed the State"
        return None
    if after.instances is not before.instances:
        problem = _placement_problem(before, after, command, result)
        if problem is not None:
            return problem
    if (
        after.nodes is before.nodes
        and after.models is before.models
        and after.instances is before.instances
        and after.runners is before.runners
    ):
        return None  # nothing the structural checks read changed
    return state_problem(after)


def _placement_problem(
    before: State, after: State, command: ClusterCommand, result: ClusterResult | None
) -> Problem | None:
    old = {i.id: i for i in before.instances}
    for inst in after.instances:
        was = old.get(inst.id)
        if was is not None:
            if (was.model, was.sharding, was.shards) != (inst.model, inst.sharding, inst.shards):
                return "placement_discipline", (
                    f"instance {inst.id!r} changed from {_where(was)} to {_where(inst)} "
                    f"through {_name(command)}"
                )
            continue
        if not (
            isinstance(command, PlaceInstance)
            and isinstance(result, Applied)
            and command.instance == inst.id
            and (command.model, command.sharding, command.shards)
            == (inst.model, inst.sharding, inst.shards)
        ):
            return "placement_discipline", (
                f"instance {inst.id!r} ({_where(inst)}) appeared through {_name(command)} "
                f"answered {result}"
            )
        for shard in inst.shards:
            node = before.node(shard.node)
            status = node.status if node is not None else "unknown"
            if status != "up":
                return "placed_on_unavailable_node", (
                    f"instance {inst.id!r} committed with rank {shard.rank} on node "
                    f"{shard.node!r}, which was {status} when it applied"
                )
    return None


def state_problem(state: State) -> Problem | None:
    """What breaks the State's own invariants (spec items 1-5), or None."""
    for name, keys in (
        ("nodes", [n.id for n in state.nodes]),
        ("models", [m.id for m in state.models]),
        ("instances", [i.id for i in state.instances]),
        ("runners", [(r.instance, r.rank) for r in state.runners]),
        ("keys", [k.key for k in state.keys]),
    ):
        if not _strictly_sorted(keys):
            return "state_shape", f"{name} not sorted by a unique key: {keys}"
    models = {m.id: m.architecture.layers for m in state.models}
    nodes = {n.id for n in state.nodes}
    wanted: dict[tuple[str, int], str] = {}
    for inst in state.instances:
        layers = models.get(inst.model)
        if layers is None:
            return "state_shape", f"instance {inst.id!r} runs unknown model {inst.model!r}"
        problem = _shards_problem(inst, layers, nodes)
        if problem is not None:
            return "state_shape", problem
        for shard in inst.shards:
            wanted[(inst.id, shard.rank)] = shard.node
    have = {(r.instance, r.rank): r.node for r in state.runners}
    for key, node in have.items():
        if key not in wanted:
            ids = [i.id for i in state.instances]
            return "runner_records", f"runner {key} has no instance or rank (instances: {ids})"
        if wanted[key] != node:
            return "runner_records", f"runner {key} on {node!r}, its shard is on {wanted[key]!r}"
    missing = sorted(set(wanted) - set(have))
    if missing:
        return "runner_records", f"no runner record for {missing}"
    return None


def _shards_problem(inst: Instance, layers: int, nodes: set[str]) -> str | None:
    shards = inst.shards
    ranks = [s.rank for s in shards]
    on = [s.node for s in shards]
    if not shards or ranks != list(range(len(shards))) or len(set(on)) != len(on):
        return f"instance {inst.id!r} has ranks {ranks} on nodes {on}"
    unknown = sorted(set(on) - nodes)
    if unknown:
        return f"instance {inst.id!r} has shards on unknown nodes {unknown}"
    ranges = [(s.start, s.end) for s in shards]
    if inst.sharding == "single":
        ok = ranges == [(0, layers)]
    elif inst.sharding == "tensor":
        ok = all(r == (0, layers) for r in ranges)
    else:
        ok = (
            ranges[0][0] == 0
            and ranges[-1][1] == layers
            and all(a < b for a, b in ranges)
            and all(ranges[k][1] == ranges[k + 1][0] for k in range(len(ranges) - 1))
        )
    return None if ok else f"{inst.sharding} instance {inst.id!r} holds layers {ranges} of {layers}"


def outcome_key(entry: Entry, result: bytes) -> str:
    """``"Kind:applied"`` or ``"Kind:reason"`` for an effective command entry."""
    try:
        kind = type(COMMAND_CODEC.decode(entry.data)).__name__
    except WireError:
        kind = "undecodable"
    return f"{kind}:{result_text(result)}"


def result_text(result: bytes) -> str:
    """``applied``, a rejection's reason, or the bytes when they are not a result."""
    try:
        answer = decode_result(result)
    except WireError:
        return f"{result!r:.40}"
    return answer.reason if isinstance(answer, Rejected) else "applied"


def _strictly_sorted(keys: Sequence[object]) -> bool:
    return all(a < b for a, b in itertools.pairwise(keys))  # type: ignore[operator]


def _where(inst: Instance) -> str:
    return f"{inst.model} {inst.sharding} on {[s.node for s in inst.shards]}"


def _name(command: ClusterCommand | None) -> str:
    return type(command).__name__ if command is not None else "bytes that do not decode"
