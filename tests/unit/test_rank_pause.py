"""The pause deadline of a rank (:mod:`skulk.runner._pause`): a process stopped by a signal is
seen stopped through the operating system, not through the runner's own loop, and fails the
rank ``runner_paused`` once stopped for its deadline; a process that resumes in time does not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
import trio

from skulk.runner import FlightRecorder, RunnerPaused
from skulk.runner._pause import PauseWatch, is_stopped, pause_deadline


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_the_deadline_stays_under_half_the_collective_deadline() -> None:
    assert pause_deadline(3.0, 20.0) == 3.0
    assert pause_deadline(3.0, 5.0) == 2.5
    assert pause_deadline(3.0, 0.0) == 3.0  # no collective deadline: the pause one as given
    assert pause_deadline(0.0, 20.0) == 0.0  # disabled


def test_a_stopped_process_is_seen_stopped_and_a_resumed_or_gone_one_is_not(
    sleeper: subprocess.Popen[bytes],
) -> None:
    assert not is_stopped(sleeper.pid)
    os.kill(sleeper.pid, signal.SIGSTOP)
    assert _eventually(lambda: is_stopped(sleeper.pid))
    os.kill(sleeper.pid, signal.SIGCONT)
    assert _eventually(lambda: not is_stopped(sleeper.pid))
    sleeper.kill()
    sleeper.wait()
    assert not is_stopped(sleeper.pid)


async def test_a_process_stopped_past_its_deadline_fails_the_rank_runner_paused(
    sleeper: subprocess.Popen[bytes],
) -> None:
    recorder = FlightRecorder()
    os.kill(sleeper.pid, signal.SIGSTOP)
    with trio.fail_after(30), pytest.raises(RunnerPaused) as caught:
        await PauseWatch("runner m#1", sleeper.pid, 0.5, recorder).watch()
    assert caught.value.reason == "runner_paused" and not caught.value.retryable
    assert f"pid {sleeper.pid}" in caught.value.message and "deadline 0.5s" in caught.value.message
    kinds = [e.kind for e in recorder.events()]
    assert kinds == ["stopped", "deadline"], kinds


async def test_a_process_that_resumes_in_time_is_not_blamed(
    sleeper: subprocess.Popen[bytes],
) -> None:
    """Stopped for a while, resumed before the deadline, stopped again: each stop counts from
    its own start, so no failure while no single stop lasts the deadline."""
    recorder = FlightRecorder()
    watch = PauseWatch("runner m#1", sleeper.pid, 60.0, recorder)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch.watch)
        for stops in (1, 2):
            os.kill(sleeper.pid, signal.SIGSTOP)
            await _until(lambda: _count(recorder, "stopped") == stops)  # noqa: B023
            os.kill(sleeper.pid, signal.SIGCONT)
            await _until(lambda: not is_stopped(sleeper.pid))
            await trio.sleep(0.6)  # the watch reads the state again: the stop is over
        nursery.cancel_scope.cancel()
    assert [e.kind for e in recorder.events()] == ["stopped", "stopped"]


def _count(recorder: FlightRecorder, kind: str) -> int:
    return sum(e.kind == kind for e in recorder.events())


def _eventually(check: Callable[[], bool]) -> bool:
    """``check()`` turns true within a few seconds (a signal is delivered asynchronously)."""
    for _ in range(200):
        if check():
            return True
        time.sleep(0.02)
    return False


async def _until(check: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        while not check():  # noqa: ASYNC110 - polling an outside process's state
            await trio.sleep(0.02)
