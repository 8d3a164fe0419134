"""Token sampling whose per-request parameters are data, never compiled-in constants.

mlx-lm's ``apply_top_p`` / ``apply_top_k`` are ``mx.compile``\\ d with the parameter as a Python
number, so every new value compiles the function again (about 1 s on a CPU, on the thread that
decodes every stream: 40 distinct ``top_p`` values cost ~30 s of stalls). Here:

* :func:`apply_top_p` is compiled once per logits shape and dtype (so once per model), with
  ``top_p`` passed as a 0-d ``float32`` array: a new value is a new input, not a new trace;
* :func:`apply_top_k` is not compiled at all: ``argpartition`` needs ``k`` as a Python int, and
  the eager ops cost microseconds next to a forward pass.

Both return exactly what mlx-lm's functions return for the same inputs (checked by tests), so a
seeded request samples the same tokens as a plain mlx-lm sampler with the same key.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import cast

import mlx.core as mx

from skulk.wire.runner import SamplingParams

#: Below this temperature sampling is greedy: ``1 / temperature`` would overflow float32 when it
#: scales the log-probabilities (every token ``-inf`` or NaN, so a garbage token). At such a
#: temperature any difference between two log-probabilities outweighs the sampling noise by
#: more than 20 orders of magnitude, so the argmax *is* the sample.
MIN_TEMPERATURE = 1e-30


def _top_p(logprobs: mx.array, top_p: mx.array) -> mx.array:
    # The body of mlx_lm.sample_utils.apply_top_p, with top_p an array instead of a float.
    sorted_logprobs = mx.sort(logprobs, axis=-1)
    sorted_probs = mx.exp(sorted_logprobs.astype(mx.float32))
    mass_above = mx.cumsum(sorted_probs, axis=-1, reverse=True, inclusive=False)
    total_mass = mass_above[..., :1] + sorted_probs[..., :1]
    num_dropped = (mass_above >= top_p * total_mass).sum(axis=-1, keepdims=True)
    threshold = mx.take_along_axis(sorted_logprobs, num_dropped, axis=-1)
    return mx.where(logprobs < threshold, -float("inf"), logprobs)


_compiled_top_p = cast(Callable[[mx.array, mx.array], mx.array], mx.compile(_top_p))


def apply_top_p(logprobs: mx.array, top_p: mx.array | float) -> mx.array:
    """Keep the smallest set of most likely tokens whose probability mass reaches ``top_p``
    (others get ``-inf``). ``logprobs``: shape ``(..., vocab)``; ``top_p`` in ``(0, 1)``."""
    if not isinstance(top_p, mx.array):
        top_p = mx.array(top_p, dtype=mx.float32)
    return _compiled_top_p(logprobs, top_p)


def apply_top_k(logprobs: mx.array, top_k: int) -> mx.array:
    """Keep the ``top_k`` most likely tokens (others get ``-inf``); ``0 < top_k < vocab``."""
    vocab_size = logprobs.shape[-1]
    if not 0 < top_k < vocab_size:
        raise ValueError(f"top_k must be in (0, {vocab_size}), not {top_k}")
    mask_idx = mx.argpartition(-logprobs, kth=top_k - 1, axis=-1)[..., top_k:]
    return mx.put_along_axis(logprobs, mask_idx, mx.array(-float("inf"), logprobs.dtype), axis=-1)


def check_params(params: SamplingParams) -> str | None:
    """Why ``params`` cannot be served, or ``None``. The node's codec already refuses NaN and
    infinities; this refuses the finite values that have no meaning."""
    if not (math.isfinite(params.temperature) and params.temperature >= 0):
        return f"temperature must be a finite number >= 0, not {params.temperature!r}"
    if not math.isfinite(params.top_p):
        return f"top_p must be finite, not {params.top_p!r}"
    if params.max_tokens is not None and params.max_tokens < 1:
        return f"max_tokens must be at least 1, not {params.max_tokens}"
    return None


class Sampler:
    """Picks one request's tokens from logits, with its own random key.

    ``top_p`` outside ``(0, 1)`` and ``top_k`` outside ``(0, vocab)`` disable those filters;
    ``temperature`` below :data:`MIN_TEMPERATURE` (``0`` included) is greedy. The key is split
    once per sampled token, so a seeded request gives the same tokens whatever runs beside it.
    """

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        self.greedy = params.temperature < MIN_TEMPERATURE
        self._scale = 0.0 if self.greedy else 1.0 / params.temperature
        self._top_p = mx.array(params.top_p, dtype=mx.float32) if 0 < params.top_p < 1 else None
        self._top_k = params.top_k if 0 < params.top_k < vocab_size else None
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        self._key = mx.random.key(seed % (1 << 64))

    def __call__(self, logits: mx.array) -> mx.array:
        if self.greedy:
            return mx.argmax(logits, axis=-1)
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        if self._top_p is not None:
            logprobs = apply_top_p(logprobs, self._top_p)
        if self._top_k is not None:
            logprobs = apply_top_k(logprobs, self._top_k)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(logprobs * self._scale, key=sub)
