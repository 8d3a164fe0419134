"""A node that was paused itself (SIGSTOP, a suspended machine, a starved event loop) does not
blame its runner for the silence: whatever the runner sent meanwhile is unread in the socket.
The progress watchdog, waking well past its deadline, restarts the window once; a runner still
silent a full deadline later is wedged."""

from __future__ import annotations

import socket

import trio
import trio.testing

from skulk.runner import Runner, RunnerConfig, RunnerWedged
from skulk.runner._watchdog import PAUSE_SLACK

PROGRESS = 2.0


def busy_runner() -> Runner:
    runner = Runner("m", "/nowhere", RunnerConfig(progress_timeout=PROGRESS))
    runner._table.inflight["r"] = False  # one request active: the progress deadline holds
    runner._watchdog.last_progress = trio.current_time()
    return runner


async def watch(runner: Runner, failures: list[RunnerWedged]) -> None:
    try:
        await runner._watchdog.watch()
    except RunnerWedged as exc:
        failures.append(exc)


def kinds(runner: Runner) -> list[str]:
    return [e.kind for e in runner.flight_events()]


async def test_a_late_watchdog_restarts_the_window_instead_of_firing(
    mock_clock: trio.testing.MockClock,
) -> None:
    runner, failures = busy_runner(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, runner, failures)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(PROGRESS + PAUSE_SLACK + 3)  # the node was stopped meanwhile
        await trio.testing.wait_all_tasks_blocked()
        assert failures == [] and kinds(runner) == ["paused"]
        mock_clock.jump(PROGRESS - 0.1)  # a full window from the wake-up: still not wedged
        await trio.testing.wait_all_tasks_blocked()
        assert failures == []
        mock_clock.jump(0.2)  # on time now, and still silent: wedged
        await trio.testing.wait_all_tasks_blocked()
        assert len(failures) == 1 and "deadline" in kinds(runner)


async def test_only_once_per_silence(mock_clock: trio.testing.MockClock) -> None:
    runner, failures = busy_runner(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, runner, failures)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(PROGRESS + PAUSE_SLACK + 1)
        await trio.testing.wait_all_tasks_blocked()
        assert failures == []
        mock_clock.jump(PROGRESS + PAUSE_SLACK + 1)  # late again, and nothing came: wedged
        await trio.testing.wait_all_tasks_blocked()
        assert len(failures) == 1
    assert kinds(runner).count("paused") == 1


async def test_a_slightly_late_watchdog_fires(mock_clock: trio.testing.MockClock) -> None:
    runner, failures = busy_runner(), []
    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, runner, failures)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(PROGRESS + PAUSE_SLACK / 2)
        await trio.testing.wait_all_tasks_blocked()
        assert len(failures) == 1 and "paused" not in kinds(runner)


async def test_frames_waiting_unread_are_not_silence(mock_clock: trio.testing.MockClock) -> None:
    """On time, but the runner's bytes sit unread in the socket (the node's loop did not get to
    them): not wedged."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        runner, failures = busy_runner(), []
        runner._link.attach(ours)
        theirs.send(b"\0" * 8)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, runner, failures)
            await trio.testing.wait_all_tasks_blocked()
            mock_clock.jump(PROGRESS + 0.1)
            await trio.testing.wait_all_tasks_blocked()
            assert failures == []
            assert [e.detail for e in runner.flight_events()] == [
                "this node was paused: 8 bytes from the runner not read yet; its deadlines restart"
            ]
            nursery.cancel_scope.cancel()
