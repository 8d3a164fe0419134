"""What a request may send cannot stall or kill a healthy runner (real runner processes).

Each test runs a concurrent stream beside the hostile request and checks, on events only, that
the hostile request alone fails — with a typed reason — and that the stream goes on and ends
normally on the same runner process, under deadlines short enough that a stalled main loop
(``progress_timeout``) or an unanswered Cancel (``cancel_timeout``) would have killed it.
"""

from __future__ import annotations

import json
import math
import os
import random
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import attrs
import pytest
import trio

from skulk.engine.protocol import FROM_RUNNER, MAX_FRAME_SIZE, TO_RUNNER
from skulk.models import ensure_demo_model
from skulk.runner import Runner, RunnerConfig, RunnerError
from skulk.wire import FrameReader
from skulk.wire.runner import (
    Cancel,
    ChatMessage,
    ChatPrompt,
    EngineStats,
    Finished,
    FromRunner,
    Generate,
    GenerationEnd,
    Heartbeat,
    Hello,
    Load,
    Loaded,
    Prompt,
    RequestFailed,
    SamplingParams,
    Shutdown,
    TextPrompt,
    TokenChunk,
    Usage,
    WarmedUp,
)

STRICT = RunnerConfig(
    hello_timeout=30, load_timeout=60, warmup_timeout=30, progress_timeout=1, cancel_timeout=1,
    shutdown_grace=1, heartbeat_interval=0.1, speculative_tokens=0,
)  # fmt: skip
#: The concurrent stream: slowed so it is surely still running while the hostile request is
#: handled (``slow@decode`` sleeps in each decode step, well inside the progress deadline;
#: without speculation, which would hand out several of the stream's tokens per step).
STREAM_TOKENS = 60
SLOW = "slow@decode:0.05"
T = TypeVar("T")
SURROGATE = json.loads('"\\udc00"')


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("home"))


def words(n_chars: int, seed: int = 1) -> str:
    """Varied text (tokenizes far slower than one repeated word)."""
    rng = random.Random(seed)
    vocab = ["".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(1, 12)))
             for _ in range(5000)]  # fmt: skip
    return " ".join(rng.choices(vocab, k=n_chars // 6 + 1))[:n_chars]


async def until(predicate: Callable[[], bool]) -> None:
    """Poll runner state that no event reports."""
    while not predicate():  # noqa: ASYNC110 - nothing to wait on but the runner's state
        await trio.sleep(0.01)


class Stream:
    """A concurrent request read to its end in the background."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        self.events: list[object] = []
        self.started = trio.Event()

    async def run(self, runner: Runner) -> None:
        async with runner.open_request("stream", TextPrompt("once"), self.params) as channel:
            async for event in channel:
                self.events.append(event)
                self.started.set()

    def tokens(self) -> int:
        return sum(len(e.token_ids) for e in self.events if isinstance(e, TokenChunk))

    def check_finished(self) -> None:
        """It ran to its natural end: all its tokens, then Finished(length)."""
        last = self.events[-1]
        assert isinstance(last, Finished), last
        assert last.end.finish_reason == "length"
        assert last.end.usage.completion_tokens == self.params.max_tokens


async def refused(
    runner: Runner, rid: str, prompt: Prompt, params: SamplingParams
) -> RequestFailed:
    async with runner.open_request(rid, prompt, params) as channel:
        events = [e async for e in channel]
    assert len(events) == 1 and isinstance(events[0], RequestFailed), events
    return events[0]


def no_bound_python(tmp_path: Path) -> str:
    """A stand-in interpreter that runs the real runner with the tokenizer's cheap length bound
    switched off, so every prompt is tokenized in full."""
    script = tmp_path / "python-no-bound"
    script.write_text(
        f"#!{sys.executable}\n"
        "import runpy, sys\n"
        "import skulk.engine._engine as engine\n"
        "engine._chars_per_token = lambda tokenizer: None\n"
        "sys.argv = ['skulk.engine', *sys.argv[3:]]  # drop '-m skulk.engine'\n"
        "runpy.run_module('skulk.engine', run_name='__main__', alter_sys=True)\n"
    )
    script.chmod(0o755)
    return str(script)


async def beside_a_stream(
    runner: Runner, hostile: Callable[[], Awaitable[T]], stream_tokens: int = STREAM_TOKENS
) -> T:
    """Serve ``runner``; once a slowed stream is under way, run ``hostile()``. Then check that
    only the stream is in flight, that it went on and finished normally, and that the runner
    never failed or changed process. Returns what ``hostile()`` returned."""
    stream = Stream(SamplingParams(temperature=0, max_tokens=stream_tokens))
    with trio.fail_after(180):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            pid = runner.statistics().pid
            nursery.start_soon(stream.run, runner)
            await stream.started.wait()
            outcome = await hostile()
            assert runner.statistics().active_requests == 1  # only the stream is in flight
            seen = stream.tokens()
            assert seen < stream_tokens  # still running when the hostile request ended …
            await until(lambda: not isinstance(stream.events[-1], TokenChunk))
            assert stream.tokens() > seen  # … and it went on afterwards
            nursery.cancel_scope.cancel()
    stream.check_finished()
    assert runner.failure is None
    assert runner.statistics().pid == pid
    assert runner.statistics().cancels_pending == 0
    return outcome


def make(model_dir: Path, **changes: object) -> Runner:
    config = attrs.evolve(STRICT, **{"faults": SLOW, **changes})  # type: ignore[arg-type]
    return Runner("skulk-demo", str(model_dir), config)


async def test_a_request_the_link_cannot_carry_fails_alone(model_dir: Path) -> None:
    # A lone surrogate is valid JSON but not UTF-8, NaN is no CBOR number we accept, and a frame
    # has a size limit. Such a request used to fail *after* it was registered: the node then
    # sent a Cancel for a request the runner never saw, nobody answered, and cancel_timeout
    # killed the runner with every stream on it.
    runner = make(model_dir)
    hostile_requests: list[tuple[Prompt, SamplingParams]] = [
        (TextPrompt("a" + SURROGATE), SamplingParams()),
        (ChatPrompt((ChatMessage("user", SURROGATE),)), SamplingParams()),
        (TextPrompt("hi"), SamplingParams(stop=(SURROGATE,))),
        (TextPrompt("hi"), SamplingParams(temperature=math.nan)),
        (TextPrompt("x" * MAX_FRAME_SIZE), SamplingParams()),
    ]

    async def hostile() -> list[RunnerError]:
        failures = []
        for i, (prompt, params) in enumerate(hostile_requests):
            with pytest.raises(RunnerError) as info:
                async with runner.open_request(f"bad{i}", prompt, params):
                    pass  # pragma: no cover - never entered
            failures.append(info.value)
        return failures

    failures = await beside_a_stream(runner, hostile)
    assert [f.reason for f in failures] == ["invalid_request"] * 4 + ["prompt_too_long"]
    assert not any(f.retryable for f in failures)
    assert all(f.message.isprintable() and len(f.message) < 1000 for f in failures)
    started = [e.request_id for e in runner.flight_events() if e.kind == "request.start"]
    assert started == ["stream"]  # nothing was registered for them, let alone sent


async def test_every_cancel_is_answered_even_when_it_races_the_end(model_dir: Path) -> None:
    # Leave one-token requests at once or after their first event: the Cancel finds the prompt
    # still being tokenized, the request decoding, or the request already over (the runner's
    # Finished and the node's Cancel cross). Every one is answered; no deadline fires.
    runner = make(model_dir)

    async def hostile() -> None:
        one = SamplingParams(temperature=0, max_tokens=1)
        for i in range(30):
            async with runner.open_request(f"race{i}", TextPrompt("hi"), one) as channel:
                if i % 2:
                    await channel.receive()
        await until(lambda: runner.statistics().cancels_pending == 0)

    await beside_a_stream(runner, hostile)


async def test_a_huge_prompt_is_refused_without_stalling_the_runner(model_dir: Path) -> None:
    # 16 MB of text used to be tokenized on the runner's main loop: ~30 s without a heartbeat,
    # so the runner was declared wedged and killed with the stream beside it. Now a prompt
    # that cannot fit is refused by its length in characters, before it is tokenized.
    runner = make(model_dir)
    text = words(16_000_000)

    async def hostile() -> list[RequestFailed]:
        chat = ChatPrompt((ChatMessage("system", "Be brief."), ChatMessage("user", text)))
        return [
            await refused(runner, "text", TextPrompt(text), SamplingParams()),
            await refused(runner, "chat", chat, SamplingParams()),
        ]

    failures = await beside_a_stream(runner, hostile)
    assert [f.reason for f in failures] == ["prompt_too_long"] * 2
    assert all("characters" in f.message for f in failures)  # by the bound, not by counting


async def test_a_prompt_tokenized_in_full_does_not_silence_the_runner(
    model_dir: Path, tmp_path: Path
) -> None:
    # Without a character bound (a tokenizer that can drop input has none) a long prompt is
    # tokenized in full — on the tokenizer thread, while the main loop decodes and beats.
    runner = make(model_dir, python=no_bound_python(tmp_path))
    text = words(2_000_000)
    failure = await beside_a_stream(
        runner, lambda: refused(runner, "long", TextPrompt(text), SamplingParams()), 200
    )
    assert failure.reason == "prompt_too_long"
    assert "characters" not in failure.message  # counted, not bounded


async def test_an_engine_error_fails_only_its_request(model_dir: Path) -> None:
    # The demo chat template raises on a role it does not know.
    runner = make(model_dir)
    robot = ChatPrompt((ChatMessage("robot", "beep"),))
    failure = await beside_a_stream(
        runner, lambda: refused(runner, "robot", robot, SamplingParams())
    )
    assert failure.reason == "engine_error"
    assert "unsupported message role robot" in failure.message


# ---- the runner process alone, frame by frame ---------------------------------------------


class Child:
    """A ``python -m skulk.engine`` process driven over its socket, without the node's Runner."""

    def __init__(self, model_dir: Path, log: Path) -> None:
        self.sock, theirs = socket.socketpair()
        self.sock.settimeout(60)
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "skulk.engine", "--fd", str(theirs.fileno()),
                 "--parent-pid", str(os.getpid()), "--heartbeat-interval", "0.05"],
                pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            )  # fmt: skip
        theirs.close()
        self.reader = FrameReader(FROM_RUNNER)
        self.ready: list[FromRunner] = []
        self.seen: list[FromRunner] = []

    def send(self, frame: Generate | Cancel | Load | Shutdown) -> None:
        self.sock.sendall(TO_RUNNER.pack(frame))

    def next(self, patience: int = 200) -> FromRunner:
        """The next frame other than a heartbeat (or the engine counters sent with one); fails
        after ``patience`` heartbeats."""
        beats = 0
        while True:
            while not self.ready:
                data = self.sock.recv(1 << 16)
                assert data, "the runner closed its socket"
                self.ready.extend(self.reader.feed(data))
            frame = self.ready.pop(0)
            if isinstance(frame, EngineStats):
                continue
            if not isinstance(frame, Heartbeat):
                self.seen.append(frame)
                return frame
            beats += 1
            assert beats < patience, "the runner is alive but sent nothing else"

    def start(self, model_dir: Path) -> None:
        assert isinstance(self.next(), Hello)
        self.send(Load(str(model_dir), "skulk-demo"))
        while not isinstance(self.next(), Loaded):
            pass
        assert isinstance(self.next(), WarmedUp)

    def stop(self) -> None:
        self.send(Shutdown())
        assert self.proc.wait(30) == 0
        self.sock.close()


def test_the_runner_answers_every_cancel(model_dir: Path, tmp_path: Path) -> None:
    child = Child(model_dir, tmp_path / "runner.log")
    try:
        child.start(model_dir)
        # An id it never saw (a Generate that never reached it): acknowledged, zero usage.
        child.send(Cancel("ghost"))
        assert child.next() == Finished("ghost", GenerationEnd("cancelled", Usage(0, 0)))
        # A request that ended before its Cancel arrived: the end, then the acknowledgement.
        child.send(Generate("done", TextPrompt("hi"), SamplingParams(temperature=0, max_tokens=1)))
        while not isinstance(frame := child.next(), (Finished, RequestFailed)):
            pass
        assert isinstance(frame, Finished) and frame.end.finish_reason == "length"
        child.send(Cancel("done"))
        assert child.next() == Finished("done", GenerationEnd("cancelled", Usage(0, 0)))
        # Cancelled while its prompt is tokenized: one answer, and nothing for it afterwards.
        child.send(Generate("early", TextPrompt(words(20_000)), SamplingParams(max_tokens=5)))
        child.send(Cancel("early"))
        child.send(Generate("after", TextPrompt("hi"), SamplingParams(max_tokens=3)))
        while (
            not isinstance(end := child.next(), (Finished, RequestFailed))
            or end.request_id != "after"
        ):
            pass
        early = [f for f in child.seen if getattr(f, "request_id", None) == "early"]
        assert len(early) == 1 and isinstance(early[0], Finished)
        assert early[0].end.finish_reason == "cancelled"
        child.stop()
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()
