"""How ``place --wait`` shows its progress on stderr (stdout keeps the result alone).

On a terminal, a rich progress bar (the instance's fraction, its ranks' phases, the time
spent); elsewhere (a log, a pipe) one plain line each time the ranks' phases change, so the
log stays readable and nothing is redrawn.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from skulk.cli._wait import WaitView

#: The bar's total: views are drawn in per mille.
STEPS = 1000


@contextlib.contextmanager
def wait_reporter(
    stream: TextIO, instance: str, *, terminal: bool | None = None
) -> Iterator[Callable[[WaitView], None]]:
    """A reporter of :class:`WaitView` values on ``stream``: a bar when ``stream`` is a
    terminal (``terminal`` overrides the check), else a line per change of summary."""
    is_tty = stream.isatty() if terminal is None else terminal
    if not is_tty:
        last: list[str] = []

        def line(view: WaitView) -> None:
            shown = view.failure or view.summary
            if last != [shown]:
                last[:] = [shown]
                print(f"{instance}: {shown}", file=stream, flush=True)

        yield line
        return
    console = Console(file=stream, force_terminal=True)
    with Progress(
        TextColumn("[bold]{task.fields[instance]}"),
        BarColumn(),
        TextColumn("{task.percentage:>3.0f}%"),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as bar:
        task = bar.add_task("starting", total=STEPS, instance=instance)

        def draw(view: WaitView) -> None:
            bar.update(
                task,
                completed=round(view.fraction * STEPS),
                description=view.failure or view.summary,
            )

        yield draw
