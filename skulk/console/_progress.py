"""Progress bars of a node's long work on its terminal (see the package docstring)."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from typing import Literal, TextIO

import attrs
import trio
from rich.console import Console
from rich.file_proxy import FileProxy
from rich.filesize import decimal
from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn

from skulk.wire.telemetry import FetchProgress
from skulk.worker import ModelStatus

#: Seconds between two looks at the node's work.
SAMPLE_INTERVAL = 0.25
#: Model service states shown: a runner starting (``connecting`` to its group, ``loading``
#: layers, ``warming`` up). Until the runner reports its first layer the bar has no total.
STARTING_STATES = ("connecting", "loading", "warming")
#: How much of an instance id a label shows.
SHORT_ID = 12


@attrs.frozen
class ProgressItem:
    """One piece of long work: ``done`` of ``total`` ``unit`` (``bytes`` of weights fetched,
    ``layers`` loaded; ``total`` ``None`` while unknown); ``key`` names it from one look to the
    next."""

    key: str
    label: str
    done: int
    total: int | None
    unit: Literal["bytes", "layers"]

    @property
    def amount(self) -> str:
        """``1.2 GB/4.0 GB``, ``3/12 layers``, or ``starting`` while the total is unknown."""
        if self.total is None:
            return "starting"
        if self.unit == "bytes":
            return f"{decimal(self.done)}/{decimal(self.total)}"
        return f"{self.done}/{self.total} layers"


def progress_items(
    fetches: Iterable[FetchProgress], services: Iterable[tuple[str, int, ModelStatus]]
) -> list[ProgressItem]:
    """The long work of a node now: its weight fetches (from its fetch board) and its model
    services whose runner is starting (``(instance, rank, status)``; the others are not
    shown), fetches first, each in the order given."""
    items = [
        ProgressItem(
            f"fetch {f.instance}/{f.rank}",
            f"fetching weights of {f.instance[:SHORT_ID]} rank {f.rank}",
            f.bytes_done,
            f.bytes_total,
            "bytes",
        )
        for f in fetches
        if f.bytes_total > 0
    ]
    for instance, rank, status in services:
        if status.state not in STARTING_STATES:
            continue
        label = f"{status.state} {status.model_id} ({instance[:SHORT_ID]} rank {rank})"
        total = status.total if status.total > 0 else None
        done = status.total if status.state == "warming" else status.loaded
        items.append(ProgressItem(f"load {instance}/{rank}", label, done, total, "layers"))
    return items


class TerminalProgress:
    """One bar per :class:`ProgressItem` on ``stream`` (a terminal), drawn while there is
    work; call :meth:`update` with every look and :meth:`close` at the end. While bars are
    drawn, the root logger's handlers that write to ``stream`` print above them instead of
    through them."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._progress: Progress | None = None
        self._tasks: dict[str, TaskID] = {}
        self._moved: list[logging.StreamHandler[TextIO]] = []

    @property
    def showing(self) -> bool:
        """Whether bars are drawn now."""
        return self._progress is not None

    def update(self, items: Iterable[ProgressItem]) -> None:
        """Show ``items`` (new ones get a bar; a bar whose item is gone goes)."""
        listed = {item.key: item for item in items}
        if not listed:
            self.close()
            return
        progress = self._progress or self._start()
        for key in [k for k in self._tasks if k not in listed]:
            progress.remove_task(self._tasks.pop(key))
        for key, item in listed.items():
            task = self._tasks.get(key)
            if task is None:
                self._tasks[key] = progress.add_task(
                    item.label, total=item.total, completed=item.done, amount=item.amount
                )
            else:
                progress.update(
                    task,
                    description=item.label,
                    total=item.total,
                    completed=item.done,
                    amount=item.amount,
                )
        progress.refresh()

    def close(self) -> None:
        """Take the bars away (the terminal keeps what was logged above them)."""
        if self._progress is None:
            return
        self._progress.stop()
        self._progress = None
        self._tasks.clear()
        for handler in self._moved:
            handler.setStream(self._stream)
        self._moved.clear()

    def _start(self) -> Progress:
        console = Console(file=self._stream, force_terminal=True)
        progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            TaskProgressColumn(),
            TextColumn("{task.fields[amount]}"),
            console=console,
            transient=True,
            auto_refresh=False,
            redirect_stdout=False,
            redirect_stderr=False,
        )
        progress.start()
        above = FileProxy(console, self._stream)
        for handler in logging.getLogger().handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is self._stream:
                handler.setStream(above)
                self._moved.append(handler)
        self._progress = progress
        return progress


async def show_progress(
    sample: Callable[[], list[ProgressItem]],
    stream: TextIO | None = None,
    *,
    interval: float = SAMPLE_INTERVAL,
) -> None:
    """Draw ``sample()`` on ``stream`` (default stderr) every ``interval`` seconds, forever;
    returns at once when ``stream`` is not a terminal."""
    out = sys.stderr if stream is None else stream
    if not out.isatty():
        return
    bars = TerminalProgress(out)
    try:
        while True:
            bars.update(sample())
            await trio.sleep(interval)
    finally:
        bars.close()
