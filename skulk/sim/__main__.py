"""``python -m skulk.sim``: run seeds, scenarios, mutants and repro files.

::

    python -m skulk.sim run --seeds 0:200 [--nodes 5] [--steps 2000] [--mutant NAME]
                            [--jobs 2] [--json] [--repro-dir DIR]
    python -m skulk.sim scenario NAME|all [--json]
    python -m skulk.sim mutants
    python -m skulk.sim replay FILE [--json]

Exit status: 0 when everything held; 1 on a violation (``run``: a repro file is written for
each failing seed), a failed scenario, or (``replay``) a reproduced violation; 2 on a usage
error; 3 when ``replay`` did not reproduce the recorded trace hash and outcome.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import attrs

from skulk.sim._config import ConfigError, SimConfig
from skulk.sim._mutants import MUTANTS, UnknownMutant, find_mutant
from skulk.sim._repro import ReproError, load_repro, replay, write_repro
from skulk.sim._run import RunResult, run_seed
from skulk.sim._scenario import (
    ScenarioResult,
    find_scenario,
    load_scenario,
    run_scenario,
    scenario_paths,
)
from skulk.sim._scenariochecks import ScenarioError


class UsageError(ValueError):
    pass


def parse_seeds(text: str) -> range:
    """``"A:B"`` (B excluded) or a single seed ``"N"``."""
    try:
        if ":" in text:
            a, b = text.split(":", 1)
            seeds = range(int(a), int(b))
        else:
            seeds = range(int(text), int(text) + 1)
    except ValueError:
        raise UsageError(f"--seeds: expected A:B or N, got {text!r}") from None
    if not seeds:
        raise UsageError(f"--seeds {text}: empty range")
    return seeds


def _run_one(job: tuple[int, dict[str, Any], str]) -> RunResult:
    seed, config, mutant = job
    return run_seed(seed, SimConfig.from_json(config), mutant=find_mutant(mutant))


def _results(seeds: range, config: SimConfig, mutant: str, jobs: int) -> Iterator[RunResult]:
    work = [(s, config.to_json(), mutant) for s in seeds]
    if jobs <= 1:
        yield from map(_run_one, work)
        return
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(_run_one, work, chunksize=4)


def cmd_run(args: argparse.Namespace) -> int:
    seeds = parse_seeds(args.seeds)
    changes: dict[str, Any] = {}
    if args.nodes is not None:
        changes["nodes"] = args.nodes
    if args.steps is not None:
        changes["steps"] = args.steps
    config = SimConfig.from_json(changes)
    mutant = find_mutant(args.mutant)
    started = time.monotonic()
    failures: list[tuple[RunResult, Path]] = []
    summaries = []
    for result in _results(seeds, config, mutant.name, args.jobs):
        summaries.append(result.summary())
        if not result.ok:
            name = f"skulk-sim-repro-seed{result.seed}"
            if mutant.name != "none":
                name += f"-{mutant.name}"
            path = write_repro(result, args.repro_dir / f"{name}.json")
            failures.append((result, path))
        if not args.json:
            status = "ok" if result.ok else f"VIOLATION {result.violation}"
            print(f"seed {result.seed} {result.trace_hash} {status}", flush=True)
    elapsed = time.monotonic() - started
    names: dict[str, int] = {}
    for r, _ in failures:
        assert r.violation is not None
        names[r.violation.name] = names.get(r.violation.name, 0) + 1
    if args.json:
        print(
            json.dumps(
                {
                    "seeds": summaries,
                    "mutant": mutant.name,
                    "violations": len(failures),
                    "by_invariant": names,
                    "repro_files": [str(p) for _, p in failures],
                    "seconds": round(elapsed, 1),
                },
                indent=1,
            )
        )
    else:
        acks = sum(s["acks"] for s in summaries)
        print(
            f"{len(summaries)} seed(s), {len(failures)} with a violation "
            f"{dict(sorted(names.items())) if names else ''}; {acks} commands acknowledged; "
            f"{elapsed:.1f} s"
        )
        for r, path in failures:
            print(f"repro for seed {r.seed}: python -m skulk.sim replay {path}")
    return 1 if failures else 0


def _scenario_json(res: ScenarioResult) -> dict[str, Any]:
    return {
        "name": res.scenario.name,
        "passed": res.passed,
        "expected": res.scenario.outcome,
        "reason": res.reason,
        "trace_hash": res.run.trace_hash,
        "checks": [{"check": c.check.label(), "ok": c.ok, "detail": c.detail} for c in res.checks],
    }


def cmd_scenario(args: argparse.Namespace) -> int:
    if args.name == "all":
        scenarios = [load_scenario(p) for p in scenario_paths()]
    else:
        scenarios = [find_scenario(args.name)]
    results = []
    with ExitStack() as stack:
        sink = _trace_file(args.trace, stack)
        for sc in scenarios:
            res = run_scenario(sc, trace_sink=sink)
            results.append(res)
            if not args.json:
                print(f"{'PASS' if res.passed else 'FAIL'} {sc.name}: {res.reason}", flush=True)
                for c in res.checks:
                    if not c.ok or args.name != "all":
                        print(f"    {'ok ' if c.ok else 'BAD'} {c.check.label()}: {c.detail}")
    failed = [r for r in results if not r.passed]
    if args.json:
        print(json.dumps([_scenario_json(r) for r in results], indent=1))
    else:
        print(f"{len(results) - len(failed)}/{len(results)} scenario(s) passed")
    return 1 if failed else 0


def _trace_file(path: Path | None, stack: ExitStack) -> Callable[[str], None] | None:
    """A sink writing every trace line to ``path`` (None: no sink), closed with ``stack``."""
    if path is None:
        return None
    out = stack.enter_context(path.open("w"))
    return lambda line: print(line, file=out)


def cmd_mutants(args: argparse.Namespace) -> int:
    for m in MUTANTS.values():
        print(f"{m.name}  {m.description}")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    repro = load_repro(args.file)
    with ExitStack() as stack:
        result = replay(repro, trace_sink=_trace_file(args.trace, stack))
    same_hash = result.trace_hash == repro.trace_hash
    same_outcome = result.violation == repro.violation
    if args.json:
        print(
            json.dumps(
                {
                    **result.summary(),
                    "recorded_trace_hash": repro.trace_hash,
                    "recorded_violation": attrs.asdict(repro.violation)
                    if repro.violation
                    else None,
                    "reproduced": same_hash and same_outcome,
                },
                indent=1,
            )
        )
    else:
        print(f"seed {result.seed} mutant {result.mutant}: {result.trace_hash}")
        print(f"violation: {result.violation or 'none'}")
        recorded = f"{repro.trace_hash}, {repro.violation or 'no violation'}"
        print(
            "reproduced exactly"
            if same_hash and same_outcome
            else f"NOT reproduced (recorded {recorded})"
        )
        if result.violation:
            print("last trace lines:")
            for line in result.trace_tail[-25:]:
                print(f"    {line}")
    if not (same_hash and same_outcome):
        return 3
    return 1 if result.violation else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m skulk.sim",
        description="Deterministic fault-injection simulation of a Skulk Raft cluster.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a range of seeds with random faults")
    run.add_argument("--seeds", required=True, help="A:B (B excluded) or N")
    run.add_argument(
        "--nodes", type=int, default=None, help="cluster size (half the seeds run 3 if larger)"
    )
    run.add_argument("--steps", type=int, default=None, help="ticks per seed")
    run.add_argument("--mutant", default=None, help="a negative control (see `mutants`)")
    run.add_argument("--jobs", type=int, default=1, help="worker processes")
    run.add_argument("--json", action="store_true")
    run.add_argument("--repro-dir", type=Path, default=Path("."))
    scen = sub.add_parser("scenario", help="run a named scenario from specs/scenarios, or all")
    scen.add_argument("name")
    scen.add_argument("--json", action="store_true")
    scen.add_argument("--trace", type=Path, default=None, help="write every trace line here")
    sub.add_parser("mutants", help="list the negative controls")
    rep = sub.add_parser("replay", help="replay a repro file")
    rep.add_argument("file", type=Path)
    rep.add_argument("--json", action="store_true")
    rep.add_argument("--trace", type=Path, default=None, help="write every trace line here")
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            return cmd_run(args)
        if args.command == "scenario":
            return cmd_scenario(args)
        if args.command == "mutants":
            return cmd_mutants(args)
        return cmd_replay(args)
    except (UsageError, ConfigError, UnknownMutant, ScenarioError, ReproError) as exc:
        print(f"python -m skulk.sim: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
