"""Supervisor on a MockClock: backoff gaps, breaker escalation, cancellation, restart modes."""

from __future__ import annotations

import itertools
import random
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.testing

from skulk.actors import (
    ChildState,
    CrashLoopBreaker,
    CrashLoopError,
    Restart,
    RestartPolicy,
    Supervisor,
)

NO_JITTER = RestartPolicy(
    initial_backoff=1.0,
    max_backoff=4.0,
    multiplier=2.0,
    jitter=0.0,
    max_restarts=10,
    window=1000.0,
)


def crashing_child(
    starts: list[float], done: trio.Event, incarnations: int
) -> Callable[[], Awaitable[None]]:
    """A child that crashes ``incarnations - 1`` times, then signals ``done`` and idles."""

    async def child() -> None:
        starts.append(trio.current_time())
        if len(starts) == incarnations:
            done.set()
            await trio.sleep_forever()
        raise ValueError(f"crash {len(starts)}")

    return child


def gaps(starts: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(starts)]


async def test_backoff_gaps_without_jitter(autojump_clock: trio.testing.MockClock) -> None:
    starts: list[float] = []
    done = trio.Event()
    supervisor = Supervisor(policy=NO_JITTER, rng=random.Random(0))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        supervisor.start_soon(crashing_child(starts, done, 6), name="c")
        await done.wait()
        stats = supervisor.statistics()
        supervisor.stop()
    assert gaps(starts) == [1.0, 2.0, 4.0, 4.0, 4.0]
    child = stats.child("c")
    assert (child.restarts, child.crashes, child.state) == (5, 5, ChildState.RUNNING)
    assert child.last_error == repr(ValueError("crash 5"))
    assert (stats.total_restarts, stats.total_crashes, stats.children_alive) == (5, 5, 1)
    assert supervisor.statistics().child("c").state is ChildState.STOPPED
    assert not supervisor.statistics().running


async def test_backoff_gaps_with_seeded_jitter(autojump_clock: trio.testing.MockClock) -> None:
    policy = RestartPolicy(
        initial_backoff=1.0, max_backoff=8.0, jitter=0.5, max_restarts=10, window=1000.0
    )
    starts: list[float] = []
    done = trio.Event()
    supervisor = Supervisor(policy=policy, rng=random.Random(1234))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        supervisor.start_soon(crashing_child(starts, done, 6), name="c")
        await done.wait()
        supervisor.stop()
    # The same seed through the pure breaker predicts every gap.
    replay = CrashLoopBreaker(policy, random.Random(1234))
    expected = []
    for t in starts[:-1]:
        decision = replay.record_crash(t, uptime=0.0)
        assert isinstance(decision, Restart)
        expected.append(decision.delay)
    assert gaps(starts) == pytest.approx(expected)
    for k, gap in enumerate(gaps(starts)):
        base = policy.base_backoff(k)
        assert base * 0.5 - 1e-9 <= gap <= base + 1e-9
    assert len(set(gaps(starts))) == len(expected)  # jitter actually varied the delays


async def test_breaker_trip_escalates_to_parent(autojump_clock: trio.testing.MockClock) -> None:
    policy = RestartPolicy(
        initial_backoff=1.0, max_backoff=10.0, jitter=0.0, max_restarts=2, window=10.0
    )
    supervisor = Supervisor(policy=policy, rng=random.Random(0))
    sibling_cancelled = trio.Event()
    starts: list[float] = []

    async def sibling() -> None:
        try:
            await trio.sleep_forever()
        finally:
            sibling_cancelled.set()

    with pytest.RaisesGroup(CrashLoopError) as info:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            supervisor.start_soon(sibling, name="sibling")
            supervisor.start_soon(crashing_child(starts, trio.Event(), 99), name="looper")
    error = info.value.exceptions[0]
    assert isinstance(error, CrashLoopError)
    assert (error.child_name, error.crashes, error.window) == ("looper", 3, 10.0)
    assert isinstance(error.last_exception, ValueError)
    assert error.__cause__ is error.last_exception
    assert starts == [0.0, 1.0, 3.0]
    assert trio.current_time() == 3.0  # escalated at the third crash, no further wait
    assert sibling_cancelled.is_set()
    stats = supervisor.statistics()
    assert stats.child("looper").state is ChildState.FAILED
    assert stats.child("looper").restarts == 2
    assert stats.child("sibling").state is ChildState.STOPPED


async def test_run_raises_bare_crash_loop_error(autojump_clock: trio.testing.MockClock) -> None:
    supervisor = Supervisor(policy=RestartPolicy(max_restarts=0), rng=random.Random(0))

    async def boom() -> None:
        raise KeyError("x")

    async def start_child_later() -> None:
        await trio.testing.wait_all_tasks_blocked()
        supervisor.start_soon(boom, name="boom")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(start_child_later)
        with pytest.raises(CrashLoopError) as info:
            await supervisor.run()
    assert isinstance(info.value.last_exception, KeyError)
    assert info.value.crashes == 1


async def test_outside_cancellation_never_restarts(autojump_clock: trio.testing.MockClock) -> None:
    incarnations = 0

    async def child() -> None:
        nonlocal incarnations
        incarnations += 1
        await trio.sleep_forever()

    supervisor = Supervisor(policy=RestartPolicy(initial_backoff=0.0), rng=random.Random(0))
    with trio.move_on_after(5) as scope:
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            supervisor.start_soon(child, name="a", restart="permanent")
            supervisor.start_soon(child, name="b")
    assert scope.cancelled_caught
    assert incarnations == 2
    stats = supervisor.statistics()
    assert stats.total_restarts == 0 and stats.total_crashes == 0
    assert {c.state for c in stats.children} == {ChildState.STOPPED}


async def test_error_raised_while_cancelled_is_not_a_restart(
    autojump_clock: trio.testing.MockClock,
) -> None:
    incarnations = 0

    async def child() -> None:
        nonlocal incarnations
        incarnations += 1
        try:
            await trio.sleep_forever()
        finally:
            raise RuntimeError("cleanup failed")

    supervisor = Supervisor(policy=RestartPolicy(initial_backoff=0.0), rng=random.Random(0))
    with pytest.RaisesGroup(RuntimeError, flatten_subgroups=True):
        with trio.move_on_after(5):
            async with trio.open_nursery() as nursery:
                await nursery.start(supervisor.run)
                supervisor.start_soon(child, name="c", restart="permanent")
    assert incarnations == 1
    assert supervisor.statistics().total_restarts == 0


async def test_cancellation_during_backoff_never_restarts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    starts: list[float] = []
    policy = RestartPolicy(initial_backoff=10.0, max_backoff=10.0, jitter=0.0)
    supervisor = Supervisor(policy=policy, rng=random.Random(0))
    with trio.move_on_after(5):
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            supervisor.start_soon(crashing_child(starts, trio.Event(), 99), name="c")
            await trio.testing.wait_all_tasks_blocked()
            assert supervisor.statistics().child("c").state is ChildState.BACKING_OFF
    assert starts == [0.0]
    assert supervisor.statistics().child("c").restarts == 0


async def test_restart_modes(autojump_clock: trio.testing.MockClock) -> None:
    runs = {"transient": 0, "temporary": 0, "permanent": 0}
    permanent_done = trio.Event()

    async def returns(kind: str) -> None:
        runs[kind] += 1
        if kind == "permanent" and runs[kind] == 3:
            permanent_done.set()
            await trio.sleep_forever()

    async def raises(kind: str) -> None:
        runs[kind] += 1
        raise OSError("gone")

    supervisor = Supervisor(policy=NO_JITTER, rng=random.Random(0))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        supervisor.start_soon(returns, "transient", name="transient")
        supervisor.start_soon(raises, "temporary", name="temporary", restart="temporary")
        supervisor.start_soon(returns, "permanent", name="permanent", restart="permanent")
        await permanent_done.wait()
        stats = supervisor.statistics()
        supervisor.stop()
    assert runs == {"transient": 1, "temporary": 1, "permanent": 3}
    assert stats.child("transient").state is ChildState.STOPPED
    assert stats.child("transient").crashes == 0
    temporary = stats.child("temporary")
    assert (temporary.state, temporary.crashes, temporary.restarts) == (ChildState.STOPPED, 1, 0)
    assert temporary.last_error == repr(OSError("gone"))
    permanent = stats.child("permanent")
    assert (permanent.restarts, permanent.crashes, permanent.last_error) == (2, 2, None)
    assert trio.current_time() == 3.0  # permanent returns back off like crashes: 1 + 2


async def test_stop_child_stops_without_restart(autojump_clock: trio.testing.MockClock) -> None:
    incarnations = 0

    async def child() -> None:
        nonlocal incarnations
        incarnations += 1
        await trio.sleep_forever()

    supervisor = Supervisor(rng=random.Random(0))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        supervisor.start_soon(child, name="c", restart="permanent")
        with pytest.raises(ValueError, match="live child"):
            supervisor.start_soon(child, name="c")
        await trio.testing.wait_all_tasks_blocked()
        supervisor.stop_child("c")
        await trio.testing.wait_all_tasks_blocked()
        assert supervisor.statistics().child("c").state is ChildState.STOPPED
        assert incarnations == 1
        supervisor.stop_child("c")  # no-op
        supervisor.start_soon(child, name="c")  # the name is free again
        await trio.testing.wait_all_tasks_blocked()
        assert supervisor.statistics().child("c").state is ChildState.RUNNING
        with pytest.raises(KeyError):
            supervisor.stop_child("nope")
        supervisor.stop()
    assert incarnations == 2


async def test_start_waits_for_readiness_on_every_incarnation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    incarnations = 0
    crash = trio.Event()

    async def child(port: int, *, task_status: trio.TaskStatus[int]) -> None:
        nonlocal incarnations
        incarnations += 1
        await trio.sleep(2)  # initialising
        task_status.started(port + incarnations)
        await crash.wait()
        if incarnations == 1:
            raise ValueError("first incarnation dies")
        await trio.sleep_forever()

    supervisor = Supervisor(policy=NO_JITTER, rng=random.Random(0))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        assert await supervisor.start(child, 8000, name="srv") == 8001
        assert trio.current_time() == 2.0
        assert supervisor.statistics().child("srv").state is ChildState.RUNNING
        crash.set()
        await trio.sleep(1.5)  # backoff 1 s, then initialising again
        assert supervisor.statistics().child("srv").state is ChildState.STARTING
        await trio.sleep(2)  # ready again at 2 + 1 + 2 = 5
        assert supervisor.statistics().child("srv").state is ChildState.RUNNING
        assert incarnations == 2
        supervisor.stop()


async def test_failure_before_readiness_goes_to_the_starter(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def broken(*, task_status: trio.TaskStatus[None]) -> None:
        raise ConnectionError("cannot bind")

    async def quitter(*, task_status: trio.TaskStatus[None]) -> None:
        return

    supervisor = Supervisor(rng=random.Random(0))
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        with pytest.raises(ConnectionError):
            await supervisor.start(broken, name="b", restart="permanent")
        with pytest.raises(RuntimeError, match="before calling started"):
            await supervisor.start(quitter, name="q")
        stats = supervisor.statistics()
        assert stats.running and stats.children == () and stats.total_crashes == 0
        supervisor.stop()


async def test_misuse_is_refused() -> None:
    supervisor = Supervisor()

    async def child() -> None:
        await trio.sleep_forever()

    with pytest.raises(RuntimeError, match="not running"):
        supervisor.start_soon(child, name="c")
    with pytest.raises(RuntimeError, match="not running"):
        await supervisor.start(child, name="c")
    async with trio.open_nursery() as nursery:
        await nursery.start(supervisor.run)
        with pytest.raises(RuntimeError, match="already running"):
            await supervisor.run()
        with pytest.raises(ValueError, match="restart mode"):
            supervisor.start_soon(child, name="c", restart="sometimes")  # type: ignore[arg-type]
        supervisor.stop()
