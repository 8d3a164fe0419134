"""Sampling in the runner's engine: mlx-lm's distributions, no compilation per request."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.sample_utils import apply_top_k as mlx_lm_top_k
from mlx_lm.sample_utils import apply_top_p as mlx_lm_top_p

from skulk.engine._batch import Row
from skulk.engine._engine import Engine, RequestError
from skulk.engine._sampling import Sampler, apply_top_k, apply_top_p
from skulk.engine._single import decode_alone, warm_up
from skulk.models import ensure_demo_model
from skulk.wire.runner import SamplingParams, TextPrompt


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    path = ensure_demo_model(tmp_path_factory.mktemp("home"))
    return Engine.load(Path(path), lambda n, total: None)


def logprobs(vocab: int, dtype: mx.Dtype, seed: int) -> mx.array:
    logits = (mx.random.normal((1, vocab), key=mx.random.key(seed)) * 3).astype(dtype)
    return logits - mx.logsumexp(logits, keepdims=True)


CASES = [(1024, mx.float32, 1), (32000, mx.bfloat16, 2), (151_936, mx.float16, 3)]


@pytest.mark.parametrize(("vocab", "dtype", "seed"), CASES)
def test_top_p_filters_exactly_as_mlx_lm(vocab: int, dtype: mx.Dtype, seed: int) -> None:
    lp = logprobs(vocab, dtype, seed)
    for top_p in (0.01, 0.1, 0.5, 0.75, 0.9, 0.95, 0.999):
        ours, theirs = apply_top_p(lp, top_p), mlx_lm_top_p(lp, top_p)
        assert mx.array_equal(ours, theirs).item(), top_p
        assert ours.dtype == theirs.dtype


@pytest.mark.parametrize(("vocab", "dtype", "seed"), CASES)
def test_top_k_filters_exactly_as_mlx_lm(vocab: int, dtype: mx.Dtype, seed: int) -> None:
    lp = logprobs(vocab, dtype, seed)
    for top_k in (1, 2, 40, vocab // 2, vocab - 1):
        assert mx.array_equal(apply_top_k(lp, top_k), mlx_lm_top_k(lp, top_k)).item(), top_k


@pytest.fixture
def sort_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, ...]]]:
    """Shapes passed to ``mx.sort`` while Python code runs. A compiled function runs its Python
    body only when it is traced, so each call seen from a compiled top-p is one compilation."""
    calls: list[tuple[int, ...]] = []
    real = mx.sort

    def counting(a: mx.array, *args: object, **kwargs: object) -> mx.array:
        calls.append(tuple(a.shape))
        return real(a, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mx, "sort", counting)
    yield calls


def test_new_top_p_values_do_not_compile_again(
    engine: Engine, sort_calls: list[tuple[int, ...]]
) -> None:
    # mlx-lm's apply_top_p is compiled with top_p as a constant: each new value traced (and
    # compiled, ~1 s on a CPU, stalling every stream) again. Ours traces once per model.
    prompt = engine.tokenize(TextPrompt("once upon a time"))
    for i in range(12):
        params = SamplingParams(top_p=0.5 + i / 37, seed=i, max_tokens=2)
        steps = list(decode_alone(engine, prompt, params))
        assert steps[-1].finish_reason is not None
    assert len(sort_calls) <= 1


def eager_tokens(logits: mx.array, params: SamplingParams, steps: int) -> list[int]:
    """What a sampler with ``params`` draws from ``logits`` ``steps`` times, computed with the
    plain eager ops: split the key, normalise, filter, scale (a Python float, in the logits'
    dtype), draw."""
    assert params.seed is not None
    key, drawn = mx.random.key(params.seed), []
    for _ in range(steps):
        key, sub = mx.random.split(key)
        lp = logits - mx.logsumexp(logits, keepdims=True)
        if 0 < params.top_p < 1:
            lp = mlx_lm_top_p(lp, params.top_p)
        if 0 < params.top_k < logits.shape[-1]:
            lp = mlx_lm_top_k(lp, params.top_k)
        drawn.append(int(mx.random.categorical(lp * (1 / params.temperature), key=sub).item()))
    return drawn


@pytest.mark.parametrize(("vocab", "dtype", "seed"), CASES)
def test_the_compiled_draw_samples_exactly_what_the_eager_ops_do(
    vocab: int, dtype: mx.Dtype, seed: int
) -> None:
    # The sampler draws with one compiled graph per token (split, scale, draw); a fused kernel
    # that rounded differently would change seeded requests' tokens.
    logits = (mx.random.normal((1, vocab), key=mx.random.key(seed)) * 3).astype(dtype)
    for params in (
        SamplingParams(temperature=0.7, seed=seed),
        SamplingParams(temperature=1.3, top_p=0.9, seed=seed + 10),
        SamplingParams(temperature=0.5, top_k=40, seed=seed + 20),
        SamplingParams(temperature=1.0, top_p=0.8, top_k=100, seed=seed + 30),
    ):
        sampler = Sampler(params, vocab)
        ours = [int(sampler(logits).item()) for _ in range(40)]
        assert ours == eager_tokens(logits, params, 40), params
        ahead = Sampler(params, vocab)
        assert ahead.sample_ahead(mx.concatenate([logits] * 5)).tolist() == ours[:5]


def test_new_temperatures_do_not_compile_the_draw_again(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The temperature is an input of the compiled draw, not a constant traced into it, and the
    # warm-up traces both draws (with and without filters): the draw's Python body (a key
    # split) runs only when a graph is traced, which the first request must not pay for.
    warm_up(engine)  # what a runner does before its first request
    splits = 0
    real = mx.random.split

    def counting(*args: object, **kwargs: object) -> object:
        nonlocal splits
        splits += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(mx.random, "split", counting)
    for i in range(8):
        tokens(engine, SamplingParams(temperature=0.3 + i / 7, seed=i, max_tokens=3))
        tokens(engine, SamplingParams(temperature=0.3 + i / 7, top_p=0.9, seed=i, max_tokens=3))
    assert splits == 0


def tokens(engine: Engine, params: SamplingParams, prompt: str = "once upon a time") -> list[int]:
    """A request's tokens decoded alone, through the serving loop's single-row path."""
    steps = list(decode_alone(engine, engine.tokenize(TextPrompt(prompt)), params))
    assert steps[-1].finish_reason is not None
    return [t for step in steps for t in step.token_ids]


def test_seeded_requests_are_reproducible(engine: Engine) -> None:
    params = SamplingParams(temperature=1.3, top_p=0.8, top_k=50, seed=1234, max_tokens=24)
    first = tokens(engine, params)
    tokens(engine, SamplingParams(seed=99, max_tokens=5))  # another request in between
    assert tokens(engine, params) == first
    others = {tuple(tokens(engine, SamplingParams(temperature=1.3, seed=s, max_tokens=24)))
              for s in range(4)}  # fmt: skip
    assert len(others) > 1  # the seed matters: sampling is not secretly greedy


def test_a_tiny_temperature_samples_greedily(engine: Engine) -> None:
    # 1 / 1e-40 overflows float32: every scaled log-probability became -inf or NaN and the
    # "sample" was an arbitrary token instead of the most likely one.
    greedy = tokens(engine, SamplingParams(temperature=0, max_tokens=12))
    for temperature in (1e-40, 5e-324, 1e-31):
        params = SamplingParams(temperature=temperature, seed=7, max_tokens=12)
        assert tokens(engine, params) == greedy, temperature


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=-0.5),
        SamplingParams(temperature=float("inf")),
        SamplingParams(top_p=float("nan")),
        SamplingParams(max_tokens=0),
        SamplingParams(max_tokens=-3),
    ],
    ids=["negative-temperature", "infinite-temperature", "nan-top_p", "max_tokens-0", "neg-max"],
)
def test_meaningless_parameters_are_refused(engine: Engine, params: SamplingParams) -> None:
    prompt = engine.tokenize(TextPrompt("hi"))
    for refuse in (
        lambda: engine.check_params(params),  # what the runner checks before tokenizing
        lambda: Row.open(engine, "r", prompt, params),  # a row of the decode batch
        lambda: decode_alone(engine, prompt, params),  # at once, not at the first step
    ):
        with pytest.raises(RequestError) as info:
            refuse()
        assert info.value.reason == "invalid_request"


def test_filters_out_of_range_are_off(engine: Engine) -> None:
    # top_p outside (0, 1) and top_k outside (0, vocab) disable the filter (the wire contract).
    plain = tokens(engine, SamplingParams(seed=3, max_tokens=10))
    for off in (SamplingParams(seed=3, max_tokens=10, top_p=1.5, top_k=10**12),
                SamplingParams(seed=3, max_tokens=10, top_p=0.0, top_k=-4)):  # fmt: skip
        assert tokens(engine, off) == plain
