"""The sans-IO restart policy and crash-loop breaker, without Trio."""

from __future__ import annotations

import math
import random

import pytest

from skulk.actors import (
    Cooldown,
    CooldownPolicy,
    CrashLoopBreaker,
    HalfOpenBreaker,
    Restart,
    RestartPolicy,
    Trip,
)


def test_base_backoff_doubles_then_caps() -> None:
    policy = RestartPolicy(initial_backoff=1.0, max_backoff=10.0, multiplier=2.0, jitter=0.0)
    assert [policy.base_backoff(k) for k in range(6)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_base_backoff_survives_huge_exponents() -> None:
    policy = RestartPolicy(initial_backoff=1.0, max_backoff=5.0, multiplier=10.0)
    assert policy.base_backoff(10_000) == 5.0


def test_jitter_only_shortens_within_the_fraction() -> None:
    policy = RestartPolicy(initial_backoff=1.0, max_backoff=8.0, jitter=0.25)
    rng = random.Random(7)
    for k in range(50):
        base = policy.base_backoff(k % 6)
        delay = policy.backoff(k % 6, rng)
        assert base * 0.75 <= delay <= base


def test_jitter_is_reproducible_from_the_seed() -> None:
    policy = RestartPolicy(initial_backoff=1.0, jitter=0.5)
    first = [policy.backoff(k, random.Random(42)) for k in range(5)]
    again = [policy.backoff(k, random.Random(42)) for k in range(5)]
    assert first == again
    expected_u = random.Random(42).random()
    assert first[0] == pytest.approx(1.0 * (1 - 0.5 * expected_u))


def test_zero_jitter_draws_nothing_from_the_rng() -> None:
    rng = random.Random(3)
    state = rng.getstate()
    RestartPolicy(jitter=0.0).backoff(2, rng)
    assert rng.getstate() == state


def test_breaker_restarts_with_growing_delays_then_trips() -> None:
    policy = RestartPolicy(
        initial_backoff=1.0, max_backoff=4.0, jitter=0.0, max_restarts=3, window=100.0
    )
    breaker = CrashLoopBreaker(policy, random.Random(0))
    assert breaker.record_crash(0.0, uptime=0.0) == Restart(delay=1.0, attempt=1)
    assert breaker.record_crash(1.0, uptime=0.0) == Restart(delay=2.0, attempt=2)
    assert breaker.record_crash(3.0, uptime=0.0) == Restart(delay=4.0, attempt=3)
    assert not breaker.tripped
    assert breaker.record_crash(7.0, uptime=0.0) == Trip(crashes=4, window=100.0)
    assert breaker.tripped
    # Once tripped it stays tripped.
    assert breaker.record_crash(1000.0, uptime=500.0) == Trip(crashes=4, window=100.0)


def test_crashes_leaving_the_window_free_budget() -> None:
    policy = RestartPolicy(initial_backoff=0.0, jitter=0.0, max_restarts=2, window=10.0)
    breaker = CrashLoopBreaker(policy, random.Random(0))
    assert isinstance(breaker.record_crash(0.0, uptime=0.0), Restart)
    assert isinstance(breaker.record_crash(5.0, uptime=0.0), Restart)
    # The window is half-open (now - window, now]: the crash at 0.0 is out at 10.0.
    assert isinstance(breaker.record_crash(10.0, uptime=0.0), Restart)
    assert breaker.crash_times == (5.0, 10.0)
    assert breaker.record_crash(14.0, uptime=0.0) == Trip(crashes=3, window=10.0)


def test_zero_max_restarts_trips_on_the_first_crash() -> None:
    breaker = CrashLoopBreaker(RestartPolicy(max_restarts=0), random.Random(0))
    assert breaker.record_crash(0.0, uptime=5.0) == Trip(crashes=1, window=60.0)


def test_stable_run_resets_the_streak() -> None:
    policy = RestartPolicy(
        initial_backoff=1.0, jitter=0.0, max_restarts=100, window=1000.0, reset_after=30.0
    )
    breaker = CrashLoopBreaker(policy, random.Random(0))
    delays = []
    for now, uptime in [(0, 0), (1, 0), (3, 0), (50, 43), (51, 0)]:
        decision = breaker.record_crash(float(now), uptime=float(uptime))
        assert isinstance(decision, Restart)
        delays.append(decision.delay)
    assert delays == [1.0, 2.0, 4.0, 1.0, 2.0]
    assert breaker.streak == 2


def test_stable_after_defaults_to_window() -> None:
    assert RestartPolicy(window=12.0).stable_after == 12.0
    assert RestartPolicy(window=12.0, reset_after=3.0).stable_after == 3.0


def test_time_must_not_go_backwards() -> None:
    breaker = CrashLoopBreaker(RestartPolicy(), random.Random(0))
    breaker.record_crash(5.0, uptime=0.0)
    with pytest.raises(ValueError, match="backwards"):
        breaker.record_crash(4.0, uptime=0.0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"initial_backoff": -1.0},
        {"max_backoff": math.inf},
        {"initial_backoff": 2.0, "max_backoff": 1.0},
        {"multiplier": 0.5},
        {"jitter": 1.5},
        {"jitter": -0.1},
        {"max_restarts": -1},
        {"max_restarts": True},
        {"window": 0.0},
        {"reset_after": 0.0},
    ],
)
def test_invalid_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        RestartPolicy(**kwargs)  # type: ignore[arg-type]


# ---- HalfOpenBreaker: closed → open (cool-down) → half-open → closed ---------------------------


def _half_open_breaker(max_restarts: int = 2) -> HalfOpenBreaker:
    policy = RestartPolicy(initial_backoff=1.0, jitter=0.0, max_restarts=max_restarts, window=60.0)
    return HalfOpenBreaker(policy, CooldownPolicy(initial=10.0, maximum=35.0), random.Random(0))


def test_cooldown_policy_doubles_up_to_its_maximum() -> None:
    c = CooldownPolicy(initial=10.0, maximum=35.0)
    assert [c.delay(n) for n in (1, 2, 3, 4)] == [10.0, 20.0, 35.0, 35.0]
    with pytest.raises(ValueError):
        c.delay(0)
    with pytest.raises(ValueError):
        CooldownPolicy(initial=10.0, maximum=5.0)


def test_half_open_breaker_trips_into_a_cool_down_instead_of_failing_forever() -> None:
    b = _half_open_breaker()
    assert isinstance(b.record_crash(0.0, 0.0), Restart)
    assert isinstance(b.record_crash(1.0, 0.0), Restart)
    assert b.record_crash(2.0, 0.0) == Cooldown(delay=10.0, trips=1, crashes=3, window=60.0)
    assert b.state == "open"
    b.half_open()
    assert b.state == "half_open"
    b.succeeded()
    assert b.state == "closed"
    # Closed again with a fresh history: the full restart budget is back.
    assert isinstance(b.record_crash(3.0, 0.0), Restart)
    assert isinstance(b.record_crash(4.0, 0.0), Restart)


def test_a_failed_half_open_try_opens_again_with_a_longer_cool_down() -> None:
    b = _half_open_breaker(max_restarts=0)
    assert b.record_crash(0.0, 0.0) == Cooldown(10.0, 1, 1, 60.0)
    b.half_open()
    assert b.record_crash(1.0, 0.0) == Cooldown(20.0, 2, 1, 60.0)
    b.half_open()
    assert b.record_crash(2.0, 0.0) == Cooldown(35.0, 3, 1, 60.0)
    assert b.trips == 3


def test_a_stable_run_forgets_earlier_trips() -> None:
    b = _half_open_breaker(max_restarts=0)
    b.record_crash(0.0, 0.0)
    b.half_open()
    b.succeeded()
    assert b.record_crash(500.0, uptime=400.0) == Cooldown(10.0, 1, 1, 60.0)
