"""Every runner deadline and typed failure, made to fire with real runner processes.

The runners are real ``python -m skulk.engine`` processes with fault hooks (see
``skulk.engine.faults``) and short deadlines; nothing here is mocked.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Callable
from pathlib import Path

import attrs
import pytest
import trio

from skulk.models import ensure_demo_model
from skulk.runner import (
    CancelTimeout,
    HelloTimeout,
    LoadTimeout,
    ProtocolError,
    Runner,
    RunnerConfig,
    RunnerCrashed,
    RunnerError,
    RunnerWedged,
    WarmupTimeout,
)
from skulk.wire.runner import Finished, RequestFailed, SamplingParams, TextPrompt, TokenChunk

FAST = RunnerConfig(
    hello_timeout=20, load_timeout=30, warmup_timeout=20, progress_timeout=20, cancel_timeout=20,
    shutdown_grace=1, heartbeat_interval=0.1,
)  # fmt: skip
LONG = SamplingParams(temperature=0, max_tokens=1500)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("home"))


def alive(pid: int | None) -> bool:
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def until(predicate: Callable[[], bool]) -> None:
    """Poll state outside this process that no event reports."""
    while not predicate():  # noqa: ASYNC110 - nothing to wait on but the outside world
        await trio.sleep(0.01)


async def fails_with(runner: Runner, error: type[RunnerError]) -> RunnerError:
    """Run ``runner`` until it fails; check the failure's type and that nothing is left."""
    with trio.fail_after(60), pytest.RaisesGroup(error):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await trio.sleep_forever()
    assert isinstance(runner.failure, error)
    assert runner.phase == "failed"
    assert not alive(runner.statistics().pid)
    kinds = [e.kind for e in runner.flight_events()]
    assert kinds[-1] == "exit"
    return runner.failure


def make(model_dir: Path, faults: str = "", **deadlines: float) -> Runner:
    config = attrs.evolve(FAST, faults=faults, **deadlines)  # type: ignore[arg-type]
    return Runner("skulk-demo", str(model_dir), config)


async def test_lifecycle_follows_the_transition_table(model_dir: Path) -> None:
    runner = make(model_dir)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            async with runner.open_request("r", TextPrompt("hi"), LONG) as channel:
                await channel.receive()
                assert runner.phase == "busy"
            await until(lambda: runner.phase == "ready")  # the cancel was acknowledged
            nursery.cancel_scope.cancel()
    phases = [e.detail.split(":")[0].split(" ")[0] for e in runner.flight_events()
              if e.kind == "phase"]  # fmt: skip
    assert phases == [
        "spawning", "loading", "warming", "ready", "busy", "ready", "stopping", "stopped"
    ]  # fmt: skip
    kinds = {e.kind for e in runner.flight_events()}
    assert {"progress", "request.start", "request.first_token", "request.cancel",
            "request.finish", "signal", "exit"} <= kinds  # fmt: skip


async def test_idle_runner_reports_memory_in_heartbeats(model_dir: Path) -> None:
    runner = make(model_dir)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await until(lambda: runner.statistics().rss_bytes is not None)
            rss = runner.statistics().rss_bytes
            assert rss is not None and rss > 10 << 20
            nursery.cancel_scope.cancel()


async def test_idle_runner_outlives_the_thread_that_spawned_it(model_dir: Path) -> None:
    # Trio spawns from worker threads that retire after ~10 s idle; a runner tied to that
    # thread (PR_SET_PDEATHSIG) would die then. Stay idle past it and still be served.
    runner = make(model_dir)
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            await trio.sleep(12)  # the thing under test is surviving idle time itself
            params = SamplingParams(temperature=0, max_tokens=2)
            async with runner.open_request("r", TextPrompt("hi"), params) as channel:
                events = [e async for e in channel]
            assert isinstance(events[-1], Finished)
            nursery.cancel_scope.cancel()
    assert runner.failure is None


async def test_hello_timeout(model_dir: Path) -> None:
    failure = await fails_with(make(model_dir, "hang@hello", hello_timeout=1), HelloTimeout)
    assert failure.reason == "hello_timeout" and failure.retryable


async def test_load_timeout(model_dir: Path) -> None:
    failure = await fails_with(make(model_dir, "hang@load", load_timeout=1), LoadTimeout)
    assert failure.reason == "load_timeout"


async def test_warmup_timeout(model_dir: Path) -> None:
    failure = await fails_with(make(model_dir, "hang@warm", warmup_timeout=1), WarmupTimeout)
    assert failure.reason == "warmup_timeout"


async def test_crash_during_load(model_dir: Path) -> None:
    failure = await fails_with(make(model_dir, "crash@load"), RunnerCrashed)
    assert failure.reason == "runner_crashed"


async def test_wedged_mid_decode_fails_open_requests_at_once(model_dir: Path) -> None:
    runner = make(model_dir, "hang@decode:3", progress_timeout=1)
    seen: list[object] = []
    with trio.fail_after(60), pytest.RaisesGroup(RunnerWedged):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            async with runner.open_request("r", TextPrompt("hi"), LONG) as channel:
                seen.extend([e async for e in channel])  # ends when the runner is declared wedged
            await trio.sleep_forever()
    assert all(isinstance(e, TokenChunk) for e in seen) and len(seen) == 3
    assert runner.failure is not None and runner.failure.reason == "runner_wedged"
    assert any(e.kind == "deadline" and "progress_timeout" in e.detail
               for e in runner.flight_events())  # fmt: skip
    assert not alive(runner.statistics().pid)


async def test_slow_but_alive_runner_is_not_wedged(model_dir: Path) -> None:
    # Each decode step sleeps 0.3 s with a 1 s progress deadline: tokens keep coming in time.
    runner = make(model_dir, "slow@decode:0.3", progress_timeout=1)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            params = SamplingParams(temperature=0, max_tokens=6)
            async with runner.open_request("r", TextPrompt("hi"), params) as channel:
                events = [e async for e in channel]
            assert isinstance(events[-1], Finished)
            assert events[-1].end.usage.completion_tokens == 6
            nursery.cancel_scope.cancel()
    assert runner.failure is None


async def test_cancel_not_acknowledged(model_dir: Path) -> None:
    # The runner hangs while handling the Cancel; the cancel deadline (shorter than the
    # progress deadline here) fires first.
    runner = make(model_dir, "hang@cancel", cancel_timeout=0.5, progress_timeout=30)
    with trio.fail_after(60), pytest.RaisesGroup(CancelTimeout):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            async with runner.open_request("r", TextPrompt("hi"), LONG) as channel:
                await channel.receive()
            await trio.sleep_forever()
    assert runner.failure is not None and runner.failure.reason == "cancel_timeout"


async def test_crash_mid_stream(model_dir: Path) -> None:
    runner = make(model_dir, "crash@decode:2")
    with trio.fail_after(60), pytest.RaisesGroup(RunnerCrashed):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            async with runner.open_request("r", TextPrompt("hi"), LONG) as channel:
                events = [e async for e in channel]
            assert len(events) == 2
            await trio.sleep_forever()
    assert runner.statistics().exit_code == 13


async def test_ignored_sigterm_gets_sigkill_after_the_grace(model_dir: Path) -> None:
    # Stuck in its warm-up and deaf to SIGTERM: only SIGKILL after the grace ends it.
    runner = make(model_dir, "ignore-sigterm;hang@warm", shutdown_grace=0.5)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run)
            await until(lambda: runner.phase == "warming")
            nursery.cancel_scope.cancel()
    assert runner.statistics().exit_code == -9
    signals = [e.detail.split()[0] for e in runner.flight_events() if e.kind == "signal"]
    assert signals == ["SIGTERM", "SIGKILL"]
    assert runner.phase == "stopped"


async def test_garbage_from_the_runner_is_a_protocol_error(tmp_path: Path) -> None:
    fake = tmp_path / "fake-python"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import os, sys, time\n"
        "fd = int(sys.argv[sys.argv.index('--fd') + 1])\n"
        "os.write(fd, b'\\x40\\x00\\x00\\x00')  # a frame header announcing 1 GiB\n"
        "time.sleep(600)\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    runner = Runner("x", "/nowhere", attrs.evolve(FAST, python=str(fake)))
    failure = await fails_with(runner, ProtocolError)
    assert "bad frame" in failure.message


async def test_a_runner_that_cannot_be_spawned_is_a_typed_failure(tmp_path: Path) -> None:
    runner = Runner("x", "/nowhere", attrs.evolve(FAST, python=str(tmp_path / "no-python")))
    with trio.fail_after(10), pytest.RaisesGroup(RunnerCrashed):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
    assert runner.failure is not None and "could not start" in runner.failure.message
    assert runner.phase == "failed" and runner.statistics().pid is None


async def test_a_stalled_consumer_is_dropped_not_the_runner(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import skulk.runner._request_table as request_table

    monkeypatch.setattr(request_table, "REQUEST_BUFFER", 8)
    runner = make(model_dir, progress_timeout=2)
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            async with runner.open_request("stalled", TextPrompt("hi"), LONG) as stalled:
                # Never read "stalled" while another request runs to completion. "other" is
                # short enough that its whole output fits the buffer even when the batched
                # runner's chunks arrive in one read, before its reader gets to run.
                params = SamplingParams(temperature=0, max_tokens=8)
                async with runner.open_request("other", TextPrompt("yo"), params) as other:
                    other_events = [e async for e in other]
                await until(lambda: runner.statistics().cancelled == 1)
                events = [e async for e in stalled]
            nursery.cancel_scope.cancel()
    assert isinstance(other_events[-1], Finished)
    assert other_events[-1].end.usage.completion_tokens == 8
    assert len(events) == 9 and all(isinstance(e, TokenChunk) for e in events[:8])
    assert isinstance(events[-1], RequestFailed) and events[-1].reason == "client_too_slow"
    assert runner.failure is None  # the runner was never declared wedged
