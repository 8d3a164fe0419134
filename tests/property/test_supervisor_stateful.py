"""Stateful properties of the restart policy, the breaker, and the Trio supervisor driving them.

The machine draws a policy and a seed, then interleaves time passing and crashes against the
pure :class:`CrashLoopBreaker`, checking every decision against an independent model. Along the
way it accumulates a script of child incarnations (how long each runs, whether it raises or
returns) and replays that script through a real :class:`Supervisor` under ``trio.run`` with a
``MockClock``, checking the supervisor's observed timeline against the pure breaker.
"""

from __future__ import annotations

import random

import pytest
import trio
import trio.testing
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from skulk.actors import (
    CrashLoopBreaker,
    CrashLoopError,
    Restart,
    RestartPolicy,
    Supervisor,
    Trip,
)

EPS = 1e-9

times = st.floats(min_value=0.0, max_value=20.0, allow_nan=False, allow_infinity=False)


@st.composite
def policies(draw: st.DrawFn) -> RestartPolicy:
    initial = draw(st.floats(0.0, 5.0))
    return RestartPolicy(
        initial_backoff=initial,
        max_backoff=initial + draw(st.floats(0.0, 30.0)),
        multiplier=draw(st.floats(1.0, 4.0)),
        jitter=draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
        max_restarts=draw(st.integers(0, 5)),
        window=draw(st.floats(0.5, 50.0)),
        reset_after=draw(st.none() | st.floats(0.5, 30.0)),
    )


class SupervisorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.policy = RestartPolicy()
        self.seed = 0
        self.breaker = CrashLoopBreaker(self.policy, random.Random(0))
        self.twin = random.Random(0)  # predicts the breaker's jitter draws
        self.now = 0.0
        self.crash_times: list[float] = []  # every crash fed in before the trip
        self.restart_times: list[float] = []  # crashes answered with Restart
        self.streak = 0
        self.last_base: float | None = None
        self.tripped = False
        self.script: list[tuple[float, bool]] = []  # (run_for, raises)

    @initialize(policy=policies(), seed=st.integers(0, 2**32 - 1))
    def setup(self, policy: RestartPolicy, seed: int) -> None:
        self.policy = policy
        self.seed = seed
        self.breaker = CrashLoopBreaker(policy, random.Random(seed))
        self.twin = random.Random(seed)

    # -- the pure breaker against a model --------------------------------------------------

    @rule(dt=times)
    def time_passes(self, dt: float) -> None:
        self.now += dt

    @rule(uptime=times)
    def crash(self, uptime: float) -> None:
        decision = self.breaker.record_crash(self.now, uptime=uptime)
        if self.tripped:
            assert isinstance(decision, Trip)
            return
        in_window = [t for t in [*self.crash_times, self.now] if t > self.now - self.policy.window]
        self.crash_times.append(self.now)
        if len(in_window) > self.policy.max_restarts:
            # trips exactly when more than max_restarts crashes fall in the window
            assert decision == Trip(crashes=len(in_window), window=self.policy.window)
            self.tripped = True
            return
        assert isinstance(decision, Restart)
        if uptime >= self.policy.stable_after:
            self.streak, self.last_base = 0, None
        base = self.policy.base_backoff(self.streak)
        if self.last_base is not None:
            assert base >= self.last_base  # monotone within a streak
        assert base <= self.policy.max_backoff
        expected = base
        if self.policy.jitter:
            expected = base * (1.0 - self.policy.jitter * self.twin.random())
        assert decision.delay == expected
        assert base * (1 - self.policy.jitter) - EPS <= decision.delay <= base + EPS
        self.streak += 1
        self.last_base = base
        assert decision.attempt == self.streak
        self.restart_times.append(self.now)

    @invariant()
    def restarts_stay_within_budget(self) -> None:
        for t in self.restart_times:
            recent = [r for r in self.restart_times if t - self.policy.window < r <= t]
            assert len(recent) <= self.policy.max_restarts

    @invariant()
    def tripped_agrees(self) -> None:
        assert self.breaker.tripped == self.tripped

    # -- the Trio supervisor against the pure breaker --------------------------------------

    @rule(run_for=times, raises=st.booleans())
    @precondition(lambda self: len(self.script) < 8)
    def add_incarnation(self, run_for: float, raises: bool) -> None:
        self.script.append((run_for, raises))

    @rule()
    @precondition(lambda self: bool(self.script))
    def supervisor_follows_the_breaker(self) -> None:
        expected_starts, expected_trip = self._predict()
        starts, trip = trio.run(
            self._run_supervisor, clock=trio.testing.MockClock(autojump_threshold=0)
        )
        assert starts == pytest.approx(expected_starts, rel=1e-9, abs=1e-9)
        if expected_trip is None:
            assert trip is None
        else:
            assert trip is not None
            assert (trip[0], trip[1]) == (expected_trip[0], expected_trip[1])
            assert trip[2] == pytest.approx(expected_trip[2], rel=1e-9, abs=1e-9)

    def _predict(self) -> tuple[list[float], tuple[int, float, float] | None]:
        breaker = CrashLoopBreaker(self.policy, random.Random(self.seed))
        t, starts = 0.0, []
        for run_for, _ in self.script:
            starts.append(t)
            t += run_for
            # Uptime as the supervisor measures it, a clock difference: (t0 + d) - t0 need not
            # equal d in floating point, which matters when d sits exactly on reset_after.
            decision = breaker.record_crash(t, uptime=t - starts[-1])
            if isinstance(decision, Trip):
                return starts, (decision.crashes, decision.window, t)
            t += decision.delay
        starts.append(t)  # the final incarnation idles until the test stops it
        return starts, None

    async def _run_supervisor(self) -> tuple[list[float], tuple[int, float, float] | None]:
        script = list(self.script)
        starts: list[float] = []
        done = trio.Event()

        async def child() -> None:
            index = len(starts)
            starts.append(trio.current_time())
            if index == len(script):
                done.set()
                await trio.sleep_forever()
            run_for, raises = script[index]
            await trio.sleep(run_for)
            if raises:
                raise RuntimeError(f"incarnation {index}")

        supervisor = Supervisor(policy=self.policy, rng=random.Random(self.seed))
        trip: tuple[int, float, float] | None = None
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(supervisor.run)
                supervisor.start_soon(child, name="child", restart="permanent")
                await done.wait()
                supervisor.stop()
        except* CrashLoopError as group:
            error = group.exceptions[0]
            assert isinstance(error, CrashLoopError)
            assert error.child_name == "child"
            trip = (error.crashes, error.window, trio.current_time())
        if trip is None:
            stats = supervisor.statistics().child("child")
            assert stats.restarts == stats.crashes == len(script)
        return starts, trip


SupervisorMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
test_supervisor_stateful = SupervisorMachine.TestCase


def test_uptime_exactly_at_reset_after_follows_the_clock() -> None:
    """Regression (found by this machine in CI): an incarnation that ran exactly
    ``reset_after`` seconds by the mock clock, where (t0 + d) - t0 < d in floating point."""
    machine = SupervisorMachine()
    machine.setup(
        policy=RestartPolicy(
            initial_backoff=1.0, max_backoff=2.0, multiplier=2.0, jitter=0.0, max_restarts=1,
            window=1.05, reset_after=None,
        ),
        seed=0,
    )  # fmt: skip
    machine.add_incarnation(raises=False, run_for=0.0)
    machine.add_incarnation(raises=False, run_for=1.05)
    machine.supervisor_follows_the_breaker()
