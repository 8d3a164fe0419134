"""``serve``'s progress bars: which work is shown (pure), the bars on a terminal (log lines
printed above them, not through them), and nothing at all when stderr is not a terminal."""

from __future__ import annotations

import io
import logging
from collections.abc import Iterator
from functools import partial

import pytest
import trio

from skulk.console import ProgressItem, TerminalProgress, progress_items, show_progress
from skulk.wire.telemetry import FetchProgress
from skulk.worker import ModelStatus

INSTANCE = "3f2a9c1e0b7d99"


def test_fetches_and_loading_services_become_items() -> None:
    fetches = [FetchProgress(INSTANCE, 1, 2_500_000, 10_000_000), FetchProgress("x", 0, 0, 0)]
    services = [
        ("aa", 0, ModelStatus("skulk-demo", "loading", loaded=3, total=12)),
        ("bb", 1, ModelStatus("org/m", "warming", loaded=11, total=12)),
        ("cc", 0, ModelStatus("org/m", "ready", loaded=12, total=12)),
        ("dd", 0, ModelStatus("org/m", "connecting")),  # no layer reported yet
        ("ee", 0, ModelStatus("org/m", "resolving")),
        ("ff", 0, ModelStatus("org/m", "failed")),
    ]
    items = progress_items(fetches, services)
    assert items == [
        ProgressItem(
            f"fetch {INSTANCE}/1",
            "fetching weights of 3f2a9c1e0b7d rank 1",
            2_500_000,
            10_000_000,
            "bytes",
        ),
        ProgressItem("load aa/0", "loading skulk-demo (aa rank 0)", 3, 12, "layers"),
        ProgressItem("load bb/1", "warming org/m (bb rank 1)", 12, 12, "layers"),
        ProgressItem("load dd/0", "connecting org/m (dd rank 0)", 0, None, "layers"),
    ]
    amounts = [i.amount for i in items]
    assert amounts == ["2.5 MB/10.0 MB", "3/12 layers", "12/12 layers", "starting"]
    assert progress_items([], []) == []


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def logger_on(request: pytest.FixtureRequest) -> Iterator[Terminal]:
    """A terminal that the root logger's handler writes to, as ``serve`` sets it up."""
    screen = Terminal()
    handler = logging.StreamHandler(screen)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield screen
    finally:
        root.removeHandler(handler)


def load(done: int) -> ProgressItem:
    return ProgressItem("load a/0", "loading skulk-demo", done, 4, "layers")


def test_bars_come_and_go_with_the_work(logger_on: Terminal) -> None:
    bars = TerminalProgress(logger_on)
    bars.update([])
    assert not bars.showing and logger_on.getvalue() == ""
    bars.update([load(1)])
    assert bars.showing
    handler = next(
        h for h in logging.getLogger().handlers if isinstance(h, logging.StreamHandler)
        and h.stream is not logger_on and type(h.stream).__name__ == "FileProxy"
    )  # fmt: skip
    logging.getLogger("skulk.test").warning("a log line while loading")
    bars.update([load(3)])
    drawn = logger_on.getvalue()
    assert "loading skulk-demo" in drawn and "1/4 layers" in drawn and "3/4 layers" in drawn
    assert "a log line while loading" in drawn
    bars.update([])  # done: the bars go, the log writes straight to the terminal again
    assert not bars.showing and handler.stream is logger_on


def test_a_bar_whose_work_ended_goes(logger_on: Terminal) -> None:
    bars = TerminalProgress(logger_on)
    fetch = ProgressItem("fetch a/0", "fetching", 5, 10, "bytes")
    starting = ProgressItem("load a/0", "loading skulk-demo", 0, None, "layers")
    bars.update([fetch, starting])
    assert bars._progress is not None
    assert [t.total for t in bars._progress.tasks] == [10, None]  # None: a pulsing bar
    bars.update([load(2)])
    assert [(t.description, t.total) for t in bars._progress.tasks] == [
        ("loading skulk-demo", 4)
    ]
    bars.close()
    bars.close()  # twice is fine
    assert not bars.showing


async def test_show_progress_on_a_terminal_until_cancelled() -> None:
    screen = Terminal()
    looks: list[int] = []
    third = trio.Event()

    def sample() -> list[ProgressItem]:
        looks.append(1)
        if len(looks) == 3:
            third.set()
        return [load(min(len(looks), 4))]

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(show_progress, sample, screen, interval=0.01))
            await third.wait()
            nursery.cancel_scope.cancel()
    assert "loading skulk-demo" in screen.getvalue()


async def test_show_progress_draws_nothing_when_not_a_terminal() -> None:
    pipe = io.StringIO()
    looks: list[int] = []

    def sample() -> list[ProgressItem]:
        looks.append(1)
        return [load(1)]

    with trio.fail_after(5):
        await show_progress(sample, pipe)  # returns at once
    assert looks == [] and pipe.getvalue() == ""
