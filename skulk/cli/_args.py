"""The client commands' arguments (argparse), kept apart so that building the parser is cheap."""

from __future__ import annotations

import argparse

from skulk.cli._http import DEFAULT_API

#: The client subcommands, in the order ``--help`` lists them.
CLIENT_COMMANDS = ("place", "ps", "nodes", "rm", "top", "pull", "models", "rm-model")
SHARDINGS = ("single", "pipeline", "tensor")
#: ``--timeout`` unless given: one answer's deadline, and ``place --wait``'s whole wait.
DEFAULT_TIMEOUT = 30.0
DEFAULT_WAIT_TIMEOUT = 600.0
#: ``pull``'s ``--timeout`` unless given: the wait for each status line. The first comes once
#: the Hub check is done, which retries each Hub call with back-off (several minutes at worst).
DEFAULT_PULL_TIMEOUT = 300.0


def add_client_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``place``, ``ps``, ``nodes``, ``rm``, ``top``, ``pull``, ``models`` and
    ``rm-model`` to ``subparsers`` (the ``command`` dest); :func:`skulk.cli.run_client_command`
    runs the parsed result."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--api",
        metavar="URL",
        default=None,
        help=f"the node's HTTP API (default: $SKULK_API, else {DEFAULT_API})",
    )
    common.add_argument(
        "--api-key",
        metavar="KEY",
        default=None,
        help="the API key, for a node started with one (default: $SKULK_API_KEY; of a "
        "comma-separated list, the first)",
    )
    common.add_argument(
        "--json", action="store_true", help="print the server's JSON answer instead of a table"
    )
    common.add_argument(
        "--timeout",
        metavar="SECONDS",
        type=_positive_float,
        default=None,
        help=f"give up waiting for the answer after this long (default {DEFAULT_TIMEOUT:g}; "
        f"with place --wait, for the instance to be ready: default {DEFAULT_WAIT_TIMEOUT:g})",
    )

    place = subparsers.add_parser(
        "place",
        parents=[common],
        help="place an instance of a model on the cluster",
        description="Place an instance of MODEL: the leader picks nodes with enough free "
        "memory (or the ones given with --nodes) and commits it.",
    )
    place.add_argument("model", metavar="MODEL", help="a model name or path the node can resolve")
    place.add_argument(
        "--sharding", choices=SHARDINGS, default=None, help="how to split it (default single)"
    )
    place.add_argument(
        "--nodes",
        metavar="ID[,ID...]",
        type=_node_ids,
        action="append",
        default=[],
        help="place on these nodes, in rank order (repeatable)",
    )
    place.add_argument(
        "--exclude",
        metavar="ID[,ID...]",
        type=_node_ids,
        action="append",
        default=[],
        help="never use these nodes (repeatable)",
    )
    place.add_argument(
        "--min-nodes", metavar="N", type=_positive_int, default=None, help="use at least N nodes"
    )
    place.add_argument(
        "--max-nodes", metavar="N", type=_positive_int, default=None, help="use at most N nodes"
    )
    place.add_argument("--dry-run", action="store_true", help="show the plan; place nothing")
    place.add_argument(
        "--wait",
        action="store_true",
        help="follow the instance's runners until it is ready (a progress bar on a terminal); "
        "exit 1 if it fails, 3 if --timeout passes first",
    )

    ps = subparsers.add_parser(
        "ps",
        parents=[common],
        help="list instances and where they run",
        description="List the cluster's instances: model, sharding, status, and for each rank "
        "its node and its runner's phase.",
    )
    ps.add_argument("-q", "--quiet", action="store_true", help="print instance ids only")

    subparsers.add_parser(
        "nodes",
        parents=[common],
        help="list the cluster's nodes",
        description="List the nodes: committed status, host, API address, memory, CPUs, load "
        "and the age of their latest gossiped readings.",
    )

    rm = subparsers.add_parser(
        "rm",
        parents=[common],
        help="delete an instance (its runners stop)",
        description="Delete an instance everywhere. INSTANCE may be a unique prefix of its id.",
    )
    rm.add_argument("instance", metavar="INSTANCE", help="an instance id or a unique prefix")

    top = subparsers.add_parser(
        "top",
        parents=[common],
        help="a live view of the cluster's instances and nodes",
        description="Show, refreshed every second until Ctrl-C, each instance (phase, requests "
        "running/waiting, tokens/s, KV cache use, TTFT p50) and each node (health, memory, "
        "load).",
    )
    top.add_argument("--once", action="store_true", help="print one frame and exit")

    pull = subparsers.add_parser(
        "pull",
        parents=[common],
        help="pull a model from the Hugging Face Hub into the cluster",
        description="Pull ORG/REPO[@REVISION] from the Hugging Face Hub: the cluster checks it "
        "(it exists, mlx-lm loads it, a node has room), one node downloads it, the others "
        "fetch it from their peers. Progress on stderr (a bar on a terminal); with --json, "
        "the server's NDJSON status lines on stdout. --timeout bounds each wait for news "
        f"(default {DEFAULT_PULL_TIMEOUT:g}: the Hub check comes first; the pull itself may "
        "take much longer).",
    )
    pull.add_argument("model", metavar="ORG/REPO[@REVISION]", help="a Hub model id")

    subparsers.add_parser(
        "models",
        parents=[common],
        help="list the models: which nodes hold them, sizes, last use",
        description="List the cluster's models with their holders, and the models in this "
        "node's store (size, last use); then this node's store use and budget.",
    )

    rm_model = subparsers.add_parser(
        "rm-model",
        parents=[common],
        help="remove a model from this node's store",
        description="Remove MODEL (a name or a manifest sha256) from the model store of the "
        "node --api points at; refused while an instance uses it.",
    )
    rm_model.add_argument("model", metavar="MODEL", help="a stored model's name or sha256")


def flatten(groups: list[list[str]]) -> list[str]:
    """``--nodes a,b --nodes c`` (parsed as ``[["a", "b"], ["c"]]``) as ``["a", "b", "c"]``."""
    return [name for group in groups for name in group]


def _node_ids(value: str) -> list[str]:
    names = [part.strip() for part in value.split(",") if part.strip()]
    if not names:
        raise argparse.ArgumentTypeError(f"no node id in {value!r}")
    return names


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {number}")
    return number


def _positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, not {value}")
    return number
