"""Command line: ``python -m skulk serve``, ``python -m skulk demo-model --out DIR``, and the
client commands over a node's API: ``place MODEL``, ``ps``, ``nodes``, ``rm INSTANCE``, ``top``
(docs/cli.md)."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
from pathlib import Path

from skulk.cli import CLIENT_COMMANDS, add_client_commands, run_client_command


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m skulk", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_p = sub.add_parser("serve", help="run a node and its HTTP API")
    # skulk.config imports Trio and the runner: only pay for it when it can be needed, so
    # that the client commands (`ps`, ...) start quickly.
    if _first_word(argv) not in CLIENT_COMMANDS:
        from skulk.config import add_serve_arguments

        add_serve_arguments(serve_p)
    demo_p = sub.add_parser("demo-model", help="write the built-in demo model to a directory")
    demo_p.add_argument("--out", type=Path, required=True, help="directory to create")
    demo_p.add_argument("--seed", type=int, default=None, help="generation seed")
    add_client_commands(sub)
    args = parser.parse_args(argv)

    if args.command in CLIENT_COMMANDS:
        return run_client_command(args)

    if args.command == "demo-model":
        from skulk.models import DEFAULT_DEMO_SEED, write_demo_model

        seed = DEFAULT_DEMO_SEED if args.seed is None else args.seed
        path = write_demo_model(args.out, seed=seed)
        print(f"wrote skulk-demo (seed {seed}) to {path}")
        return 0

    from skulk.config import serve_config

    try:
        config = serve_config(args, os.environ)
    except ValueError as exc:
        parser.error(str(exc))
    from skulk.models import DEMO_MODEL_ID, ModelNotFound, resolve_model

    if config.model not in (DEMO_MODEL_ID, "none"):  # fail fast on a typo (the demo is slow)
        try:
            resolve_model(config.model, config.home)
        except ModelNotFound as exc:
            parser.error(str(exc))
    from skulk.tracing import configure_logging

    # text: "TIME LEVEL LOGGER [REQUEST_ID]: MESSAGE"; json: one object per line (skulk.tracing)
    configure_logging(config.log_level, "json" if config.log_format == "json" else "text")
    # `kill -USR1 PID` writes every thread's Python stack to stderr: what a node that seems
    # stuck is doing, without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    import trio

    from skulk.consensus import StorageCorrupt
    from skulk.identity import IdentityError
    from skulk.serve import StartupError, leaves, serve

    problems: list[BaseException] = []
    try:
        trio.run(serve, config)
    except* (StartupError, IdentityError, StorageCorrupt) as group:
        problems.extend(leaves(group))
    for problem in problems:
        print(f"skulk: cannot start: {problem}", file=sys.stderr)
    return 2 if problems else 0


def _first_word(argv: list[str]) -> str | None:
    """The subcommand's name in ``argv`` (the top-level parser takes no option with a value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


if __name__ == "__main__":
    sys.exit(main())
