"""Negative controls: the harness catches every deliberately broken variant.

A mutant with a targeted scenario (a ``specs/scenarios`` file naming it) must fail as that file
expects; every other one must be caught by random seeds within ``SEED_BOUND`` seeds.
"""

from __future__ import annotations

import pytest

from skulk.sim import MUTANTS, SimConfig, run_seed
from skulk.sim._scenario import load_scenario, run_scenario, scenario_paths

SEED_BOUND = 20
CONFIG = SimConfig(steps=2000)

TARGETED = {
    s.mutant: s for s in (load_scenario(p) for p in scenario_paths()) if s.mutant
}


def test_every_mutant_has_a_negative_control_and_the_real_thing_passes_those_plans() -> None:
    assert {"commit-old-term", "no-persist-vote", "skip-fsync", "apply-before-commit",
            "ignore-vote-term", "no-prevote"} == set(MUTANTS)
    for mutant, scenario in TARGETED.items():
        assert scenario.outcome != "safe", mutant
        clean = scenario.path.with_name(scenario.name.replace(f"-{mutant}", "") + ".toml")
        if clean.is_file():  # the same plan without the mutant is safe
            assert run_scenario(load_scenario(clean)).passed


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught(name: str) -> None:
    if name in TARGETED:
        result = run_scenario(TARGETED[name])
        assert result.passed, result.reason
        assert result.run.violation is not None
        return
    for seed in range(SEED_BOUND):
        result = run_seed(seed, CONFIG, mutant=MUTANTS[name])
        if result.violation is not None:
            return
    pytest.fail(f"{name} survived {SEED_BOUND} seeds")
