"""``python -m skulk.chaos``'s command line: each flag reaches the schedule, a replay reads the
file a failing run wrote, and usage errors and bad files exit 2 naming the problem."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skulk.chaos import FaultRecord, Op, generate
from skulk.chaos.__main__ import parse
from skulk.chaos._history import history_json


def test_run_flags_reach_the_schedule() -> None:
    schedule, _ = parse(["run", "--nodes", "3", "--minutes", "10", "--seed", "3", "--leader"])
    assert schedule == generate(3, 3, 600, leader=True)
    assert any(e.node == 0 for e in schedule.events)
    schedule, _ = parse(["run", "--minutes", "5", "--seed", "7", "--links", "--overlap"])
    assert schedule == generate(7, 3, 300, links=True, overlap=True) and schedule.links
    schedule, _ = parse(["run", "--minutes", "1"])  # a random seed, printed by main
    assert schedule.seconds == 60


def test_replay_reads_a_schedule_file(tmp_path: Path) -> None:
    path = tmp_path / "chaos-5.json"
    path.write_text(generate(5, 3, 120, links=True).to_json())
    schedule, _ = parse(["replay", str(path)])
    assert schedule == generate(5, 3, 120, links=True)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["run", "--nodes", "0"], "--nodes"),
        (["run", "--minutes", "0"], "--minutes"),
        (["run", "--leader", "--overlap"], "--overlap"),
        (["replay", "/nonexistent/chaos.json"], "No such file"),
    ],
)
def test_usage_errors_exit_2_naming_the_problem(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2
    assert says in capsys.readouterr().err


def test_a_bad_schedule_file_exits_2_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"version": 1, "seed": 1, "nodes": 3, "seconds": 60, "events": [7]}')
    with pytest.raises(SystemExit) as exc:
        parse(["replay", str(path)])
    assert exc.value.code == 2
    assert "$.events[0]" in capsys.readouterr().err


def test_the_history_file_holds_every_op_and_fault_by_field(tmp_path: Path) -> None:
    _, args = parse(["run", "--seed", "1", "--history", str(tmp_path / "h.json")])
    assert args.history == tmp_path / "h.json"
    op = Op("stream", 2, 1.0, 2.5, "error", status=404, code="model_not_found", prompt=1,
            max_tokens=16, request_id="chaos-1")  # fmt: skip
    fault = FaultRecord("kill", 2, 0.5, 1.5)
    got = json.loads(history_json([op], [fault]))
    assert got["ops"][0]["code"] == "model_not_found" and got["ops"][0]["request_id"] == "chaos-1"
    assert got["faults"] == [{"kind": "kill", "node": 2, "start": 0.5, "end": 1.5, "problem": ""}]
