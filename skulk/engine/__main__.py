"""Entry point of a runner subprocess (started by the node, not by hand):

python -m skulk.engine --fd N --parent-pid P [--incarnation I] [--heartbeat-interval S]
                       [--load-timeout S]
"""

from __future__ import annotations

import argparse
import logging
import sys

from skulk.engine._main import main


def _cli() -> int:
    parser = argparse.ArgumentParser(prog="python -m skulk.engine")
    parser.add_argument("--fd", type=int, required=True, help="inherited socket to the node")
    parser.add_argument("--parent-pid", type=int, required=True, help="the node's pid")
    parser.add_argument("--incarnation", type=int, default=1, help="1 for the first runner")
    parser.add_argument("--heartbeat-interval", type=float, default=1.0, help="seconds")
    parser.add_argument(
        "--load-timeout",
        type=float,
        default=600.0,
        help="seconds a rank of a sharded instance waits for its peers to finish loading",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    return main(
        args.fd, args.parent_pid, args.incarnation, args.heartbeat_interval, args.load_timeout
    )


if __name__ == "__main__":
    sys.exit(_cli())
