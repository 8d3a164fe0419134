"""Negative controls: the harness catches every deliberately broken variant.

Each mutant must be caught by random seeds alone -- ``python -m skulk.sim run --seeds 0:300
--mutant NAME`` must fail -- so the seeds run in order until the first violation, which must
come before ``SEED_BOUND``. A mutant named by a ``specs/scenarios`` file must also fail as that
targeted scenario expects. A harness that finds known bugs only where someone already wrote
the scenario would not find the unknown ones.
"""

from __future__ import annotations

import pytest

from skulk.sim import MUTANTS, Mutant, Scenario, SimConfig, load_scenario, run_scenario, run_seed
from skulk.sim._scenario import scenario_paths

SEED_BOUND = 300
CONFIG = SimConfig()  # what `python -m skulk.sim run` runs

TARGETED = [s for s in (load_scenario(p) for p in scenario_paths()) if s.mutant]
"""Negative-control scenarios: a plan that a mutant must fail (``mutant = NAME``)."""


CLUSTER_MUTANTS = {
    "place-on-down-node": "placed_on_unavailable_node",
    "keep-runners-on-delete": "runner_records",
    "overwrite-instance": "placement_discipline",
    "write-on-reject": "rejected_changed_state",
    "impure-cluster-apply": "state_machine_safety",
    "forget-retry-result": "ack_result",
}
"""Mutants of the cluster State's ``apply`` (and of the sessions around it) -> the invariant
that must catch each."""


def first_catching_seed(mutant: Mutant) -> int | None:
    return first_violation(mutant)[0]


def first_violation(mutant: Mutant) -> tuple[int | None, str]:
    for seed in range(SEED_BOUND):
        violation = run_seed(seed, CONFIG, mutant=mutant).violation
        if violation is not None:
            return seed, violation.name
    return None, ""


def test_every_mutant_has_a_negative_control_and_the_real_thing_passes_those_plans() -> None:
    assert {
        "commit-old-term",
        "no-persist-vote",
        "skip-fsync",
        "apply-before-commit",
        "ignore-vote-term",
        "no-prevote",
        *CLUSTER_MUTANTS,
    } == set(MUTANTS)
    for scenario in TARGETED:
        assert scenario.outcome != "safe", scenario.name
        assert scenario.path is not None
        clean = scenario.path.with_name(scenario.name.replace(f"-{scenario.mutant}", "") + ".toml")
        if clean.is_file():  # the same plan without the mutant is safe
            assert run_scenario(load_scenario(clean)).passed


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught_by_random_seeds(name: str) -> None:
    seed = first_catching_seed(MUTANTS[name])
    assert seed is not None, f"{name} survived seeds 0:{SEED_BOUND}"


@pytest.mark.parametrize(("name", "invariant"), sorted(CLUSTER_MUTANTS.items()))
def test_cluster_mutant_is_caught_by_its_invariant(name: str, invariant: str) -> None:
    seed, caught_by = first_violation(MUTANTS[name])
    assert seed is not None, f"{name} survived seeds 0:{SEED_BOUND}"
    assert caught_by == invariant, f"{name}: seed {seed} broke {caught_by}, not {invariant}"


@pytest.mark.parametrize("scenario", TARGETED, ids=[s.name for s in TARGETED])
def test_mutant_is_caught_by_its_targeted_scenario(scenario: Scenario) -> None:
    result = run_scenario(scenario)
    assert result.passed, result.reason
    assert result.run.violation is not None
