"""One request decoded alone, through exactly the path that serves: :class:`Row`, then
:class:`Prefill`, then a one-row :class:`Batch` (with n-gram speculation when asked).

A runner serves every request through :mod:`skulk.engine._batch`; a request alone in its batch
takes the batch's single-row path (a plain KV cache, no padding, no mask — and, with
``speculative_tokens > 0``, the :class:`~skulk.engine._speculate.SpeculativeDecoder`). The
warm-up and the in-process references of tests and benchmarks run that same path here, so
what they warm or measure is what answers requests; there is no second decode loop to keep in
step with it.

Plain data and mlx, no I/O; main thread only (mlx).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Final

from skulk.engine._batch import Batch, Prefill, Row
from skulk.engine._engine import Engine, RequestError, Step
from skulk.wire.runner import SamplingParams, TextPrompt

#: The warm-up's requests: greedy, and sampled with and without top-p and top-k (compiling
#: each of the sampler's compiled functions for the model).
WARM_UP: Final = (
    SamplingParams(temperature=0.0, max_tokens=4),
    SamplingParams(temperature=1.0, top_p=0.9, top_k=8, seed=0, max_tokens=4),
    SamplingParams(temperature=1.0, seed=0, max_tokens=4),
)
#: The warm-up's prompt repeats itself, so with speculation on the n-gram proposer finds a
#: draft and a verify pass runs (and trims the cache) before the first real request.
WARM_UP_PROMPT: Final = TextPrompt("warm up, warm up, warm up")


def decode_alone(
    engine: Engine,
    tokens: Sequence[int],
    params: SamplingParams,
    *,
    speculative_tokens: int = 0,
    request_id: str = "alone",
) -> Iterator[Step]:
    """The steps of one request for ``tokens`` (from :meth:`Engine.tokenize`) decoded alone:
    the last has ``finish_reason`` set. Refuses at once, before any mlx work, with
    :class:`RequestError` what :meth:`Engine.check_params` refuses, and (``unsupported``) a
    ``json_schema``: structured output needs the grammar constraint the runner's preparer
    compiles, which this path does not build — better refused than silently ignored."""
    row = Row.open(engine, request_id, tokens, params)
    if params.json_schema is not None:
        raise RequestError("unsupported", "structured output needs the runner's serving loop")
    return _steps(engine, row, speculative_tokens)


def _steps(engine: Engine, row: Row, speculative_tokens: int) -> Iterator[Step]:
    prefill = Prefill(engine, row, engine.new_cache())
    while (first := prefill.advance()) is None:
        pass
    batch = Batch(engine, speculative_tokens)
    batch.add(row, prefill.cache, first)
    while True:
        for _, step in batch.step():
            yield step
        if row.finish_reason is not None:
            batch.remove(row)
            return


def warm_up(engine: Engine, speculative_tokens: int = 0) -> None:
    """Decode the :data:`WARM_UP` requests, so the first real request pays neither for lazy
    set-up nor for compiling the sampler (nor, with ``speculative_tokens > 0``, for the first
    verify pass)."""
    tokens = engine.tokenize(WARM_UP_PROMPT)
    for params in WARM_UP:
        for _ in decode_alone(engine, tokens, params, speculative_tokens=speculative_tokens):
            pass
