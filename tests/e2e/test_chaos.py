"""The short chaos profile: one fixed seed's schedule (SIGKILL and restart of two nodes, the
founder among them, and two SIGSTOPs of one node past ``--node-down-after``) played against a
real 3-node cluster under ``openai`` and control load for 75 s; every checker must pass.

The checkers are honest: each fails its violation in ``tests/unit/test_chaos_checks.py``; here
they judge a real history. On failure the assertion message is the run's summary, with the
seed and each node's log tail, and ``python -m skulk.chaos replay`` of the schedule below
reproduces it.
"""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console

from skulk.chaos import execute, generate, print_summary

PROFILE_SEED = 4
PROFILE_SECONDS = 75.0


def test_short_chaos_profile_passes_every_check(skulk_home: Path) -> None:
    schedule = generate(PROFILE_SEED, 3, PROFILE_SECONDS)
    assert {e.kind for e in schedule.events} == {"kill", "pause"}
    result = execute(schedule, home=skulk_home, log=lambda _: None)
    out = io.StringIO()
    print_summary(result, Console(file=out, width=120))
    assert result.passed, out.getvalue() + "\nschedule:\n" + schedule.to_json()
    kinds = {f.kind for f in result.faults}
    assert kinds == {"kill", "pause"} and not any(f.problem for f in result.faults)
    assert {op.kind for op in result.ops} == {"chat", "stream", "place", "delete"}
    assert sum(op.outcome == "ok" for op in result.ops if op.kind in ("chat", "stream")) > 0
