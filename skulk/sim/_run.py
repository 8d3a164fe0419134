"""Running one seed: plan, world, result.

:func:`run_seed` is what ``python -m skulk.sim run`` does per seed, what the tests call and what
a repro file replays: given ``(seed, config, mutant)`` and optionally an explicit plan, the
result -- trace hash included -- is always the same. Without an explicit plan the plan is
:func:`~skulk.sim._swarm.random_plan` drawn from ``random.Random(f"{seed}:faults")`` (or no
faults at all when ``config.faults`` is false), and it is recorded in the result, so that a
repro file can carry it explicitly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from skulk.sim._config import SimConfig
from skulk.sim._faults import Action, validate
from skulk.sim._invariants import Violation
from skulk.sim._mutants import NONE, Mutant
from skulk.sim._swarm import PlanShape, random_plan
from skulk.sim._world import World


@attrs.frozen
class RunResult:
    """The outcome of one run. ``violation`` is None when every invariant held."""

    seed: int
    config: SimConfig
    mutant: str
    plan: tuple[Action, ...]
    trace_hash: str
    violation: Violation | None
    ticks: int
    events: int
    acks: int
    submissions: int
    max_term: int
    max_commit: int
    liveness: str
    counters: tuple[tuple[str, int], ...]
    trace_tail: tuple[str, ...]
    commands: tuple[tuple[str, int], ...] = ()
    """Effective cluster commands of the log by kind and outcome (``"PlaceInstance:applied"``,
    ``"PlaceInstance:node_not_up"``, ...); empty when the run stopped at a violation."""

    @property
    def ok(self) -> bool:
        return self.violation is None

    def summary(self) -> dict[str, Any]:
        """A JSON-friendly summary (no plan, no trace)."""
        return {
            "seed": self.seed,
            "mutant": self.mutant,
            "trace_hash": self.trace_hash,
            "ok": self.ok,
            "violation": attrs.asdict(self.violation) if self.violation else None,
            "ticks": self.ticks,
            "events": self.events,
            "acks": self.acks,
            "submissions": self.submissions,
            "max_term": self.max_term,
            "max_commit": self.max_commit,
            "liveness": self.liveness,
            **dict(self.counters),
            "commands": dict(self.commands),
        }


def varied(seed: int, config: SimConfig, *, resize: bool = True) -> SimConfig:
    """``config`` with parameters drawn from ``random.Random(f"{seed}:config")`` when
    ``config.vary`` is set (and ``vary`` then off); ``config`` itself otherwise.

    With ``resize`` (a random plan, which adapts to the cluster), half the seeds run 3 nodes
    instead of ``config.nodes`` (when that is larger and ``voters`` is not set); an explicit
    plan names its nodes, so the cluster keeps its size."""
    if not config.vary:
        return config
    rng = random.Random(f"{seed}:config")
    delay_hi = rng.choice([2, 3, 3, 4, 6, 8])
    changes: dict[str, Any] = {
        "delay_hi": delay_hi,
        # Raft's timing requirement (broadcast time << election timeout): with the election
        # timeout close to a round trip, two candidates split the vote round after round and
        # the liveness check would fail for the network's sake, not the protocol's.
        "election_ticks": max(config.election_ticks, 5 * delay_hi),
        "drop": rng.choice([0.0, 0.01, 0.01, 0.05]),
        "dup": rng.choice([0.0, 0.01, 0.01, 0.05]),
        "heartbeat_ticks": rng.choice([1, 2, 2, 3]),
        # small batches often: a new leader then sends an old leader's tail apart from its
        # own entries, and followers hold partial tails
        "max_append_entries": rng.choice([1, 1, 2, 4, 16, 64]),
        "max_inflight": rng.choice([1, 2, 8, 8]),
        "compact_every": rng.choice([8, 25, 50, 50, 200]),
        "snapshot_chunk_bytes": rng.choice([64, 512, 512, 4096]),
        "segment_bytes": rng.choice([1024, 16 * 1024, 16 * 1024]),
        "learner_catchup_entries": rng.choice([4, 16]),
    }
    if resize and config.nodes > 3 and not config.voters:
        # three nodes half the time: one fault is then a third of the cluster, and the
        # leader changes that set up Raft's subtler bugs take far fewer faults
        changes["nodes"] = rng.choice([3, config.nodes])
    return attrs.evolve(config, vary=False, **changes)


def plan_for(seed: int, config: SimConfig) -> tuple[Action, ...]:
    """The random fault plan of ``seed`` (empty when ``config.faults`` is off)."""
    if not config.faults:
        return ()
    shape = PlanShape(
        until=int(config.steps * config.fault_fraction),
        mean_gap=config.mean_fault_gap,
        disk_faults=config.disk_faults,
        bit_flips=config.bit_flips,
        membership=config.membership,
        timeout=config.election_timeout_max,
    )
    return random_plan(random.Random(f"{seed}:faults"), config.node_ids, shape)


def build_world(
    seed: int,
    config: SimConfig,
    *,
    mutant: Mutant = NONE,
    plan: Sequence[Action] | None = None,
    trace_sink: Callable[[str], None] | None = None,
) -> World:
    """A ready-to-run world; ``plan`` None: the seed's random plan. ``config`` is first
    :func:`varied` by the seed (resized only for a random plan)."""
    config = varied(seed, config, resize=plan is None)
    actions = plan_for(seed, config) if plan is None else tuple(plan)
    for a in actions:
        validate(a, config.node_ids)
    return World(seed, config, actions, mutant=mutant, trace_sink=trace_sink)


def result_of(world: World) -> RunResult:
    """Summarize a world that has run."""
    terms = [c.term for n in world.nodes.values() if (c := n.core) is not None]
    return RunResult(
        seed=world.seed,
        config=world.config,
        mutant=world.mutant.name,
        plan=world.plan,
        trace_hash=world.trace.hexdigest(),
        violation=world.violation,
        ticks=world.now,
        events=world.trace.events,
        acks=len(world.workload.acks),
        submissions=world.workload.submissions,
        max_term=max([*terms, *world.checker.leaders, 0]),
        max_commit=world.checker.max_committed(),
        liveness=world.liveness.note,
        counters=tuple(
            sorted({**world.counters, "triggered": world.triggers.statistics().fired}.items())
        ),
        trace_tail=tuple(world.trace.tail()),
        commands=tuple(world.checker.command_stats.items()),
    )


def run_seed(
    seed: int,
    config: SimConfig | None = None,
    *,
    mutant: Mutant = NONE,
    plan: Sequence[Action] | None = None,
    trace_sink: Callable[[str], None] | None = None,
) -> RunResult:
    """Run ``seed`` to the end (or the first violation) and return its result; ``trace_sink``
    receives every trace line."""
    world = build_world(
        seed, config or SimConfig(), mutant=mutant, plan=plan, trace_sink=trace_sink
    )
    world.run()
    return result_of(world)
