"""Continuous batching, the KV budget and the prefix cache in the runner's serving loop.

The loop's request book-keeping (:class:`~skulk.engine._scheduler.Scheduler`) is driven turn by
turn with a fake link, on the demo model and on a generated llama (random weights, so attention
matters), with prompts given as token ids: a request's tokens must not depend on what runs
beside it, nor on whether its prompt came from the prefix cache.
"""

from __future__ import annotations

import queue
import random
from collections.abc import Sequence
from pathlib import Path

import attrs
import mlx.core as mx
import pytest

from skulk.engine._batch import Batch, Prefill, Row
from skulk.engine._budget import PREFILL_STEP, KvBudget, PrefillPacer, default_kv_budget
from skulk.engine._engine import Engine, Step
from skulk.engine._prefix_cache import PrefixCache
from skulk.engine._prepare import Prepared
from skulk.engine._scheduler import Scheduler
from skulk.engine.faults import Faults
from skulk.models import ensure_demo_model
from skulk.models._generated import ModelShape, write_generated_model
from skulk.wire.runner import (
    Finished,
    FromRunner,
    Generate,
    Load,
    PrefillProgress,
    RequestFailed,
    SamplingParams,
    TextPrompt,
    TokenChunk,
)

GREEDY = SamplingParams(temperature=0.0, max_tokens=24)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, top_k=40, seed=11, max_tokens=24)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Engine]:
    root = tmp_path_factory.mktemp("models")
    demo = ensure_demo_model(root / "home")
    generated = write_generated_model(root / "gen", ModelShape(), demo, files=1, seed=7)
    return {
        name: Engine.load(Path(path), lambda n, total: None)
        for name, path in (("demo", demo), ("generated", generated))
    }


class FakeLink:
    """What the ``Scheduler`` needs of a link: ``send`` (kept in order) and an inbox."""

    def __init__(self) -> None:
        self.sent: list[FromRunner] = []
        self.inbox: queue.Queue[object] = queue.Queue()

    def send(self, frame: FromRunner) -> None:
        self.sent.append(frame)


class Loop:
    """The runner's serving loop without the process: joins at chosen turns, then ``advance``."""

    def __init__(self, engine: Engine, load: Load | None = None) -> None:
        self.link = FakeLink()
        load = load or Load("unused", "m", prefix_cache_bytes=0, speculative_tokens=0)
        self.requests = Scheduler(self.link, engine, Faults(), load)  # type: ignore[arg-type]
        self._job = 0

    def submit(self, rid: str, tokens: Sequence[int], params: SamplingParams) -> None:
        self._job += 1
        self.requests.waiting[rid] = self._job
        request = Generate(rid, TextPrompt("unused"), params)
        self.requests.start(Prepared(self._job, request, tuple(tokens)))

    def run(
        self, joins: Sequence[tuple[int, str, Sequence[int], SamplingParams]]
    ) -> dict[str, list[int]]:
        """Each ``(turn, rid, tokens, params)`` joins before that turn; runs until idle."""
        pending = sorted(joins, key=lambda j: j[0])
        turn = 0
        while pending or self.requests.busy or self.requests.queued:
            while pending and pending[0][0] <= turn:
                _, rid, tokens, params = pending.pop(0)
                self.submit(rid, tokens, params)
            self.requests.advance()
            turn += 1
            assert turn < 10_000
        return self.tokens()

    def tokens(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for frame in self.link.sent:
            if isinstance(frame, TokenChunk):
                out.setdefault(frame.request_id, []).extend(frame.token_ids)
        return out

    def ends(self) -> dict[str, Finished | RequestFailed]:
        return {f.request_id: f for f in self.link.sent if isinstance(f, Finished | RequestFailed)}


def ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, 1000) for _ in range(n)]


def alone(engine: Engine, tokens: Sequence[int], params: SamplingParams) -> list[int]:
    return Loop(engine).run([(0, "x", tokens, params)])["x"]


@pytest.mark.parametrize("model", ["demo", "generated"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_request_gives_the_same_tokens_whatever_runs_beside_it(
    models: dict[str, Engine], model: str, params: SamplingParams
) -> None:
    engine = models[model]
    rng = random.Random(3)
    mine = ids(rng, 40)
    others = [
        # a long prompt prefilled in chunks while the others decode, joining at once
        (0, "long", ids(rng, PREFILL_STEP + 300), SamplingParams(0.7, seed=3, max_tokens=30)),
        # short ones joining later, one ending long before the others
        (2, "short", ids(rng, 5), SamplingParams(temperature=1.0, seed=9, max_tokens=6)),
        (5, "greedy", ids(rng, 60), SamplingParams(temperature=0.0, max_tokens=30)),
    ]
    expected = alone(engine, mine, params)
    loop = Loop(engine)
    together = loop.run([(1, "mine", mine, params), *others])
    assert together["mine"] == expected
    for _, rid, tokens, p in others:
        assert together[rid] == alone(engine, tokens, p), rid
    assert all(isinstance(end, Finished) for end in loop.ends().values())
    assert len(expected) == params.max_tokens or model == "demo"  # the demo model may stop


def test_rows_decode_in_one_forward_pass_and_leave_one_by_one(
    models: dict[str, Engine],
) -> None:
    engine = models["generated"]
    rng = random.Random(5)
    batch = Batch(engine)
    rows = []
    for i, n in enumerate((3, 17, 40)):
        row = Row.open(engine, f"r{i}", ids(rng, n), SamplingParams(temperature=0, max_tokens=50))
        prefill = Prefill(engine, row, engine.new_cache())
        while (first := prefill.advance()) is None:
            pass
        batch.add(row, prefill.cache, first)
        rows.append(row)
    calls = 0
    real = engine.forward.model

    def counting(*args: object, **kwargs: object) -> object:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    engine.forward.model = counting
    try:
        steps = batch.step()
    finally:
        engine.forward.model = real
    assert calls == 1 and [r for r, _ in steps] == rows
    # 3 → 2 rows (filter), 2 → 1 (back to a plain cache), 1 → 0; the cache keeps each row's
    # tokens: prompt, the one handed out, and the one computed ahead.
    own = batch.remove(rows[1], keep_cache=True)
    assert own is not None and own[0].offset == rows[1].fed == 17 + 1
    batch.step()
    own = batch.remove(rows[0], keep_cache=True)
    assert own is not None and own[0].offset == rows[0].fed == 3 + 2
    assert len(batch) == 1 and type(batch._cache[0]).__name__ == "KVCache"
    batch.step()
    assert batch.remove(rows[2], keep_cache=True) is not None and len(batch) == 0


def test_cancel_inside_a_batch_ends_only_that_request(models: dict[str, Engine]) -> None:
    engine = models["generated"]
    rng = random.Random(8)
    a, b, c = ids(rng, 10), ids(rng, 20), ids(rng, 30)
    params = SamplingParams(temperature=0.8, seed=4, max_tokens=20)
    loop = Loop(engine)
    for rid, tokens in (("a", a), ("b", b), ("c", c)):
        loop.submit(rid, tokens, params)
    for _ in range(8):
        loop.requests.advance()
    loop.requests.cancel("b")
    loop.run([])
    ends = loop.ends()
    assert isinstance(ends["b"], Finished) and ends["b"].end.finish_reason == "cancelled"
    assert 0 < ends["b"].end.usage.completion_tokens < 20
    out = loop.tokens()
    assert out["a"] == alone(engine, a, params) and out["c"] == alone(engine, c, params)
    assert loop.requests.budget.used == 0


# ---- the KV budget -------------------------------------------------------------------------


def test_budget_needs_prompt_plus_max_tokens_capped_at_the_context() -> None:
    budget = KvBudget(capacity=1000 * 8, bytes_per_token=8, context_length=600)
    assert budget.need(100, 50) == 150 * 8
    assert budget.need(100, None) == 600 * 8
    assert budget.need(100, 10_000) == 600 * 8
    assert budget.refusal(100, 50) is None
    small = KvBudget(capacity=120 * 8, bytes_per_token=8, context_length=600)
    reason, message = small.refusal(100, 50) or ("", "")
    assert reason == "max_tokens_too_large" and "at most 20" in message
    assert (small.refusal(200, 1) or ("",))[0] == "prompt_too_long"
    assert default_kv_budget(8, 600, 0) == 600 * 8
    assert default_kv_budget(8, 600, 1 << 30) == 1 << 29


def test_budget_admits_what_fits_queues_fifo_and_refuses_beyond_the_queue(
    models: dict[str, Engine],
) -> None:
    engine = models["generated"]
    per_token = engine.kv_bytes_per_token
    params = SamplingParams(temperature=0.0, max_tokens=20)
    rng = random.Random(2)
    prompts = {f"r{i}": ids(rng, 30) for i in range(6)}
    # Room for two requests (50 tokens each) and a bit, two may wait.
    load = Load("unused", "m", kv_cache_bytes=120 * per_token, prefix_cache_bytes=0, kv_waiting=2)
    loop = Loop(engine, load)
    for rid, tokens in prompts.items():
        loop.submit(rid, tokens, params)
    reqs = loop.requests
    assert [p.row.request_id for p in reqs.prefills] == ["r0", "r1"]
    assert [row.request_id for row, _ in reqs.queued] == ["r2", "r3"]
    assert reqs.budget.used == 100 * per_token
    refused = [f for f in loop.link.sent if isinstance(f, RequestFailed)]
    assert [(f.request_id, f.reason) for f in refused] == [
        ("r4", "kv_cache_full"),
        ("r5", "kv_cache_full"),
    ]
    order: list[str] = []
    while reqs.busy or reqs.queued:
        reqs.advance()
        running = {r.request_id for b in reqs.batches for r in b.rows}
        running |= {p.row.request_id for p in reqs.prefills}
        assert len(running) <= 2
        order += [rid for rid in sorted(running) if rid not in order]
    assert order[:2] == ["r0", "r1"] and sorted(order[2:]) == ["r2", "r3"]
    out = loop.tokens()
    for rid in ("r0", "r1", "r2", "r3"):
        assert out[rid] == alone(engine, prompts[rid], params), rid
        done = loop.ends()[rid]
        assert isinstance(done, Finished) and done.end.usage.completion_tokens == 20
    # Those that waited for room say so (the queue time metric); those admitted at once
    # waited only between two lines of the scheduler.
    waited = {rid: end.end.queue_seconds for rid, end in loop.ends().items()
              if isinstance(end, Finished)}  # fmt: skip
    assert min(waited["r2"], waited["r3"]) > max(waited["r0"], waited["r1"])
    assert reqs.budget.used == 0


def test_a_request_that_can_never_fit_is_refused_naming_max_tokens(
    models: dict[str, Engine],
) -> None:
    engine = models["demo"]
    per_token = engine.kv_bytes_per_token
    loop = Loop(engine, Load("unused", "m", kv_cache_bytes=64 * per_token, prefix_cache_bytes=0))
    loop.submit("big", [5] * 10, SamplingParams(max_tokens=100))
    loop.submit("huge", [5] * 80, SamplingParams(max_tokens=1))
    ends = loop.ends()
    assert isinstance(ends["big"], RequestFailed) and ends["big"].reason == "max_tokens_too_large"
    assert "max_tokens can be at most 54" in ends["big"].message
    assert isinstance(ends["huge"], RequestFailed) and ends["huge"].reason == "prompt_too_long"
    assert not loop.requests.busy and loop.requests.budget.used == 0


# ---- the prefix cache ----------------------------------------------------------------------


@pytest.mark.parametrize("model", ["demo", "generated"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_a_chat_gives_the_same_tokens_with_the_prefix_cache(
    models: dict[str, Engine], model: str, params: SamplingParams
) -> None:
    engine = models[model]
    rng = random.Random(13)
    system = ids(rng, PREFILL_STEP + 40)  # a long system prompt, prefilled in two chunks
    turns = [ids(rng, n) for n in (7, 12, 3, 25)]
    cached = Loop(engine, Load("unused", "m", prefix_cache_bytes=64 << 20))
    history = list(system)
    reused, prompts = [], []
    for i, user in enumerate(turns):
        history += user
        prompts.append(len(history))
        rid = f"turn{i}"
        got = cached.run([(0, rid, history, params)])[rid]
        assert got == alone(engine, history, params), i
        done = cached.ends()[rid]
        assert isinstance(done, Finished)
        reused.append(done.end.usage.cached_tokens)
        history += [*got, 7]  # the answer, then an end-of-turn token
    assert reused[0] == 0
    # every later turn reuses at least the whole previous prompt
    for i in range(1, len(turns)):
        assert prompts[i - 1] <= reused[i] < prompts[i], i
    assert cached.requests.prefix.hits == len(turns) - 1
    # a second conversation with the same system prompt reuses it
    other = [*system, *ids(rng, 9)]
    got = cached.run([(0, "other", other, params)])["other"]
    assert got == alone(engine, other, params)
    done = cached.ends()["other"]
    assert isinstance(done, Finished) and done.end.usage.cached_tokens == len(system)


def test_the_prefix_cache_stays_within_its_bytes_and_evicts_the_oldest(
    models: dict[str, Engine],
) -> None:
    engine = models["generated"]
    per_token = engine.kv_bytes_per_token
    prefix = PrefixCache(max_bytes=250 * per_token, forward=engine.forward)
    rng = random.Random(4)
    firsts = []
    for i in range(4):
        tokens = ids(rng, 100)
        firsts.append(tokens)
        loop_cache = engine.new_cache()
        engine.model(mx.array(tokens)[None], cache=loop_cache)
        prefix.store(tokens, loop_cache)
        assert prefix.nbytes <= prefix.max_bytes, i
    assert len(prefix) == 2
    assert prefix.fetch(firsts[0] + [1]) is None  # evicted
    hit = prefix.fetch(firsts[3] + [1])
    assert hit is not None and hit[1] == 100 and hit[0][0].offset == 100
    whole = prefix.fetch(firsts[2])  # the whole prompt kept: its last token is computed again
    assert whole is not None and whole[1] == 99 and whole[0][0].offset == 99
    assert PrefixCache(0, engine.forward).fetch(firsts[3] + [1]) is None


# ---- speculative decoding on the single-row path ---------------------------------------------


@pytest.mark.parametrize("model", ["demo", "generated"])
@pytest.mark.parametrize("params", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_speculation_gives_the_same_tokens_as_plain_decoding(
    models: dict[str, Engine], model: str, params: SamplingParams, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = models[model]
    rng = random.Random(21)
    phrase = ids(rng, 12)
    prompt = [*phrase * 6, *phrase[:5]]  # an answer that copies: drafts are accepted
    params = attrs.evolve(params, max_tokens=60)
    plain = Loop(engine, Load("unused", "m", prefix_cache_bytes=0, speculative_tokens=0))
    expected = plain.run([(0, "x", prompt, params)])["x"]
    spec = Loop(engine, Load("unused", "m", prefix_cache_bytes=0, speculative_tokens=6))
    spec.submit("x", prompt, params)
    rows = [r for b in spec.requests.batches for r in b.rows]
    while spec.requests.busy:
        spec.requests.advance()
        rows += [r for b in spec.requests.batches for r in b.rows if r not in rows]
    assert spec.tokens()["x"] == expected
    speculation = rows[0].speculation
    assert speculation is not None
    stats = speculation.controller.statistics()
    assert stats.verify_steps > 0 and stats.drafted > 0, stats
    if params.temperature == 0:
        assert stats.accepted > 0, stats
    done = spec.ends()["x"]
    assert isinstance(done, Finished) and done.end.usage.completion_tokens == len(expected)
    # a second request joining a speculating one (a verify pass in flight or not) leaves both
    # exact
    other = ids(rng, 9)
    other_expected = alone(engine, other, params)
    settled: list[int] = []
    real_settle = Batch.settle

    def settle(batch: Batch) -> list[tuple[Row, Step]]:
        steps = real_settle(batch)
        settled.append(len(steps))
        return steps

    monkeypatch.setattr(Batch, "settle", settle)
    for turn in range(2, 14):
        both = Loop(engine, Load("unused", "m", prefix_cache_bytes=0, speculative_tokens=6))
        got = both.run([(0, "x", prompt, params), (turn, "y", other, params)])
        assert got["x"] == expected and got["y"] == other_expected, turn
    if params.temperature == 0:
        assert any(settled), settled  # some join found drafts to finish


def test_cancel_reaches_a_request_in_prefill_and_one_waiting_for_the_budget(
    models: dict[str, Engine],
) -> None:
    engine = models["generated"]
    per_token = engine.kv_bytes_per_token
    rng = random.Random(6)
    long_prompt, short = ids(rng, 3 * PREFILL_STEP), ids(rng, 10)
    params = SamplingParams(temperature=0.0, max_tokens=10)
    need = (len(long_prompt) + 10) * per_token
    loop = Loop(engine, Load("unused", "m", kv_cache_bytes=need, prefix_cache_bytes=0))
    loop.submit("long", long_prompt, params)
    loop.submit("short", short, params)
    reqs = loop.requests
    reqs.advance()  # one chunk of the long prompt; "short" waits for its KV bytes
    assert [p.row.request_id for p in reqs.prefills] == ["long"]
    assert [row.request_id for row, _ in reqs.queued] == ["short"]
    reqs.cancel("long")  # mid-prefill: its bytes go to "short", which starts at once
    assert [p.row.request_id for p in reqs.prefills] == ["short"] and not reqs.queued
    loop.submit("third", short, params)
    reqs.cancel("third")  # waiting for the budget
    loop.run([])
    ends = loop.ends()
    for rid in ("long", "third"):
        done = ends[rid]
        assert isinstance(done, Finished) and done.end.finish_reason == "cancelled", rid
        assert done.end.usage.completion_tokens == 0
    assert loop.tokens()["short"] == alone(engine, short, params)
    assert reqs.budget.used == 0 and not reqs.busy


def test_the_prefill_pacer_keeps_chunks_near_their_target_time() -> None:
    pacer = PrefillPacer(target=0.25, least=16, most=512, first=32, smoothing=0.5)
    assert pacer.size() == 32 and pacer.budget(4096) == 32  # nothing measured yet
    pacer.record(32, 32 * 0.0001)  # a fast model: 0.1 ms a token
    assert pacer.size() == 512
    assert pacer.budget(4096) == 2500 and pacer.budget(8) == 8  # an embedding group's budget
    slow = PrefillPacer(target=0.25, least=16, most=512, first=32, smoothing=0.5)
    slow.record(32, 32 * 0.033)  # a large model on a CPU: 33 ms a token
    assert slow.size() == 16  # 0.25 s would be 7 tokens: the least
    slow = PrefillPacer(target=0.25, least=4, most=512, first=32, smoothing=0.5)
    slow.record(32, 32 * 0.033)
    assert slow.size() == 7
    slow.record(16, 16 * 0.005)  # it got faster (the machine got quiet): averaged
    assert slow.size() == int(0.25 / ((0.033 + 0.005) / 2))
    slow.record(0, 1.0)  # nothing computed: nothing learned
    assert slow.size() == int(0.25 / ((0.033 + 0.005) / 2))


def test_prefill_progress_marks_admission_then_each_chunk(models: dict[str, Engine]) -> None:
    rng = random.Random(5)
    system = ids(rng, PREFILL_STEP + 40)  # more than one chunk
    loop = Loop(models["demo"], Load("unused", "m", prefix_cache_bytes=64 << 20))
    params = SamplingParams(temperature=0.0, max_tokens=3)

    def progress(rid: str) -> list[tuple[int, int]]:
        return [
            (f.done, f.total)
            for f in loop.link.sent
            if isinstance(f, PrefillProgress) and f.request_id == rid
        ]

    loop.run([(0, "cold", system, params)])
    total = len(system)
    marks = progress("cold")
    assert marks[0] == (0, total) and marks[-1] == (total, total) and len(marks) >= 3, marks
    dones = [done for done, _ in marks]
    assert dones == sorted(set(dones)) and {t for _, t in marks} == {total}
    # Every PrefillProgress of a request comes before its first token.
    kinds = [type(f) for f in loop.link.sent if getattr(f, "request_id", "") == "cold"]
    assert kinds.index(TokenChunk) > max(i for i, k in enumerate(kinds) if k is PrefillProgress)
    # A prefix-cache hit is admitted with the reused tokens already done.
    loop.run([(0, "warm", [*system, 5, 6, 7], params)])
    marks = progress("warm")
    assert marks[0][0] >= total - 1 and marks[-1] == (total + 3, total + 3), marks


def test_a_prefill_computes_at_most_the_chunk_it_is_given(models: dict[str, Engine]) -> None:
    engine = models["demo"]
    tokens = list(range(10, 110))  # 100 prompt tokens
    params = SamplingParams(temperature=0.0, max_tokens=4)
    whole = Row.open(engine, "a", tokens, params)
    one = Prefill(engine, whole, engine.new_cache())
    while (first_whole := one.advance()) is None:
        pass
    assert one.chunks == 1  # 99 tokens fit one default chunk
    small = Row.open(engine, "b", tokens, params)
    paced = Prefill(engine, small, engine.new_cache())
    fed = []
    while (first_small := paced.advance(16)) is None:
        fed.append(small.fed)
    assert fed == [16, 32, 48, 64, 80, 96, 99]
    assert int(first_small.item()) == int(first_whole.item())  # the same first token
