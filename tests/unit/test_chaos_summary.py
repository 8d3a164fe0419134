"""The chaos summary renders every table from a run's result: load, faults by kind, operations
by outcome, typed errors, link proxies (with links) and one row per checker with its verdict."""

from __future__ import annotations

import io

from rich.console import Console

from skulk.chaos import (
    FaultRecord,
    Final,
    NodeFinal,
    Op,
    ProxyStatistics,
    RunResult,
    Schedule,
    check_all,
    print_summary,
)


def test_the_summary_shows_faults_outcomes_links_and_a_failing_check() -> None:
    ops = (
        Op("stream", 1, 0.0, 1.0, "ok", status=200, text="ab"),
        Op("chat", 2, 0.0, 2.0, "error", status=503, code="model_not_ready"),
        Op("chat", 3, 0.0, 90.0, "timeout", code="APITimeoutError"),
        Op("place", 1, 0.0, 0.5, "ok", status=201, instance="i1"),
    )
    faults = (FaultRecord("kill", 2, 10.0, 15.0), FaultRecord("cut", 1, 20.0, 22.0))
    final = Final(tuple(NodeFinal(i, True, 1.0, 5, "h", 1, 1) for i in (1, 2, 3)), 0.5, ("i1",), ())
    checks = tuple(check_all(list(ops), list(faults), final, deadline=43, converge_bound=30,
                             healthy_bound=90))  # fmt: skip
    result = RunResult(Schedule(9, 3, 60.0, (), links=True), checks, ops, faults, final, 90.0,
                       43.0, links={(1, 2): ProxyStatistics(3, 1, 2, 1000, 2000)})  # fmt: skip
    out = io.StringIO()
    print_summary(result, Console(file=out, width=200))
    text = out.getvalue()
    for needle in ("seed 9", "kill", "cut", "model_not_ready", "1->2", "2000", "deadlines",
                   "FAIL", "chaos: FAIL (seed 9)"):  # fmt: skip
        assert needle in text, needle
    assert not result.passed
