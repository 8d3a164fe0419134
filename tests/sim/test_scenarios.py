"""Every scenario in specs/scenarios/ runs and ends as its file expects; bad files are refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from skulk.sim import load_scenario, run_scenario
from skulk.sim._scenario import scenario_paths
from skulk.sim._scenariochecks import CHECKS, ScenarioError

PATHS = scenario_paths()


def test_there_are_scenarios_for_every_listed_situation() -> None:
    names = {p.stem for p in PATHS}
    assert len(names) >= 25
    assert {"figure-8", "figure-8-commit-old-term", "impure-apply-detected"} <= names


@pytest.mark.parametrize("path", PATHS, ids=[p.stem for p in PATHS])
def test_scenario(path: Path) -> None:
    scenario = load_scenario(path)
    result = run_scenario(scenario)
    assert result.passed, result.reason
    assert all(c.ok for c in result.checks)


def test_a_scenario_replays_to_the_same_trace_hash() -> None:
    scenario = load_scenario(PATHS[0])
    assert run_scenario(scenario).run.trace_hash == run_scenario(scenario).run.trace_hash


def write(tmp_path: Path, name: str, body: str) -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'name = "{name}"\n' + body)
    return path


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("colour = 1\n", "unknown key"),
        ('mutant = "gremlin"\n', "unknown mutant"),
        ("[config]\nnodes = 99\n", "nodes must be"),
        ('[config]\nsteps = "many"\n', "expected int"),
        ("[config]\nwarp = 9\n", "unknown configuration key"),
        ('[[actions]]\nat = 5\nop = "crash"\nnode = "n7"\n', "unknown node"),
        ('[[actions]]\nat = 5\nop = "teleport"\n', "unknown op"),
        ('[expect]\n[[expect.checks]]\ncheck = "vibes"\n', "unknown check"),
        ('[expect]\n[[expect.checks]]\ncheck = "role"\nvalue = "leader"\n', "needs a node"),
        ('[expect]\n[[expect.checks]]\ncheck = "leader"\nat = 100000\n', "outside the run"),
        ("[expect]\nmood = 1\n", "unknown expect key"),
    ],
)
def test_bad_scenario_files_are_refused(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        load_scenario(write(tmp_path, "bad", body))


def test_name_must_match_file(tmp_path: Path) -> None:
    path = tmp_path / "one.toml"
    path.write_text('name = "two"\n')
    with pytest.raises(ScenarioError, match="differs from the file name"):
        load_scenario(path)


def test_a_failing_expectation_is_reported(tmp_path: Path) -> None:
    body = (
        '[config]\nsteps = 200\n[expect]\noutcome = "election_safety"\n'
        '[[expect.checks]]\ncheck = "leader"\nat = 150\nvalue = "n9"\n'
    )
    result = run_scenario(load_scenario(write(tmp_path, "wrong", body)))
    assert not result.passed and "expected election_safety" in result.reason
    body = '[config]\nsteps = 200\n[[expect.checks]]\ncheck = "no_leader"\nat = 150\n'
    body = body.replace("[[expect.checks]]", "[expect]\n[[expect.checks]]")
    result = run_scenario(load_scenario(write(tmp_path, "wrong2", body)))
    assert not result.passed and "1 check(s) failed" in result.reason


def test_every_check_is_documented() -> None:
    assert all(doc for _, _, _, doc in CHECKS.values())
