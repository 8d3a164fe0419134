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
    [[expect.checks]]               # assertions (see _scenariochecks), evaluated at the end of
    check = "leader_changed"        # tick ``at`` (default: the end of the run), comparing with the
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

from skulk.sim._config import ConfigError, SimConfig
from skulk.sim._faults import Action, PlanError, sort_plan, validate
from skulk.sim._mutants import MUTANTS, find_mutant
from skulk.sim._run import RunResult, build_world, result_of
from skulk.sim._scenariochecks import CHECKS, Check, ScenarioError

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
