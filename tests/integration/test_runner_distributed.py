"""Sharded instances of real runner processes on loopback, through the node-side Runner.

Every rank is a real ``python -m skulk.engine`` driven by its own :class:`Runner` supervisor; the
ranks form an ``mlx.distributed`` ring on ports from binding port 0. The models are generated
(random weights, real mlx-lm architectures): a llama over three safetensors files (with an
index) and a single-file qwen2 with tied embeddings whose heads divide by 2 and by 3. What one
process generates is the reference: a sharded instance must give the same tokens, greedy and
seeded-sampled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from functools import partial
from pathlib import Path

import attrs
import pytest
import trio

from skulk.engine import OVERLAP_ENV
from skulk.engine._engine import Engine
from skulk.engine._single import decode_alone
from skulk.models import ensure_demo_model
from skulk.models._generated import ModelShape, write_generated_model
from skulk.runner import (
    CollectiveFailed,
    CollectiveTimedOut,
    FlightEvent,
    GroupConnectTimeout,
    GroupNotJoined,
    GroupStopped,
    LoadFailed,
    RequestRejected,
    Runner,
    RunnerConfig,
    RunnerPaused,
    RunnerWedged,
    loopback_hosts,
    open_local_group,
    shard_specs,
)
from skulk.wire.runner import (
    ChatMessage,
    ChatPrompt,
    Finished,
    Prompt,
    RequestFailed,
    SamplingParams,
    TextPrompt,
    TokenChunk,
)

LAYERS = 4
LLAMA = ModelShape(family="llama", layers=LAYERS, hidden_size=64, heads=4, kv_heads=2)
QWEN2 = ModelShape(
    family="qwen2",
    layers=LAYERS,
    hidden_size=96,
    heads=6,
    kv_heads=6,
    intermediate_size=192,
    tie_word_embeddings=True,  # as small qwen2 models are: the last pipeline rank keeps it
)
CONFIG = RunnerConfig(
    hello_timeout=60, load_timeout=60, warmup_timeout=60, progress_timeout=30,
    cancel_timeout=20, shutdown_grace=2, heartbeat_interval=0.1,
)  # fmt: skip
PROMPTS: tuple[Prompt, ...] = (
    TextPrompt("The quick brown fox"),
    ChatPrompt((ChatMessage("user", "hello there, how are you?"),)),
)
GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
SAMPLED = SamplingParams(temperature=1.0, top_p=0.95, seed=1234, max_tokens=16)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    demo = ensure_demo_model(root / "home")
    return {
        "llama": write_generated_model(root / "llama", LLAMA, demo, files=3, seed=7),
        "qwen2": write_generated_model(root / "qwen2", QWEN2, demo, files=1, seed=8),
    }


_engines: dict[Path, Engine] = {}
_references: dict[tuple[Path, Prompt, SamplingParams], list[int]] = {}


def reference(model_dir: Path, prompt: Prompt, params: SamplingParams) -> list[int]:
    """The tokens one process generates (in this test process, cached)."""
    key = (model_dir, prompt, params)
    if key not in _references:
        if model_dir not in _engines:
            _engines[model_dir] = Engine.load(model_dir, lambda n, total: None)
        engine = _engines[model_dir]
        steps = list(decode_alone(engine, engine.tokenize(prompt), params))
        assert steps[-1].finish_reason is not None
        _references[key] = [t for step in steps for t in step.token_ids]
    return _references[key]


async def generate(
    runner: Runner,
    rid: str,
    prompt: Prompt,
    params: SamplingParams,
    started: trio.Event | None = None,
) -> tuple[list[int], object]:
    """The request's tokens and its last event (``started`` is set at its first tokens)."""
    tokens: list[int] = []
    last: object = None
    async with runner.open_request(rid, prompt, params) as events:
        async for event in events:
            if isinstance(event, TokenChunk):
                tokens += event.token_ids
                if started is not None:
                    started.set()
            last = event
    return tokens, last


def alive(pid: int | None) -> bool:
    assert pid is not None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize(
    ("family", "sharding", "world"),
    [
        ("llama", "pipeline", 2),
        ("llama", "pipeline", 3),
        ("llama", "tensor", 2),
        ("qwen2", "pipeline", 2),
        ("qwen2", "tensor", 3),
    ],
)
async def test_sharded_instance_generates_what_one_process_does(
    models: dict[str, Path], family: str, sharding: str, world: int
) -> None:
    model = models[family]
    phases: list[str] = []
    specs = shard_specs(sharding, loopback_hosts(world), LAYERS)  # type: ignore[arg-type]
    # Three ranks on two cores are slow (a rank waiting in a collective spins a core): one
    # prompt is enough there.
    prompts = PROMPTS if world == 2 else PROMPTS[:1]
    with trio.fail_after(120):
        async with open_local_group(family, str(model), specs, CONFIG) as group:
            rank0 = group.runners[0]
            for i, prompt in enumerate(prompts):
                for j, params in enumerate((GREEDY, SAMPLED)):
                    tokens, last = await generate(rank0, f"r{i}{j}", prompt, params)
                    assert isinstance(last, Finished), last
                    want = reference(model, prompt, params)
                    assert len(want) >= 8  # a real sequence, not an early end
                    assert tokens == want, (prompt, params)
            with pytest.raises(RequestRejected) as refused:
                async with group.runners[1].open_request("x", PROMPTS[0], GREEDY):
                    pass
            assert refused.value.reason == "not_rank_zero"
            phases = [e.detail for e in group.runners[-1].flight_events() if e.kind == "phase"]
            assert all(r.world == world for r in group.runners)
    assert any(p.startswith("connecting") for p in phases)
    assert all(r.failure is None for r in group.runners)


async def test_concurrent_requests_and_cancel_in_lockstep(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two seeded requests at once give what each gives alone; a cancelled request's row leaves
    the decode batch on every rank (rank 1 traces the drop), and the instance goes on serving;
    stopping rank 0 ends every rank cleanly — rank 1 too, though it takes a while to exit after
    saying ``group_stopped`` (its node waits for it rather than signal it). One decode batch:
    the pipeline's micro-batches (two requests would decode apart, overlapped) are off here,
    see tests/integration/test_pipeline_overlap.py for them."""
    monkeypatch.setenv(OVERLAP_ENV, "off")
    model = models["llama"]
    specs = shard_specs("pipeline", loopback_hosts(2), LAYERS)
    params = [attrs.evolve(SAMPLED, seed=s, max_tokens=24) for s in (11, 12)]
    with trio.fail_after(120):
        async with open_local_group(
            "llama", str(model), specs, CONFIG, faults={1: "slow@exit:0.5"}
        ) as group:
            rank0, rank1 = group.runners
            results: dict[int, list[int]] = {}

            async def one(i: int) -> None:
                tokens, last = await generate(rank0, f"c{i}", PROMPTS[i], params[i])
                assert isinstance(last, Finished)
                results[i] = tokens

            async with trio.open_nursery() as nursery:
                nursery.start_soon(one, 0)
                nursery.start_soon(one, 1)
            for i in (0, 1):
                assert results[i] == reference(model, PROMPTS[i], params[i])
            # They were open at once: the second joined the decode batch of the first.
            await until_traced(rank1, "join 2", first_at(rank0, "request.start"))
            long = SamplingParams(temperature=1.0, seed=3, max_tokens=1500)
            async with rank0.open_request("long", PROMPTS[0], long) as events:
                first = await events.receive()
                assert isinstance(first, TokenChunk)
            # Leaving early cancelled it: rank 0 answers, and its row leaves the batch everywhere.
            while rank0.statistics().cancelled < 1:  # noqa: ASYNC110 - the runner's answer
                await trio.sleep(0.02)
            await until_traced(rank1, "drop", first_at(rank0, "request.cancel"))
            tokens, last = await generate(rank0, "after", PROMPTS[1], GREEDY)
            assert isinstance(last, Finished)
            assert tokens == reference(model, PROMPTS[1], GREEDY)
            # Rank 0's node stops it: the whole group leaves cleanly.
            group.stop(0)
            await group.ended[0].wait()
            await group.ended[1].wait()
    assert rank0.phase == "stopped" and rank0.failure is None
    assert isinstance(rank1.failure, GroupStopped) and not rank1.failure.retryable
    assert [r.statistics().exit_code for r in group.runners] == [0, 0]


@pytest.mark.parametrize(
    ("sharding", "overlap"),
    [("pipeline", False), ("pipeline", True), ("tensor", False)],
    ids=["pipeline", "pipeline-overlap", "tensor"],
)
async def test_concurrent_requests_share_each_decode_step(
    models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, sharding: str, overlap: bool
) -> None:
    """Continuous batching in lockstep: seeded requests of different lengths join a running
    request's decode batch (one of them after a prompt longer than a prefill chunk, prefilled
    between batched decode steps), and each gives what one process gives alone; a request
    cancelled inside the batch leaves it while the others go on. Rank 1 traces one
    ``forward(decode)`` collective per step, for several rows at once.

    Rank 1 runs every decode step of every row 10 ms slow (a fault), so the first request is
    still decoding when the others arrive (it needs 64 steps: at least 0.6 s). With a
    pipeline's overlap the rows decode in two micro-batches (rows join the smaller one), so a
    pass carries at least two rows rather than three."""
    if not overlap:
        monkeypatch.setenv(OVERLAP_ENV, "off")
    model = models["llama"]
    specs = shard_specs(sharding, loopback_hosts(2), LAYERS)  # type: ignore[arg-type]
    with trio.fail_after(180):
        async with open_local_group(
            "llama", str(model), specs, CONFIG, faults={1: "slow@decode:0.01"}
        ) as group:
            rank0, rank1 = group.runners
            kept0, kept1 = Kept(rank0), Kept(rank1)
            async with trio.open_nursery() as keeping:
                keeping.start_soon(kept0.run)
                keeping.start_soon(kept1.run)
                await _share_each_step(model, rank0, kept0, kept1, overlap, sharding)
                keeping.cancel_scope.cancel()
    assert all(r.failure is None for r in group.runners)


async def _share_each_step(
    model: Path, rank0: Runner, kept0: Kept, kept1: Kept, overlap: bool, sharding: str
) -> None:
    long_prompt = TextPrompt(" ".join(f"w{i}" for i in range(300)))  # > one prefill chunk
    first = ("a", PROMPTS[0], attrs.evolve(SAMPLED, seed=21, max_tokens=64))
    joining = [
        ("b", PROMPTS[1], attrs.evolve(GREEDY, max_tokens=24)),
        ("c", long_prompt, attrs.evolve(SAMPLED, seed=22, max_tokens=12)),
        ("d", PROMPTS[1], attrs.evolve(SAMPLED, seed=23, max_tokens=40)),
    ]
    long = SamplingParams(temperature=1.0, seed=24, max_tokens=1500)
    results: dict[str, list[int]] = {}
    started = trio.Event()

    async def one(rid: str, prompt: Prompt, params: SamplingParams) -> None:
        tokens, last = await generate(rank0, rid, prompt, params, started)
        assert isinstance(last, Finished), (rid, last)
        results[rid] = tokens

    async def cancelled_inside() -> None:
        async with rank0.open_request("x", PROMPTS[0], long) as events:
            for _ in range(3):
                assert isinstance(await events.receive(), TokenChunk)
        # Leaving early cancels it: its row leaves the batch, the others go on.

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one, *first)
        await started.wait()
        for request in joining:
            nursery.start_soon(one, *request)
        nursery.start_soon(cancelled_inside)
    for rid, prompt, params in (first, *joining):
        want = reference(model, prompt, params)
        assert len(want) >= 8
        assert results[rid] == want, (rid, sharding)
    assert rank0.statistics().cancelled == 1
    await until_traced(kept1, "drop", first_at(kept0, "request.cancel"))
    # A step's decode is one forward pass along the ring, whatever the batch's rows:
    # rank 1 notes the row count when it changes.
    most = 2 if overlap else 3
    while max(batched_rows(kept1), default=0) < most:  # noqa: ASYNC110 - see until_traced
        await trio.sleep(0.02)
    steps = [
        e.detail.split()[2]
        for e in kept1.flight_events()
        if e.kind == "collective" and e.detail.startswith("forward(decode) step ")
    ]
    assert len(steps) == len(set(steps)) > 0


async def test_requests_beyond_the_agreed_kv_budget_wait_then_overflow_is_refused(
    models: dict[str, Path],
) -> None:
    """A sharded instance's KV budget is the fewest tokens any rank's budget holds: rank 1
    (half the layers) has room for two requests, rank 0 plenty. Of six concurrent requests two
    run, two wait and two are refused ``kv_cache_full``; the four served give what one process
    gives. A request that could never fit is refused at once, naming ``max_tokens``; rank 0
    reports the budget it admits against (in its own bytes) in its engine stats."""
    model = models["llama"]
    specs = shard_specs("pipeline", loopback_hosts(2), LAYERS)
    engine = _engines.setdefault(model, Engine.load(model, lambda n, total: None))
    prompt, params = PROMPTS[0], attrs.evolve(GREEDY, max_tokens=20)
    prompt_tokens = len(engine.tokenize(prompt))
    layers = [spec.end - spec.start for spec in specs]
    per_token = [engine.kv_bytes_per_token * n // LAYERS for n in layers]
    need = (prompt_tokens + 20) * per_token[1]
    config = attrs.evolve(CONFIG, kv_waiting=2)
    with trio.fail_after(180):
        async with open_local_group(
            "llama",
            str(model),
            specs,
            config,
            faults={1: "slow@decode:0.05"},  # all six arrive long before the first two end
            kv_cache_bytes={0: 1 << 30, 1: 2 * need + need // 2},
        ) as group:
            rank0 = group.runners[0]
            results: dict[str, tuple[list[int], object]] = {}

            async def one(rid: str) -> None:
                results[rid] = await generate(rank0, rid, prompt, params)

            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(one, f"r{i}")
            huge = attrs.evolve(GREEDY, max_tokens=5 * need // per_token[1])
            _, never = await generate(rank0, "huge", prompt, huge)
            stats = rank0.engine_statistics()
    refused = [last for _, last in results.values() if isinstance(last, RequestFailed)]
    assert [e.reason for e in refused] == ["kv_cache_full"] * 2
    served = [tokens for tokens, last in results.values() if isinstance(last, Finished)]
    assert len(served) == 4
    assert all(tokens == reference(model, prompt, params) for tokens in served)
    assert isinstance(never, RequestFailed) and never.reason == "max_tokens_too_large"
    assert "max_tokens" in never.message
    tokens_held = (2 * need + need // 2) // per_token[1]
    assert stats is not None and stats.kv_capacity_bytes == tokens_held * per_token[0]
    assert all(r.failure is None for r in group.runners)


@pytest.mark.parametrize(
    ("busy", "watched"),
    [(True, True), (False, True), (True, False)],
    ids=["mid-decode", "idle", "mid-decode-unwatched"],
)
async def test_sigstop_of_a_rank_fails_the_group_within_its_deadlines(
    models: dict[str, Path], busy: bool, watched: bool
) -> None:
    """Rank 1 stopped, mid-decode or while the group idles. Its own node sees the process
    stopped and fails it ``runner_paused`` (the culprit, named before any peer's deadline);
    rank 0 then loses its peer (``collective_failed``) or, had the ring not noticed yet, its
    watchdog fires. Unwatched (``rank_pause_timeout = 0``), rank 0's watchdog ends rank 0
    (``collective_timeout``) and rank 1's own node finds it wedged (progress deadline)."""
    collective, progress = 2.0, 4.0
    config = attrs.evolve(
        CONFIG, progress_timeout=progress, rank_pause_timeout=3.0 if watched else 0.0
    )
    specs = shard_specs("pipeline", loopback_hosts(2), LAYERS, collective_timeout=collective)
    with trio.fail_after(120):
        async with open_local_group("llama", str(models["llama"]), specs, config) as group:
            rank0, rank1 = group.runners
            pid1 = rank1.statistics().pid
            assert pid1 is not None
            try:
                if busy:
                    long = SamplingParams(temperature=1.0, seed=5, max_tokens=1500)
                    async with rank0.open_request("r", PROMPTS[0], long) as events:
                        assert isinstance(await events.receive(), TokenChunk)
                        os.kill(pid1, signal.SIGSTOP)
                        last: object = None
                        async for event in events:
                            last = event
                        assert not isinstance(last, (Finished, RequestFailed))
                else:
                    os.kill(pid1, signal.SIGSTOP)
                # Which deadline ended each rank is in its typed failure (below), not timed.
                await group.ended[0].wait()
                await group.ended[1].wait()
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid1, signal.SIGCONT)
    assert rank0.failure is not None and not rank0.failure.retryable
    if watched:
        assert isinstance(rank1.failure, RunnerPaused), rank1.failure
        assert f"deadline {collective / 2:g}s" in rank1.failure.message
        assert any(e.kind == "stopped" for e in rank1.flight_events())
        assert isinstance(rank0.failure, (CollectiveFailed, CollectiveTimedOut)), rank0.failure
    else:
        assert isinstance(rank0.failure, CollectiveTimedOut)
        assert f"took > {collective:g}s" in rank0.failure.message
        waited = "forward(decode)" if busy else "broadcast(control)"
        assert rank0.failure.message.startswith(waited), rank0.failure.message
        assert isinstance(rank1.failure, RunnerWedged)
    assert any(e.kind == "collective" for e in rank0.flight_events())
    assert not alive(rank0.statistics().pid) and not alive(pid1)


async def test_sigkill_of_a_rank_mid_prefill_ends_the_others(models: dict[str, Path]) -> None:
    """A rank killed while a long prompt is prefilled: the others' next collective fails at
    once (the ring notices the closed sockets, no deadline needed) and each exits with a typed
    failure."""
    specs = shard_specs("pipeline", loopback_hosts(3), LAYERS, collective_timeout=10)
    prompt = TextPrompt(" ".join(f"word{i}" for i in range(400)))  # ~1500 tokens: 3 chunks
    with trio.fail_after(120):
        async with open_local_group(
            "llama", str(models["llama"]), specs, CONFIG, faults={2: "slow@prefill:0.5"}
        ) as group:
            rank0 = group.runners[0]
            async with rank0.open_request("p", prompt, GREEDY) as events:
                await until_traced(rank0, "forward(prefill)", first_at(rank0, "request.start"))
                pid2 = group.runners[2].statistics().pid
                assert pid2 is not None
                os.kill(pid2, signal.SIGKILL)
                received = [event async for event in events]
                await group.ended[0].wait()
                await group.ended[1].wait()
    assert received == []  # still prefilling when killed; then the channel just ends
    for runner in group.runners[:2]:
        assert isinstance(runner.failure, CollectiveFailed), runner.failure
        assert not runner.failure.retryable
        assert "connection to a peer was lost" in runner.failure.message


class Kept:
    """Every flight event of ``runner``, polled into a list that keeps them all: its recorder
    keeps only its last 256, and on a loaded machine the steps after an event can push it out
    before the test looks for it."""

    def __init__(self, runner: Runner) -> None:
        self.runner = runner
        self._seen: dict[FlightEvent, None] = {}

    def flight_events(self) -> list[FlightEvent]:
        for e in self.runner.flight_events():
            self._seen.setdefault(e, None)
        return list(self._seen)

    async def run(self) -> None:
        while True:
            self.flight_events()
            await trio.sleep(0.005)


def batched_rows(runner: Runner | Kept) -> list[int]:
    """The batch sizes ``runner`` traced at its decode steps (noted when the size changes)."""
    return [
        int(e.detail.rsplit("rows ", 1)[1])
        for e in runner.flight_events()
        if e.kind == "collective" and e.detail.startswith("forward(decode)") and "rows" in e.detail
    ]


def first_at(runner: Runner | Kept, kind: str) -> float:
    return next(e.at for e in runner.flight_events() if e.kind == kind)


async def until_traced(runner: Runner | Kept, text: str, since: float) -> None:
    """Until ``runner``'s recorder holds a collective entry that mentions ``text`` and began
    after wall-clock time ``since`` (a runner sends its trace every heartbeat interval)."""
    while not any(  # noqa: ASYNC110 - the recorder has no event to wait on
        e.kind == "collective" and text in e.detail and e.at > since for e in runner.flight_events()
    ):
        await trio.sleep(0.02)


async def test_a_rank_that_never_joins_fails_the_group_formation(models: dict[str, Path]) -> None:
    connect = 3.0
    specs = shard_specs("pipeline", loopback_hosts(2), LAYERS, connect_timeout=connect)
    with trio.fail_after(60):
        async with open_local_group(
            "llama",
            str(models["llama"]),
            specs,
            CONFIG,
            faults={1: "hang@connect"},
            wait_ready=False,
        ) as group:
            for ended in group.ended:
                await ended.wait()
    rank0, rank1 = group.runners
    assert isinstance(rank0.failure, GroupConnectTimeout), rank0.failure
    assert isinstance(rank1.failure, GroupNotJoined), rank1.failure
    assert not rank0.failure.retryable and not rank1.failure.retryable
    for runner in group.runners:
        assert runner.phase == "failed"
        assert "connecting" in [e.detail.split(":")[0] for e in runner.flight_events()]
        assert not alive(runner.statistics().pid)


async def test_tensor_sharding_the_heads_do_not_divide_is_refused(
    models: dict[str, Path],
) -> None:
    specs = shard_specs("tensor", loopback_hosts(3), LAYERS)
    with trio.fail_after(60):
        async with open_local_group(
            "llama", str(models["llama"]), specs, CONFIG, wait_ready=False
        ) as group:
            for ended in group.ended:
                await ended.wait()
    for runner in group.runners:
        failure = runner.failure
        assert isinstance(failure, LoadFailed), failure
        assert failure.reason == "unsupported_sharding" and not failure.retryable
        assert "divisible by 3" in failure.message and "4 heads" in failure.message
        assert "llama" in failure.message


REPO = Path(__file__).resolve().parents[2]


def single_process_logits(model_dir: Path, tokens: list[int], steps: int) -> object:
    """The logits one process computes for the last ``steps`` decode steps of ``tokens``
    (prefilled in the runner's chunks, then one token at a time)."""
    import mlx.core as mx
    import numpy as np
    from mlx_lm.models.cache import make_prompt_cache
    from mlx_lm.utils import load_model

    from skulk.engine._budget import PREFILL_STEP

    model, _ = load_model(model_dir)
    cache = make_prompt_cache(model)
    prompt, forced = tokens[:-steps], tokens[-steps:]
    while len(prompt) > 1:
        n = min(PREFILL_STEP, len(prompt) - 1)
        model(mx.array(prompt[:n])[None], cache=cache)
        mx.eval([c.state for c in cache])
        prompt = prompt[n:]
    rows = []
    for token in [prompt[0], *forced[:-1]]:
        rows.append(model(mx.array([[token]]), cache=cache)[:, -1, :])
    return np.array(mx.concatenate(rows, axis=0).astype(mx.float32))


@pytest.mark.parametrize(
    ("sharding", "tolerance"),
    [
        # The same kernels on the same shapes, the hidden state passed bit for bit: exact.
        ("pipeline", 0.0),
        # Each rank multiplies its slice and all_sum adds the partial results: float32 sums in
        # another order, ~1e-6 relative on logits of magnitude ~1-10.
        ("tensor", 1e-4),
    ],
)
async def test_sharded_logits_match_one_process(
    models: dict[str, Path], tmp_path: Path, sharding: str, tolerance: float
) -> None:
    import numpy as np

    from tests.integration._shard_probe import PROBE_STEPS

    model = models["llama"]
    engine = Engine.load(model, lambda n, total: None)
    text = " ".join(f"w{i}" for i in range(300))  # more than one prefill chunk
    tokens = engine.tokenize(TextPrompt(text))[:600]
    assert len(tokens) > 512 + PROBE_STEPS + 1
    world = 2
    hosts = loopback_hosts(world)
    specs = shard_specs(sharding, hosts, LAYERS)  # type: ignore[arg-type]
    out = tmp_path / "logits.npy"
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for spec in specs:
                argv = [
                    sys.executable, "-m", "tests.integration._shard_probe", str(model), sharding,
                    str(spec.rank), ",".join(hosts), str(spec.start), str(spec.end),
                    ",".join(map(str, tokens)), str(out),
                ]  # fmt: skip
                nursery.start_soon(partial(trio.run_process, argv, cwd=REPO))
    got = np.load(out)
    want = single_process_logits(model, tokens, PROBE_STEPS + 1)
    assert got.shape == want.shape == (PROBE_STEPS + 1, LLAMA.vocab_size)  # type: ignore[attr-defined]
    diff = float(np.abs(got - want).max())
    print(f"{sharding}: max |logits difference| {diff:g}, max |logit| {np.abs(want).max():g}")
    assert diff <= tolerance, f"max |logits difference| {diff:g} > {tolerance:g}"
