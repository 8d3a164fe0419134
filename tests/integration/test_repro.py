"""The hang repro scripts, run as a user runs them: ``python -m skulk.repro …``.

Every scenario must detect its hang, recover and leave no process behind (exit 0); every
deliberate breakage must make its scenario fail (exit 1) at the check its detector guards —
after the hang was provoked — and still be cleaned up. The timeline helpers are checked on
sample diagnostics documents.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from skulk.models import ensure_demo_model
from skulk.repro import BREAKS, SCENARIOS
from skulk.repro._cluster import parse_instances
from skulk.repro._timeline import DiagnosticsError, Event, format_timeline, parse_runners

#: A scenario takes 10-20 s; this only stops a broken run from blocking the suite.
RUN_TIMEOUT = 240


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One data dir with the demo model, shared by every run."""
    home = tmp_path_factory.mktemp("repro-home")
    ensure_demo_model(home)
    return home


def repro(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skulk.repro", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT,
    )


def test_list_names_every_scenario_and_breakage() -> None:
    result = repro("list")
    assert result.returncode == 0, result.stderr
    names = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    required = {
        "runner-silent-at-start",
        "runner-wedged-mid-decode",
        "runner-crash-mid-stream",
        "runner-ignores-sigterm",
        "runner-crash-loop",
        "parent-killed",
        "rank-stopped-mid-decode",
        "rank-killed-mid-prefill",
        "rank-never-joins",
        "serving-node-silent",
        "serving-node-lost-mid-stream",
        "node-paused-past-down",
        "leader-lost-mid-placement",
        "api-node-partitioned",
        "raft-storage-full",
        "raft-storage-full-leader",
    }
    assert required <= {s.name for s in SCENARIOS}
    assert {s.name for s in SCENARIOS} | {b.name for b in BREAKS} <= names


def test_run_refuses_an_unknown_scenario() -> None:
    result = repro("run", "no-such-hang")
    assert result.returncode == 2
    assert "no-such-hang" in result.stderr


@pytest.mark.parametrize("name", [s.name for s in SCENARIOS])
def test_scenario_detects_the_hang_and_recovers(home: Path, name: str) -> None:
    result = repro("run", name, "--home", str(home))
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "-- flight-recorder timeline" in out
    timeline = out.split("-- flight-recorder timeline", 1)[1].split("-- checks", 1)[0]
    assert "#1" in timeline and "phase" in timeline, timeline
    assert "PASS  no stray processes" in out
    assert "FAIL" not in out
    assert f"== {name}: PASSED" in out


def test_without_a_progress_deadline_the_wedge_goes_undetected(home: Path) -> None:
    """The negative control: a supervisor with the progress deadline disabled must make the
    wedged-runner scenario fail — and the run must still clean up every process."""
    result = repro(
        "run", "runner-wedged-mid-decode", "--break", "progress-deadline", "--json",
        "--home", str(home),
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] is False and report["break"] == "progress-deadline"
    assert report["flags"]["progress-timeout"] == "0"
    checks = {c["name"]: c for c in report["checks"]}
    detected = checks["the stream ended with the typed error runner_wedged"]
    assert detected["passed"] is False
    assert "client deadline" in detected["detail"]
    assert checks["no stray processes"]["passed"] is True
    assert checks["node 1 shut down cleanly on SIGTERM"]["passed"] is True
    assert any(e["kind"] == "request.first_token" for e in report["timeline"])


#: Each distributed breakage, the scenario it breaks, a check that must still pass (the hang
#: was provoked), and the check that must fail with what its detail must say.
DISTRIBUTED_BREAKS = [
    (
        "rank-stopped-mid-decode",
        "collective-watchdog",
        "was SIGSTOPped mid-decode",
        "the stream ended with a typed error",
        "client deadline",
    ),
    (
        "rank-stopped-mid-decode",
        "rank-pause-watch",
        "the stream ended with a typed error",
        "the leader blamed the stopped rank's node",
        "nodes blamed: none",
    ),
    (
        "rank-killed-mid-prefill",
        "one-compute-port",
        "the request ended with a typed error",
        "the leader re-placed the instance and it serves again",
        "marked it failed",
    ),
    (
        "rank-never-joins",
        "group-connect-deadline",
        "3 nodes formed one cluster",
        "the first placement failed and was re-placed within the connect deadline",
        "connecting",
    ),
    (
        "serving-node-silent",
        "link-deadlines",
        "was SIGSTOPped mid-stream",
        "the stream ended with the typed error node_unreachable",
        "client deadline",
    ),
    (
        "serving-node-lost-mid-stream",
        "node-down-verdict",
        "the stream ended with the typed error node_unreachable",
        "the leader committed node 2 down and its instance serves elsewhere",
        "now: single",
    ),
    (
        "node-paused-past-down",
        "link-liveness",
        "was SIGSTOPped",
        "the leader committed node 2 down and its instance serves elsewhere",
        "now: single",
    ),
    (
        "leader-lost-mid-placement",
        "election",
        "the client got a typed answer",
        "a new leader was elected among the survivors",
        "waited",
    ),
    (
        "raft-storage-full-leader",
        "election",
        "the leader's Raft storage hit ENOSPC",
        "node 2 asked the next leader and the placement was answered 201 within its deadline",
        "no_quorum",
    ),
    (
        "api-node-partitioned",
        "link-deadlines",
        "was cut one way mid-stream",
        "the stream ended with the typed error node_unreachable",
        "client deadline",
    ),
]


def test_every_breakage_is_tested() -> None:
    tested = {b for _, b, *_ in DISTRIBUTED_BREAKS} | {"progress-deadline"}
    assert tested == {b.name for b in BREAKS}


@pytest.mark.parametrize(
    ("name", "breakage", "provoked", "failing", "why"),
    DISTRIBUTED_BREAKS,
    ids=[f"{n}-{b}" for n, b, *_ in DISTRIBUTED_BREAKS],
)
def test_a_distributed_breakage_makes_its_scenario_fail(
    home: Path, name: str, breakage: str, provoked: str, failing: str, why: str
) -> None:
    """Negative controls: with its detector (or, for a killed rank, its recovery) disabled
    the scenario fails at the check that detector guards — and still cleans up."""
    result = repro("run", name, "--break", breakage, "--json", "--home", str(home))
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert report["passed"] is False and report["break"] == breakage
    checks = report["checks"]
    assert any(provoked in c["name"] and c["passed"] for c in checks), checks
    failed = [c for c in checks if not c["passed"]]
    assert failed and failed[0]["name"] == failing, failed  # the first check to fail
    assert why in failed[0]["detail"], failed[0]
    assert report["aborted"].endswith(failed[-1]["name"])
    stopped = [c for c in checks if c["name"].endswith("shut down cleanly on SIGTERM")]
    assert stopped and all(c["passed"] for c in stopped), stopped
    assert any(c["name"] == "no stray processes" and c["passed"] for c in checks)


def _event(at: float, kind: str, detail: str = "", request_id: str | None = None) -> object:
    return {
        "at": 1000.0 + at,
        "since_spawn": at,
        "kind": kind,
        "detail": detail,
        "request_id": request_id,
    }


WEDGED: dict[str, object] = {
    "incarnation": 1,
    "pid": 100,
    "phase": "failed",
    "exit_code": -9,
    "failure": {"reason": "runner_wedged", "message": "silent for 2s", "tail": ["x"]},
    "active_requests": 0,
    "deadlines": {"progress_timeout": 2.0},
    "events": [
        _event(0.0, "phase", "spawning"),
        _event(1.0, "request.start", request_id="req-0123456789abcdef"),
        *(_event(1.1 + i / 10, "heartbeat", f"#{i}") for i in range(3)),
        _event(3.5, "deadline", "progress_timeout (2s)"),
        _event(4.5, "signal", "SIGKILL to group"),
    ],
}
SAMPLE = {
    "model": {"model_id": "skulk-demo", "state": "ready"},
    "runners": [
        WEDGED,
        {
            "incarnation": 2,
            "pid": None,
            "phase": "spawning",
            "exit_code": None,
            "failure": None,
            "active_requests": 0,
            "deadlines": {},
            "events": [_event(5.0, "phase", "spawning")],
        },
    ],
}


def test_timeline_of_a_sample_diagnostics_document() -> None:
    runners = parse_runners(SAMPLE)
    assert [r.incarnation for r in runners] == [1, 2]
    first = runners[0]
    assert first.failure is not None and first.failure.reason == "runner_wedged"
    assert first.exit_code == -9 and first.first("signal", "SIGKILL") is not None
    lines = format_timeline([e for r in runners for e in r.events], t0=1000.0)
    # Three heartbeats fold into one line; every other event gets its own.
    assert len(lines) == 6, lines
    assert lines[0].split()[:4] == ["0.000s", "#1", "0.000s", "phase"]
    assert "heartbeat" in lines[2] and "x3" in lines[2]
    assert "progress_timeout (2s)" in lines[3] and lines[3].split()[0] == "3.500s"
    assert "[456789abcdef]" in lines[1]
    assert lines[-1].split()[1] == "#2"


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ({}, "$"),
        ({"runners": {}}, "$.runners"),
        ({"runners": [{**WEDGED, "pid": "100"}]}, "$.runners[0].pid"),
        ({"runners": [{**WEDGED, "exit_code": True}]}, "$.runners[0].exit_code"),
        ({"runners": [{**WEDGED, "events": [{"at": 1}]}]}, "$.runners[0].events[0]"),
    ],
)
def test_diagnostics_of_another_shape_are_refused_with_the_path(doc: object, path: str) -> None:
    with pytest.raises(DiagnosticsError, match=re.escape(f"@ {path}")):
        parse_runners(doc)


def test_instances_documents_and_cluster_labels() -> None:
    doc = {
        "instances": [
            {
                "id": "bc0dbc2cc897",
                "model": "skulk-demo",
                "sharding": "pipeline",
                "status": "placed",
                "shards": [
                    {
                        "rank": r,
                        "node": f"node-{r}",
                        "layers": [r, r + 1],
                        "address": f"127.0.0.1:{4000 + r}",
                        "runner": {"phase": "ready", "failure": "x" if r else None},
                    }
                    for r in (0, 1)
                ],
            }
        ]
    }
    (inst,) = parse_instances(doc)
    assert inst.nodes == ("node-0", "node-1") and inst.ready
    assert inst.addresses == {"127.0.0.1:4000", "127.0.0.1:4001"}
    assert [s.failure for s in inst.shards] == [None, "x"]
    broken = json.loads(json.dumps(doc))
    broken["instances"][0]["shards"][1]["rank"] = "1"
    with pytest.raises(DiagnosticsError, match=re.escape("@ $.instances[0].shards[1].rank")):
        parse_instances(broken)
    event = Event(
        2, 1, 1000.5, 0.5, "deadline", "collective_timeout (5s)", instance=inst.id, rank=1
    )
    (line,) = format_timeline([event], t0=1000.0)
    assert line.split()[:4] == ["0.500s", "n2:bc0d/r1#1", "0.500s", "deadline"]
