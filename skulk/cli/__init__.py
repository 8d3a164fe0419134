"""The client commands of ``python -m skulk``: ``place``, ``ps``, ``nodes``, ``rm``, ``top``,
and the model commands ``pull``, ``models``, ``rm-model``.

They talk to a node's HTTP API (``--api URL``, else ``$SKULK_API``, else the local node at
``http://127.0.0.1:52415``) and print tables, or the server's JSON with ``--json``. See
``docs/cli.md``. Usage from an argparse parser::

    sub = parser.add_subparsers(dest="command", required=True)
    add_client_commands(sub)
    args = parser.parse_args()
    if args.command in CLIENT_COMMANDS:
        sys.exit(run_client_command(args))

The package imports only ``httpx``, ``rich`` (``top``, ``place --wait``, ``pull``) and the standard
library (no Trio, no model code), so the commands start quickly.
"""

from skulk.cli._args import CLIENT_COMMANDS, add_client_commands
from skulk.cli._commands import AmbiguousInstance, run_client_command
from skulk.cli._http import (
    DEFAULT_API,
    ApiClient,
    ApiRefused,
    ApiUnreachable,
    BadResponse,
    ClientError,
)

__all__ = [
    "CLIENT_COMMANDS",
    "DEFAULT_API",
    "AmbiguousInstance",
    "ApiClient",
    "ApiRefused",
    "ApiUnreachable",
    "BadResponse",
    "ClientError",
    "add_client_commands",
    "run_client_command",
]
