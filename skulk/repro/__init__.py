"""Hang repro scripts: ``python -m skulk.repro list`` and ``python -m skulk.repro run NAME``.

Each scenario reproduces one class of runner hang or failure against real
``python -m skulk serve`` processes started with a fault hook (``--runner-faults``) and short
deadlines — one node, or a cluster of them for the distributed classes (a rank stopped or
killed inside its compute group, a rank that never joins it, a serving node gone silent) —
sends real requests, and checks that the hang was detected (the request ended with the right
typed error within its deadline plus a margin) and that the system recovered (the node serves
again, the leader re-placed the instance, or, for a crash loop, the model is reported failed
while the node still answers), and that no process outlives the run. It prints the runners'
flight-recorder timeline and one PASS/FAIL line per check, and exits 0 only if every check
passed.

``--break NAME`` starts the nodes deliberately broken (a negative control): with
``--break progress-deadline`` the node has no progress deadline, so
``runner-wedged-mid-decode`` must fail — and still clean up after itself. Each distributed
class has its own (``list`` names them).
"""

from skulk.repro._recorder import is_runner, runner_children
from skulk.repro._run import format_report, result_json, run_scenario
from skulk.repro._scenario import Break, Check, Result, Scenario
from skulk.repro._scenarios import BREAKS, SCENARIOS, find_break, find_scenario

__all__ = [
    "BREAKS",
    "SCENARIOS",
    "Break",
    "Check",
    "Result",
    "Scenario",
    "find_break",
    "find_scenario",
    "format_report",
    "is_runner",
    "result_json",
    "run_scenario",
    "runner_children",
]
