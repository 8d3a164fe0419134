"""``python -m skulk.chaos run [--nodes N] [--minutes M] [--seed S] [--links] [--clock] [--disks]
[--out FILE] [--history FILE]`` and
``python -m skulk.chaos replay FILE``. Exit status: 0 if every check passed, 1 if one failed
(the schedule is then written to ``--out``, default ``chaos-SEED.json``), 2 on a usage error.
``--history FILE`` writes every operation and fault of the run as JSON, passed or not (to look
into an odd typed error afterwards)."""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

from skulk.chaos._history import history_json
from skulk.chaos._schedule import Schedule, ScheduleError, generate


def parse(argv: list[str] | None) -> tuple[Schedule, argparse.Namespace]:
    """The schedule the command line asks for, and the parsed arguments (``SystemExit`` 2 with
    the reason on a usage error or a bad schedule file)."""
    parser = argparse.ArgumentParser(
        prog="python -m skulk.chaos",
        description="Drive a real cluster through seeded faults under load, then check it.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="draw a schedule from a seed and run it")
    run.add_argument("--nodes", type=int, default=3, help="cluster size (default 3)")
    run.add_argument("--minutes", type=float, default=2.0, help="length of the run (default 2)")
    run.add_argument("--seed", type=int, default=None, help="schedule seed (default: random)")
    run.add_argument(
        "--overlap",
        action="store_true",
        help="let faults overlap (a fault starts every 1-6 s on a node no active fault holds)",
    )
    run.add_argument(
        "--leader",
        action="store_true",
        help="half the process faults hit whichever node leads when they fire",
    )
    run.add_argument(
        "--links",
        action="store_true",
        help="pass every inter-node link through a fault proxy and draw link faults too "
        "(cut, one-way, delay, bandwidth); runs in a private network namespace (Linux)",
    )
    run.add_argument(
        "--clock",
        action="store_true",
        help="draw clock faults too: a node's wall clock jumps up to an hour forward or back",
    )
    run.add_argument(
        "--disks",
        action="store_true",
        help="give each node a small data dir of its own and draw disk faults too (it fills "
        "up); runs in a private mount namespace (Linux)",
    )
    replay = sub.add_parser("replay", help="run a schedule file a failing run wrote")
    replay.add_argument("file", type=Path)
    for p in (run, replay):
        p.add_argument(
            "--out",
            type=Path,
            default=None,
            help="where a failing schedule is written (default chaos-SEED.json)",
        )
        p.add_argument(
            "--history",
            type=Path,
            default=None,
            help="write every operation and fault of the run to this JSON file",
        )
        p.add_argument(
            "--home",
            type=Path,
            default=None,
            help="data dir whose models/ holds the demo model (default: temporary)",
        )
    args = parser.parse_args(argv)

    if args.command == "run":
        if not 1 <= args.nodes <= 16 or args.minutes <= 0:
            parser.error("--nodes must be 1..16 and --minutes positive")
        if args.leader and args.overlap:
            parser.error("--leader faults are sequential: not with --overlap")
        seed = args.seed if args.seed is not None else secrets.randbelow(2**31)
        schedule = generate(
            seed,
            args.nodes,
            args.minutes * 60,
            links=args.links,
            clock=args.clock,
            disks=args.disks,
            overlap=args.overlap,
            leader=args.leader,
        )
    else:
        try:
            schedule = Schedule.from_json(args.file.read_text())
        except (OSError, ScheduleError) as exc:
            parser.error(f"{args.file}: {exc}")
    return schedule, args


def main(argv: list[str] | None = None) -> int:
    schedule, args = parse(argv)
    if schedule.links or schedule.disks:
        from skulk.chaos._namespace import NamespaceError, enter_private_namespaces

        try:
            enter_private_namespaces(network=schedule.links, mounts=schedule.disks)
        except (NamespaceError, OSError) as exc:
            print(f"chaos: link and disk faults need private namespaces: {exc}", file=sys.stderr)
            return 2

    from skulk.chaos._run import execute
    from skulk.chaos._summary import print_summary

    print(f"chaos: seed {schedule.seed}", flush=True)
    result = execute(schedule, home=args.home, log=lambda s: print(s, flush=True))
    print_summary(result)
    if args.history is not None:
        args.history.write_text(history_json(result.ops, result.faults))
        print(f"chaos: history written to {args.history}")
    if not result.passed:
        out = args.out or Path(f"chaos-{schedule.seed}.json")
        out.write_text(schedule.to_json())
        print(f"chaos: schedule written to {out}; replay: python -m skulk.chaos replay {out}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
