"""``python -m skulk top``'s loop: fetch the two answers, draw the frame, once a second.

The frame itself is :func:`skulk.cli._top.top_frame` (pure). Here: the requests, the clock
and the terminal. ``--once`` prints one frame and exits (its errors are the other commands':
one line on stderr, exit 1 or 2); the live view keeps going when the API stops answering,
showing why, until Ctrl-C (exit 0).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Mapping

from rich.console import Console, RenderableType
from rich.live import Live

from skulk.cli._commands import _objects
from skulk.cli._http import ApiClient, ClientError
from skulk.cli._tables import JsonObject
from skulk.cli._top import error_frame, top_frame

#: Seconds between two frames.
REFRESH_INTERVAL = 1.0
#: Columns a frame gets at least when stdout is not a terminal (more if ``$COLUMNS`` says so):
#: wide enough that no cell is cut.
PIPE_WIDTH = 200


def fetch(client: ApiClient) -> tuple[list[JsonObject], list[JsonObject]]:
    """The cluster's instances and nodes (``GET /v1/instances``, ``GET /v1/cluster/nodes``)."""
    return (
        _objects(client.get("/v1/instances"), "instances", client.api + "/v1/instances"),
        _objects(client.get("/v1/cluster/nodes"), "nodes", client.api + "/v1/cluster/nodes"),
    )


def title(api: str) -> str:
    return f"skulk top  {api}  {time.strftime('%H:%M:%S')}"


def frame(client: ApiClient) -> RenderableType:
    """One frame of the live view; an API that does not answer is shown, not raised."""
    try:
        instances, nodes = fetch(client)
    except ClientError as exc:
        return error_frame(f"{exc.describe()} (retrying)", title=title(client.api))
    return top_frame(instances, nodes, title=title(client.api))


def run_top(
    client: ApiClient,
    *,
    once: bool,
    as_json: bool,
    environ: Mapping[str, str],
    sleep: Callable[[float], None] = time.sleep,
    console: Console | None = None,
) -> int:
    """Run ``top``: one frame (``once``; ``as_json`` prints both answers instead), or frames
    every :data:`REFRESH_INTERVAL` until Ctrl-C. ``console`` replaces stdout's (tests)."""
    if once or as_json:
        instances, nodes = fetch(client)  # a ClientError here is the command's error
        if as_json:
            print(json.dumps({"instances": instances, "nodes": nodes}, indent=2))
            return 0
        console = console or _console(environ)
        console.print(top_frame(instances, nodes, title=title(client.api)))
        return 0
    console = console or _console(environ)
    try:
        with Live(frame(client), console=console, auto_refresh=False, screen=False) as live:
            while True:
                sleep(REFRESH_INTERVAL)
                live.update(frame(client), refresh=True)
    except KeyboardInterrupt:  # the usual way out of a live view
        pass
    return 0


def _console(environ: Mapping[str, str]) -> Console:
    if sys.stdout.isatty():
        return Console()
    columns = environ.get("COLUMNS", "")
    width = max(int(columns), PIPE_WIDTH) if columns.isdigit() else PIPE_WIDTH
    return Console(width=width, no_color=True)
