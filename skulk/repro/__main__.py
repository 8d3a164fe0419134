"""``python -m skulk.repro list`` and ``python -m skulk.repro run NAME [--json] [--break NAME]
[--home DIR]``. Exit status: 0 if every check passed, 1 if one failed, 2 on a usage error."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from skulk.repro._scenarios import BREAKS, SCENARIOS, find_break, find_scenario


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m skulk.repro", description="Reproduce a runner hang and its recovery."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the scenarios and the deliberate breakages")
    run = sub.add_parser("run", help="run one scenario against real node processes")
    run.add_argument("name", choices=[s.name for s in SCENARIOS], metavar="NAME")
    run.add_argument("--json", action="store_true", help="print the result as JSON")
    run.add_argument(
        "--break",
        dest="breakage",
        choices=[b.name for b in BREAKS],
        default=None,
        metavar="NAME",
        help="start the nodes deliberately broken (a negative control: the run should fail)",
    )
    run.add_argument(
        "--home",
        type=Path,
        default=None,
        help="data dir to use and keep (default: a temporary one; sharing one saves "
        "generating the demo model each time)",
    )
    args = parser.parse_args(argv)

    if args.command == "list":
        width = max(len(s.name) for s in SCENARIOS)
        for s in SCENARIOS:
            print(f"{s.name:<{width}}  {s.description}")
        print("\ndeliberate breakages (run NAME --break BREAK):")
        for b in BREAKS:
            print(f"{b.name:<{width}}  {b.description}")
        return 0

    from skulk.repro._run import format_report, result_json, run_scenario

    breakage = find_break(args.breakage) if args.breakage else None
    result = run_scenario(find_scenario(args.name), home=args.home, breakage=breakage)
    if args.json:
        print(json.dumps(result_json(result), indent=2))
    else:
        print(format_report(result))
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
