"""The model routes served by Hypercorn on loopback, driven by real clients: the official
``ollama`` client's ``pull`` (what ``ollama pull`` sends and reads) and ``skulk pull`` /
``skulk rm-model`` (httpx), with the fake control of test_model_routes."""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import ollama
import pytest
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from skulk.cli import add_client_commands, run_client_command
from skulk.hub import RepoNotFound
from skulk.store import ModelStore

from .test_model_routes import SCRIPT, FakeControl, PullFailed, app_for
from .test_store import make_model, safetensors

T = TypeVar("T")


async def served(app: Any, nursery: trio.Nursery) -> tuple[str, trio.Event]:
    """Serve ``app`` on a free loopback port: its URL, and the event that stops it."""
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    stop = trio.Event()
    binds: list[str] = await nursery.start(
        lambda task_status: serve(app, config, shutdown_trigger=stop.wait, task_status=task_status)
    )
    return binds[0], stop


async def in_thread(function: Callable[[], T]) -> T:
    with trio.fail_after(30):
        return await trio.to_thread.run_sync(function)


@pytest.fixture
async def url_for() -> AsyncIterator[Callable[..., Any]]:
    async with trio.open_nursery() as nursery:
        stops: list[trio.Event] = []

        async def start(app: Any) -> str:
            url, stop = await served(app, nursery)
            stops.append(stop)
            return url

        yield start
        for stop in stops:
            stop.set()


async def test_the_ollama_client_pulls_with_progress(url_for: Any) -> None:
    url = await url_for(app_for(FakeControl(SCRIPT)))
    client = ollama.Client(host=url, timeout=20)
    progress = await in_thread(lambda: list(client.pull("org/m", stream=True)))
    assert progress[0].status == "pulling manifest" and progress[-1].status == "success"
    bars = [p for p in progress if p.digest]
    assert bars and all(p.total and p.completed is not None for p in bars)
    done = await in_thread(lambda: client.pull("org/m"))
    assert done.status == "success"


async def test_the_ollama_client_raises_the_pulls_errors(url_for: Any) -> None:
    url = await url_for(app_for(FakeControl([RepoNotFound("org/nope")])))
    client = ollama.Client(host=url, timeout=20)
    with pytest.raises(ollama.ResponseError) as before:
        await in_thread(lambda: list(client.pull("org/nope", stream=True)))
    assert before.value.status_code == 404 and "org/nope" in before.value.error
    url = await url_for(app_for(FakeControl([SCRIPT[1], PullFailed("disk_full", "no room")])))
    client = ollama.Client(host=url, timeout=20)
    with pytest.raises(ollama.ResponseError) as during:
        await in_thread(lambda: list(client.pull("org/m", stream=True)))
    assert during.value.error == "no room"


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="skulk")
    add_client_commands(parser.add_subparsers(dest="command", required=True))
    return run_client_command(parser.parse_args(argv), env={})


async def test_skulk_pull_and_rm_model_against_the_routes(
    url_for: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = ModelStore(tmp_path / "store", disk_free=lambda: 1 << 40)
    source = make_model(tmp_path / "src", {"model.safetensors": safetensors(b"\0" * 16)})
    store.import_directory(source, "org/m")
    url = await url_for(app_for(FakeControl(SCRIPT), store=store))
    assert await in_thread(lambda: cli("pull", "org/m", "--api", url)) == 0
    assert capsys.readouterr().out.startswith("pulled org/m ")
    assert await in_thread(lambda: cli("rm-model", "org/m", "--api", url)) == 0  # as org%2Fm
    assert store.models() == []
    assert await in_thread(lambda: cli("rm-model", "org/m", "--api", url)) == 1
    assert capsys.readouterr().err.startswith("skulk: model_not_found: ")
