"""Named regression scenarios: data files in ``specs/scenarios/*.toml`` with expected outcomes.

A scenario file::

    name = "figure-8"
    description = "what it reproduces and why it matters"
    seed = 1
    mutant = "commit-old-term"      # optional: a negative control
    [config]                        # SimConfig keys over SCENARIO_DEFAULTS
    nodes = 5
    steps = 600
    [[actions]]                     # the fault plan (see skulk.sim._faults.OPS)
    at = 50
    op = "partition"
    groups = [["n1", "n2"], ["n3", "n4", "n5"]]
    [expect]
    outcome = "safe"                # or the name of the violation the run must stop with
    [[expect.checks]]               # assertions (see CHECKS), evaluated at the end of tick
    check = "leader_changed"        # ``at`` (default: the end of the run), comparing with the
    at = 300                        # value measured at the end of tick ``since`` where the
    since = 100                     # check compares two moments (so an action at tick t is
                                    # seen by ``since = t - 1``, not ``since = t``)
    node = "n1"
    value = 3

A scenario passes when the run's outcome is the expected one and every check holds (with a
violation expected, the checks reached before it must hold; the others are not evaluated).
``python -m skulk.sim scenario NAME`` runs one; ``tests/sim/test_scenarios.py`` runs every file.

Node fields of actions may say ``"@leader"`` (whoever leads when the action runs). Scenarios
that need a particular leader get one with ``op = "transfer"`` and check it with
``check = "leader"``, so that a change in the core's timing shows up as a failed check
rather than as a scenario silently testing something else.

An action with ``on = "elected" | "first_commit" | "proposed"`` and ``after = N`` is
triggered: ``at`` arms it, and it runs N ticks after the next such event, ``"@leader"`` then
meaning the leader the event is about (:mod:`skulk.sim._triggers`)::

    [[actions]]                     # cut off the next leader before its no-op leaves it
    at = 100
    op = "isolate"
    node = "@leader"
    on = "elected"
    after = 1
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from skulk.consensus import Role
from skulk.sim._config import ConfigError, SimConfig
from skulk.sim._faults import Action, PlanError, sort_plan, validate
from skulk.sim._mutants import MUTANTS, find_mutant
from skulk.sim._run import RunResult, build_world, result_of
from skulk.sim._world import World

SCENARIO_DIR = Path(__file__).resolve().parents[2] / "specs" / "scenarios"

SCENARIO_DEFAULTS = SimConfig(
    steps=600,
    faults=False,
    liveness=False,
    drop=0.0,
    dup=0.0,
    delay_lo=1,
    delay_hi=2,
    clients=2,
    command_rate=0.2,
    vary=False,
)
"""Scenarios start from a quiet network with no random faults; their files say the rest."""

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


@attrs.frozen
class Scenario:
    name: str
    description: str
    seed: int
    mutant: str
    config: SimConfig
    plan: tuple[Action, ...]
    outcome: str
    checks: tuple[Check, ...]
    path: Path | None = None


@attrs.frozen
class CheckResult:
    check: Check
    ok: bool
    detail: str


@attrs.frozen
class ScenarioResult:
    scenario: Scenario
    run: RunResult
    checks: tuple[CheckResult, ...]
    passed: bool
    reason: str


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


# --- loading ---------------------------------------------------------------------------------


def load_scenario(path: Path) -> Scenario:
    """Parse and validate one scenario file; raises :class:`ScenarioError`."""
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ScenarioError(f"{path}: {exc}") from exc
    try:
        return _parse(raw, path)
    except (ConfigError, PlanError, KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, ScenarioError):
            raise
        raise ScenarioError(f"{path.name}: {exc}") from exc


def _parse(raw: dict[str, Any], path: Path | None) -> Scenario:
    known = {"name", "description", "seed", "mutant", "config", "actions", "expect"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ScenarioError(f"unknown key(s) {', '.join(unknown)}")
    name = str(raw["name"])
    if path is not None and path.stem != name:
        raise ScenarioError(f"name {name!r} differs from the file name {path.stem!r}")
    mutant = str(raw.get("mutant", ""))
    if mutant and mutant not in MUTANTS:
        raise ScenarioError(f"unknown mutant {mutant!r}")
    config = SimConfig.from_json(dict(raw.get("config", {})), base=SCENARIO_DEFAULTS)
    plan = sort_plan(Action.from_json(dict(a)) for a in raw.get("actions", ()))
    for a in plan:
        validate(a, config.node_ids)
    expect = dict(raw.get("expect", {}))
    outcome = str(expect.pop("outcome", "safe"))
    checks = tuple(_check(dict(c), config) for c in expect.pop("checks", ()))
    if expect:
        raise ScenarioError(f"unknown expect key(s) {', '.join(sorted(expect))}")
    return Scenario(
        name=name,
        description=str(raw.get("description", "")),
        seed=int(raw.get("seed", 0)),
        mutant=mutant,
        config=config,
        plan=plan,
        outcome=outcome,
        checks=checks,
        path=path,
    )


def _check(raw: dict[str, Any], config: SimConfig) -> Check:
    fields = {"check", "at", "since", "node", "value"}
    if set(raw) - fields:
        raise ScenarioError(f"check {raw!r}: unknown key(s) {sorted(set(raw) - fields)}")
    check = Check(
        check=str(raw["check"]),
        at=raw.get("at"),
        since=raw.get("since"),
        node=str(raw.get("node", "")),
        value=raw.get("value"),
    )
    spec = CHECKS.get(check.check)
    if spec is None:
        raise ScenarioError(f"unknown check {check.check!r} (known: {', '.join(sorted(CHECKS))})")
    if spec[0] and check.node not in config.node_ids:
        raise ScenarioError(f"check {check.check} needs a node of the cluster, not {check.node!r}")
    for t in (check.at, check.since):
        if t is not None and not 0 <= t < config.steps:
            raise ScenarioError(f"check {check.check}: tick {t} outside the run")
    return check


def scenario_paths(directory: Path = SCENARIO_DIR) -> list[Path]:
    return sorted(directory.glob("*.toml"))


def find_scenario(name: str, directory: Path = SCENARIO_DIR) -> Scenario:
    path = directory / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(p.stem for p in scenario_paths(directory))
        raise ScenarioError(f"no scenario {name!r} (known: {known})")
    return load_scenario(path)


# --- running -----------------------------------------------------------------------------------


def run_scenario(
    scenario: Scenario, *, trace_sink: Callable[[str], None] | None = None
) -> ScenarioResult:
    """Run ``scenario`` and judge it; ``trace_sink`` receives every trace line."""
    world = build_world(
        scenario.seed,
        scenario.config,
        mutant=find_mutant(scenario.mutant),
        plan=scenario.plan,
        trace_sink=trace_sink,
    )
    results: dict[int, CheckResult] = {}
    then: dict[int, Any] = {}

    def at(tick: int, fn: Callable[[], None]) -> None:
        world.at_tick_end.setdefault(tick, []).append(fn)

    def evaluate(k: int, check: Check) -> None:
        _, measure, judge, _ = CHECKS[check.check]
        now = measure(world, check)
        ok = bool(judge(now, then.get(k), check))
        detail = f"measured {now!r}" + (f", at {check.since}: {then.get(k)!r}" if k in then else "")
        results[k] = CheckResult(check, ok, detail)

    def capture(k: int, check: Check) -> Callable[[], None]:
        def run() -> None:
            then[k] = CHECKS[check.check][1](world, check)

        return run

    def later(k: int, check: Check) -> Callable[[], None]:
        return lambda: evaluate(k, check)

    for k, check in enumerate(scenario.checks):
        if check.since is not None:
            at(check.since, capture(k, check))
        if check.at is not None:
            at(check.at, later(k, check))
    world.run()
    for k, check in enumerate(scenario.checks):
        if check.at is None and world.violation is None:
            evaluate(k, check)
    run = result_of(world)
    got = run.violation.name if run.violation else "safe"
    checks = tuple(
        results.get(k, CheckResult(c, scenario.outcome != "safe", "not reached"))
        for k, c in enumerate(scenario.checks)
    )
    failed = [c for c in checks if not c.ok]
    if got != scenario.outcome:
        reason = f"expected {scenario.outcome}, got {run.violation or 'safe'}"
    elif failed:
        reason = f"{len(failed)} check(s) failed: " + "; ".join(
            f"{c.check.label()} ({c.detail})" for c in failed
        )
    else:
        reason = f"{got} as expected" + (f": {run.violation}" if run.violation else "")
    return ScenarioResult(scenario, run, checks, got == scenario.outcome and not failed, reason)
