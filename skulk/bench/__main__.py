"""``python -m skulk.bench serve [--json] [--max-tokens N] [--repeats N] [--stream-interval S]
[--home DIR]``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m skulk.bench")
    sub = parser.add_subparsers(dest="bench", required=True)
    serve = sub.add_parser("serve", help="HTTP API streaming vs in-process mlx-lm")
    serve.add_argument("--json", action="store_true", help="print only the JSON result")
    serve.add_argument("--max-tokens", type=int, default=256)
    serve.add_argument(
        "--repeats", type=int, default=15, help="interleaved pairs of runs (default 15)"
    )
    serve.add_argument(
        "--stream-interval",
        type=float,
        default=None,
        help="pass --stream-interval to the node (default: the node's own default)",
    )
    serve.add_argument(
        "--home", type=Path, default=None, help="data dir to use (default: a temporary one)"
    )
    args = parser.parse_args(argv)

    from skulk.bench._serve import run, table

    result = run(args.max_tokens, args.repeats, args.home, args.stream_interval)
    if args.json:
        print(json.dumps(result))
    else:
        print(table(result))
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
