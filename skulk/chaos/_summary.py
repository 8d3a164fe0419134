"""The summary of a chaos run, as ``rich`` tables: the load held, the faults injected by kind,
the requests by outcome, the typed errors, what each link proxy carried (with ``links``), and
one row per checker (deadline misses, State divergences and strays among them)."""

from __future__ import annotations

from collections import Counter

from rich.console import Console
from rich.table import Table

from skulk.chaos._history import OUTCOMES
from skulk.chaos._run import RunResult


def summary_tables(result: RunResult) -> list[Table]:
    ops = result.ops
    load = Table(title=f"chaos run, seed {result.schedule.seed}")
    for col in ("nodes", "seconds", "operations", "ops/s", "request deadline"):
        load.add_column(col, justify="right")
    rate = len(ops) / result.load_s if result.load_s else 0.0
    load.add_row(str(result.schedule.nodes), f"{result.load_s:.0f}", str(len(ops)),
                 f"{rate:.1f}", f"{result.deadline:g}s")  # fmt: skip

    faults = Table(title="faults injected")
    faults.add_column("kind")
    faults.add_column("count", justify="right")
    faults.add_column("seconds", justify="right")
    faults.add_column("problems", justify="right")
    for kind in sorted({f.kind for f in result.faults}):
        of = [f for f in result.faults if f.kind == kind]
        total = sum((f.end or f.start) - f.start for f in of)
        faults.add_row(kind, str(len(of)), f"{total:.1f}", str(sum(bool(f.problem) for f in of)))

    outcomes = Table(title="operations by outcome")
    outcomes.add_column("kind")
    for outcome in OUTCOMES:
        outcomes.add_column(outcome, justify="right")
    outcomes.add_column("p50 s", justify="right")
    outcomes.add_column("max s", justify="right")
    for kind in ("chat", "stream", "place", "delete"):
        done = [op for op in ops if op.kind == kind]
        if not done:
            continue
        counts = Counter(op.outcome for op in done)
        took = sorted(op.took for op in done)
        outcomes.add_row(kind, *(str(counts.get(o, 0)) for o in OUTCOMES),
                         f"{took[len(took) // 2]:.2f}", f"{took[-1]:.2f}")  # fmt: skip

    errors = Table(title="typed errors")
    errors.add_column("kind")
    errors.add_column("status")
    errors.add_column("code")
    errors.add_column("count", justify="right")
    counted = Counter((op.kind, op.status, op.code) for op in ops if op.outcome != "ok")
    for (kind, status, code), n in sorted(counted.items(), key=lambda kv: (-kv[1], str(kv[0]))):
        errors.add_row(kind, str(status or "-"), str(code or "-"), str(n))

    links = Table(title="link proxies (dialer -> target)")
    for col in ("link", "connections", "refused", "bytes forward", "bytes back"):
        links.add_column(col, justify="right")
    for (a, b), st in sorted(result.links.items()):
        links.add_row(f"{a}->{b}", str(st.connections), str(st.refused),
                      str(st.bytes_forward), str(st.bytes_back))  # fmt: skip

    checks = Table(title="checks")
    checks.add_column("check")
    checks.add_column("result")
    checks.add_column("violations", justify="right")
    checks.add_column("detail")
    for c in result.checks:
        detail = "\n".join([c.detail, *c.examples])
        checks.add_row(c.name, "PASS" if c.passed else "FAIL", str(c.violations), detail)
    tables = [load, faults, outcomes, errors]
    return [*tables, links, checks] if result.links else [*tables, checks]


def print_summary(result: RunResult, console: Console | None = None) -> None:
    console = console or Console()
    for table in summary_tables(result):
        console.print(table)
    if result.problem:
        console.print(f"[bold red]run failed:[/] {result.problem}")
    for fault in (f for f in result.faults if f.problem):  # e.g. a restart that never listened
        console.print(f"--- {fault.kind} of node {fault.node}: problem ---", markup=False)
        console.print(fault.problem, markup=False, highlight=False)
    for index, lines in result.logs.items():
        console.print(f"--- node {index} log tail ---", markup=False)
        console.print("\n".join(lines[-15:]), markup=False, highlight=False)
    verdict = "PASS" if result.passed else "FAIL"
    console.print(f"chaos: {verdict} (seed {result.schedule.seed})", markup=False)
