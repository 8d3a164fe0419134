"""Running a scenario and reporting it (text with the timeline, or JSON)."""

from __future__ import annotations

import tempfile
import time
import traceback
from pathlib import Path

import attrs

from skulk.models import ensure_demo_model
from skulk.repro._scenario import Break, Check, Result, Scenario, StepFailed
from skulk.repro._session import Session
from skulk.repro._timeline import HEADER, LEGEND, format_timeline, merge_events


def run_scenario(
    scenario: Scenario, *, home: Path | None = None, breakage: Break | None = None
) -> Result:
    """Run ``scenario`` against real nodes and return what happened; never raises for a
    failure of the node under test, and leaves no process behind.

    ``home`` is a data dir to share between runs (the demo model is generated there once);
    by default a temporary one is made and removed. ``breakage`` starts the nodes with a
    deliberately broken configuration.
    """
    if home is None:
        with tempfile.TemporaryDirectory(prefix="skulk-repro-") as tmp:
            return run_scenario(scenario, home=Path(tmp), breakage=breakage)
    ensure_demo_model(home)
    flags = {**scenario.flags, **(breakage.flags if breakage else {})}
    session = Session(
        home,
        faults=scenario.faults,
        flags=flags,
        budget_s=scenario.budget_s,
        node_faults=scenario.node_faults,
        compute_ports=breakage.compute_ports if breakage else None,
        break_node_flags=breakage.node_flags if breakage else None,
    )
    aborted: str | None = None
    try:
        scenario.script(session)
    except StepFailed as exc:
        aborted = f"stopped after the failed check: {exc}"
    except Exception:
        aborted = "the script raised:\n" + traceback.format_exc()
    finally:
        try:
            session.finish()
        except Exception:
            session.kill_everything()
            session.check("cleanup finished", False, traceback.format_exc())
        except BaseException:  # Ctrl-C during cleanup: still leave nothing behind
            session.kill_everything()
            raise
        finally:
            session.close()
    contract = sorted(
        {e for n in session.nodes for e in n.recorder.contract_errors()}
        | set(session.watch.contract_errors())
    )
    checks = list(session.checks)
    if contract:
        checks.append(Check("diagnostics match the contract", False, "; ".join(contract)))
    events = merge_events(*(n.recorder.events() for n in session.nodes), session.watch.events())
    faults = scenario.faults or "; ".join(
        f"node {n}: {spec}" for n, spec in sorted(scenario.node_faults.items())
    )
    result = Result(
        scenario=scenario.name,
        description=scenario.description,
        faults=faults,
        flags=session.flags,
        node_flags=session.break_node_flags,
        breakage=breakage.name if breakage else None,
        checks=tuple(checks),
        timeline=tuple(events),
        started_at=session.t0,
        duration_s=round(time.monotonic() - session.started, 3),
        aborted=aborted,
    )
    if not result.passed:
        log = [f"[node {n.index}] {line}" for n in session.nodes for line in n.log_tail()]
        result = attrs.evolve(result, node_log=tuple(log))
    return result


def format_report(result: Result) -> str:
    """The human-readable report: setup, the flight-recorder timeline, one line per check,
    and the verdict."""
    flags = " ".join(f"--{k} {v}" for k, v in result.flags.items())
    out = [
        f"== {result.scenario}: {result.description}",
        f"   faults: {result.faults or '(none)'}",
        f"   node flags: {flags}",
    ]
    for n, extra in sorted(result.node_flags.items()):
        out.append(f"   node {n} also: " + " ".join(f"--{k} {v}" for k, v in extra.items()))
    if result.breakage:
        out.append(f"   DELIBERATELY BROKEN: {result.breakage}")
    out += ["", "-- flight-recorder timeline", HEADER]
    if any(e.instance is not None for e in result.timeline):
        out.append(LEGEND)
    out += format_timeline(result.timeline, result.started_at) or ["   (no events recorded)"]
    out += ["", "-- checks"]
    for c in result.checks:
        out.append(
            f"{'PASS' if c.passed else 'FAIL'}  {c.name}" + (f": {c.detail}" if c.detail else "")
        )
    if result.aborted:
        out.append(f"ABORTED  {result.aborted}")
    if result.node_log:
        out += ["", "-- node log (tail)", *result.node_log]
    failed = sum(not c.passed for c in result.checks)
    verdict = "PASSED" if result.passed else f"FAILED ({failed} failed checks)"
    out += ["", f"== {result.scenario}: {verdict} in {result.duration_s:.1f}s"]
    return "\n".join(out)


def result_json(result: Result) -> dict[str, object]:
    """The machine-readable result (``--json``); event ``t`` counts from the run's start."""
    t0 = result.started_at
    return {
        "scenario": result.scenario,
        "description": result.description,
        "passed": result.passed,
        "faults": result.faults,
        "flags": dict(result.flags),
        "node_flags": {str(n): dict(f) for n, f in result.node_flags.items()},
        "break": result.breakage,
        "duration_s": result.duration_s,
        "aborted": result.aborted,
        "checks": [attrs.asdict(c) for c in result.checks],
        "timeline": [{**attrs.asdict(e), "t": round(e.at - t0, 3)} for e in result.timeline],
        "node_log": list(result.node_log),
    }
