"""A crash-looping model is not failed forever: cool-down, one half-open try, operator retry."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from skulk.actors import CooldownPolicy, RestartPolicy
from skulk.models import ensure_demo_model
from skulk.runner import RunnerConfig
from skulk.worker import ModelService, ModelStatus

# Two runner failures within the window trip the breaker (the second relaunch would be #2).
QUICK = RestartPolicy(initial_backoff=0.05, max_backoff=0.05, jitter=0.0, max_restarts=1,
                      window=600.0)  # fmt: skip


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("home"))


async def until(service: ModelService, check: Callable[[ModelStatus], bool]) -> ModelStatus:
    with trio.fail_after(60):
        while not check(s := service.status()):  # noqa: ASYNC110 - the service has no events
            await trio.sleep(0.02)
    return s


def service(model_dir: Path, faults: str, cooldown: CooldownPolicy) -> ModelService:
    async def resolve() -> Path:
        return model_dir

    return ModelService(
        "skulk-demo",
        resolve,
        RunnerConfig(faults=faults),
        policy=QUICK,
        cooldown=cooldown,
        rng=random.Random(0),
    )


async def test_crash_loop_cools_down_then_one_try_closes_the_breaker(model_dir: Path) -> None:
    # Runners 1 and 2 crash at once: a crash loop. Runner 3 is the half-open try, and works.
    svc = service(model_dir, "crash@hello#1;crash@hello#2", CooldownPolicy(initial=0.5))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(svc.run)
        failed = await until(svc, lambda s: s.state == "failed")
        assert failed.failure_reason == "crash_loop"
        assert failed.breaker == "open" and failed.crash_loop_trips == 1
        assert failed.retry_in is not None and 0 < failed.retry_in <= 0.5
        ready = await until(svc, lambda s: s.state == "ready")
        assert ready.breaker == "closed" and ready.failure_reason is None
        assert ready.retry_in is None
        assert [r.incarnation for r in svc.recent_runners()] == [1, 2, 3]
        assert not svc.retry_now()  # a working runner is never restarted
        nursery.cancel_scope.cancel()


async def test_a_failed_try_doubles_the_cool_down_and_an_operator_can_retry(
    model_dir: Path,
) -> None:
    # Runner 3 (the first half-open try) crashes too: open again at once, for much longer.
    svc = service(
        model_dir,
        "crash@hello#1;crash@hello#2;crash@hello#3",
        CooldownPolicy(initial=0.2, maximum=3600.0, multiplier=10_000.0),
    )
    async with trio.open_nursery() as nursery:
        nursery.start_soon(svc.run)
        again = await until(svc, lambda s: s.crash_loop_trips == 2)
        assert again.state == "failed" and again.breaker == "open"
        assert again.retry_in is not None and again.retry_in > 60  # min(3600, 0.2 * 10_000)
        assert len(svc.recent_runners()) == 3
        assert svc.retry_now()  # the operator does not wait an hour
        ready = await until(svc, lambda s: s.state == "ready")
        assert ready.breaker == "closed"
        assert [r.incarnation for r in svc.recent_runners()] == [1, 2, 3, 4]
        nursery.cancel_scope.cancel()


async def test_operator_retry_after_a_failure_relaunching_cannot_fix(tmp_path: Path) -> None:
    home = tmp_path / "home"
    svc = service(home / "models" / "skulk-demo", "", CooldownPolicy())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(svc.run)
        failed = await until(svc, lambda s: s.state == "failed")
        assert failed.failure_reason == "model_not_found" and failed.retry_in is None
        await trio.to_thread.run_sync(ensure_demo_model, home)  # the operator adds it ...
        assert svc.retry_now()  # ... and asks for a retry
        await until(svc, lambda s: s.state == "ready")
        nursery.cancel_scope.cancel()
