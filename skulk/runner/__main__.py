"""Entry point of a runner subprocess: ``python -m skulk.runner --fd N``."""

from __future__ import annotations

import argparse
import logging
import sys

from skulk.runner._child import main


def _cli() -> int:
    parser = argparse.ArgumentParser(prog="python -m skulk.runner")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the node")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    return main(args.fd)


if __name__ == "__main__":
    sys.exit(_cli())
