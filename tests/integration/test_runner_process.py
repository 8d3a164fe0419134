"""The node-side Runner against real subprocesses: the real runner and misbehaving fakes."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from skulk.models import ensure_demo_model
from skulk.runner import HelloTimeout, LoadFailed, Runner, RunnerConfig, RunnerCrashed
from skulk.wire.runner import (
    ChatMessage,
    ChatPrompt,
    Finished,
    RequestFailed,
    SamplingParams,
    TextPrompt,
    TokenChunk,
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("home"))


def fake_python(tmp_path: Path, body: str) -> str:
    """An executable that stands in for ``python -m skulk.engine`` and runs ``body`` (sh)."""
    script = tmp_path / "fake-python"
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return str(script)


async def until(predicate: Callable[[], bool]) -> None:
    """Poll state outside this process (a pid, a child's output) that no event reports."""
    while not predicate():  # noqa: ASYNC110 - nothing to wait on but the outside world
        await trio.sleep(0.01)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def collect(runner: Runner, rid: str, prompt: object, params: SamplingParams) -> list[object]:
    events: list[object] = []
    async with runner.open_request(rid, prompt, params) as channel:  # type: ignore[arg-type]
        async for event in channel:
            events.append(event)
    return events


async def test_real_runner_loads_generates_and_stops(model_dir: Path) -> None:
    progress: list[tuple[int, int]] = []
    runner = Runner("skulk-demo", str(model_dir), on_phase=lambda r: progress.append(r.progress))
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            assert runner.phase == "ready"
            assert progress and progress[-1][0] == progress[-1][1] > 1
            pid = runner.statistics().pid
            assert pid is not None and alive(pid)
            prompt = ChatPrompt((ChatMessage("user", "hi"),))
            events = await collect(runner, "r1", prompt, SamplingParams(max_tokens=5, seed=1))
            assert isinstance(events[-1], Finished)
            assert events[-1].end.usage.completion_tokens <= 5
            assert all(isinstance(e, TokenChunk) for e in events[:-1])
            nursery.cancel_scope.cancel()
    assert runner.phase == "stopped"
    assert not alive(pid)


async def test_cancel_from_the_node_reaches_the_runner(model_dir: Path) -> None:
    runner = Runner("skulk-demo", str(model_dir))
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            params = SamplingParams(max_tokens=1500, seed=5)
            async with runner.open_request("long", TextPrompt("once"), params) as channel:
                first = await channel.receive()
                assert isinstance(first, (TokenChunk, Finished))
            # Leaving early sent Cancel; the runner acknowledges with a cancelled Finished.
            if isinstance(first, TokenChunk):
                await until(lambda: runner.statistics().cancelled == 1)
            assert runner.statistics().active_requests == 0
            nursery.cancel_scope.cancel()


async def test_prompt_too_long_is_a_typed_request_failure(model_dir: Path) -> None:
    runner = Runner("skulk-demo", str(model_dir))
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            text = "word " * (runner.context_length + 10)
            events = await collect(runner, "big", TextPrompt(text), SamplingParams())
            assert isinstance(events[-1], RequestFailed)
            assert events[-1].reason == "prompt_too_long"
            nursery.cancel_scope.cancel()


async def test_missing_model_is_not_retryable(tmp_path: Path) -> None:
    runner = Runner("ghost", str(tmp_path / "nothing"))
    with trio.fail_after(60), pytest.RaisesGroup(LoadFailed) as info:
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
    exc = info.value.exceptions[0]
    assert isinstance(exc, LoadFailed)
    assert exc.reason == "model_not_found" and not exc.retryable
    assert runner.phase == "failed"


async def test_hello_deadline_fires_and_kills_the_group(tmp_path: Path) -> None:
    pidfile = tmp_path / "grandchild"
    python = fake_python(
        tmp_path, f"sleep 600 & echo $! > {pidfile}; echo starting; exec sleep 600"
    )
    runner = Runner(
        "x", "/nowhere", RunnerConfig(hello_timeout=0.5, shutdown_grace=1, python=python)
    )
    with trio.fail_after(30), pytest.RaisesGroup(HelloTimeout):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
    assert runner.failure is not None and runner.failure.reason == "hello_timeout"
    assert "starting" in runner.failure.tail  # output drained and attached to the failure
    pid = runner.statistics().pid
    assert pid is not None and not alive(pid)
    grandchild = int(pidfile.read_text())
    with trio.fail_after(5):
        await until(lambda: not alive(grandchild))  # init reaps it soon after SIGKILL


async def test_sigterm_ignored_means_sigkill_after_grace(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "trap '' TERM; echo ignoring; while :; do sleep 0.05; done")
    runner = Runner(
        "x", "/nowhere", RunnerConfig(hello_timeout=60, shutdown_grace=0.5, python=python)
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner.run)
            await until(lambda: "ignoring" in runner.output_tail)
            nursery.cancel_scope.cancel()
    stats = runner.statistics()
    assert stats.pid is not None and not alive(stats.pid)
    assert runner.phase == "stopped"
    assert stats.exit_code == -9  # SIGTERM was ignored, so the grace ran out and SIGKILL came


async def test_runner_exiting_while_ready_fails_open_requests(model_dir: Path) -> None:
    runner = Runner("skulk-demo", str(model_dir))
    with trio.fail_after(120), pytest.RaisesGroup(RunnerCrashed):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            params = SamplingParams(max_tokens=1500, seed=5)
            async with runner.open_request("r", TextPrompt("once"), params) as channel:
                pid = runner.statistics().pid
                assert pid is not None
                os.kill(pid, 9)
                leftovers = [e async for e in channel]
            assert not any(isinstance(e, Finished) for e in leftovers[-1:])
    assert runner.failure is not None and runner.failure.reason == "runner_crashed"
