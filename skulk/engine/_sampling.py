"""Token sampling whose per-request parameters are data, never compiled-in constants.

mlx-lm's ``apply_top_p`` / ``apply_top_k`` are ``mx.compile``\\ d with the parameter as a Python
number, so every new value compiles the function again (about 1 s on a CPU, on the thread that
decodes every stream: 40 distinct ``top_p`` values cost ~30 s of stalls). Here:

* :func:`apply_top_p` is compiled once per logits shape and dtype (so once per model), with
  ``top_p`` passed as a 0-d ``float32`` array: a new value is a new input, not a new trace;
* :func:`apply_top_k` is not compiled at all: ``argpartition`` needs ``k`` as a Python int, and
  the eager ops cost microseconds next to a forward pass;
* a sampled token's draw (the key split, the temperature, the categorical draw, and the
  normalisation when no filter comes first) is one compiled graph with the key and
  ``1 / temperature`` as inputs, so a new temperature never compiles it again.

Both return exactly what mlx-lm's functions return for the same inputs (checked by tests), so a
seeded request samples the same tokens as a plain mlx-lm sampler with the same key.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Callable
from typing import cast

import mlx.core as mx

from skulk.engine._logprobs import PendingLogprobs, pending_logprobs
from skulk.wire.runner import MAX_TOP_LOGPROBS, SamplingParams

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


def _draw(logprobs: mx.array, key: mx.array, scale: mx.array) -> tuple[mx.array, mx.array]:
    # One sampled token of logprobs * scale, and the key after the split that drew it.
    key, sub = mx.random.split(key)
    return mx.random.categorical(logprobs * scale, key=sub), key


def _normalise(logits: mx.array) -> mx.array:
    # Log-probabilities over the whole array (one row: shape (1, vocab)).
    return logits - mx.logsumexp(logits, keepdims=True)


def _normalised_draw(logits: mx.array, key: mx.array, scale: mx.array) -> tuple[mx.array, mx.array]:
    return _draw(_normalise(logits), key, scale)


_Draw = Callable[[mx.array, mx.array, mx.array], tuple[mx.array, mx.array]]
#: A sampled token's key split, temperature and draw as one compiled graph (with the logits'
#: normalisation too when no filter comes between): a handful of graph nodes less per token,
#: which is ~10 % of a step of a model as small as the demo. The values are exactly the eager
#: ops' (tested), so seeded tokens do not change.
_compiled_draw = cast(_Draw, mx.compile(_draw))
_compiled_normalised_draw = cast(_Draw, mx.compile(_normalised_draw))


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
    if params.logprobs is not None and not 0 <= params.logprobs <= MAX_TOP_LOGPROBS:
        return f"logprobs must be from 0 to {MAX_TOP_LOGPROBS}, not {params.logprobs}"
    return None


class Sampler:
    """Picks one request's tokens from logits, with its own random key.

    ``top_p`` outside ``(0, 1)`` and ``top_k`` outside ``(0, vocab)`` disable those filters;
    ``temperature`` below :data:`MIN_TEMPERATURE` (``0`` included) is greedy. The key is split
    once per sampled token, so a seeded request gives the same tokens whatever runs beside it.

    Speculative decoding (:mod:`skulk.engine._speculate`) samples several positions at once
    with :meth:`sample_ahead` and then keeps only some of them with :meth:`commit`: each row is
    sampled with the very subkey plain decoding would use for that position, so the tokens are
    the same with and without speculation.

    With ``SamplingParams.logprobs`` every sampled token's log-probabilities are computed beside
    it (:mod:`skulk.engine._logprobs`: the log-softmax of the logits given, before temperature,
    top-p and top-k) and queued for :meth:`pop_logprobs`; rows of :meth:`sample_ahead` join the
    queue only once :meth:`commit` keeps them. Without it nothing is recorded.
    """

    def __init__(self, params: SamplingParams, vocab_size: int) -> None:
        self.greedy = params.temperature < MIN_TEMPERATURE
        self._scale = 0.0 if self.greedy else 1.0 / params.temperature
        self._scale_array: mx.array | None = None  # _scale in the logits' dtype
        self._top_p = mx.array(params.top_p, dtype=mx.float32) if 0 < params.top_p < 1 else None
        self._top_k = params.top_k if 0 < params.top_k < vocab_size else None
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        self._key = mx.random.key(seed % (1 << 64))
        # The keys after 1, 2, … further splits, from the last sample_ahead (see commit).
        self._ahead: list[mx.array] = []
        self._ahead_from: mx.array | None = None
        #: ``SamplingParams.logprobs``: with a number, every sampled token's log-probabilities
        #: wait in ``_logprobs`` (in sampling order) until :meth:`pop_logprobs` takes them.
        self.logprobs = params.logprobs
        self._logprobs: deque[PendingLogprobs] = deque()
        self._ahead_logprobs: list[PendingLogprobs] = []

    def __call__(self, logits: mx.array) -> mx.array:
        token = self._draw(logits)
        if self.logprobs is not None:
            self._logprobs.append(pending_logprobs(logits, token, self.logprobs))
        return token

    def pop_logprobs(self) -> PendingLogprobs | None:
        """The log-probabilities of the oldest sampled token not popped yet (tokens are handed
        out in the order they were sampled; a :meth:`sample_ahead` row counts once
        :meth:`commit` keeps it); ``None`` when the request did not ask for them."""
        return self._logprobs.popleft() if self._logprobs else None

    def _draw(self, logits: mx.array) -> mx.array:
        if self.greedy:
            return mx.argmax(logits, axis=-1)
        token, self._key = self._draw_with(logits, self._key)
        return token

    def _draw_with(self, logits: mx.array, key: mx.array) -> tuple[mx.array, mx.array]:
        """One row's token (``logits`` of shape ``(1, vocab)``; the normalisation runs over the
        whole array) drawn with the subkey split from ``key``, and the key after that split."""
        # The scale in the logits' dtype, as a Python float would multiply them (a float32
        # array would promote half-precision logits); made once, not per token.
        scale = self._scale_array
        if scale is None or scale.dtype != logits.dtype:
            scale = self._scale_array = mx.array(self._scale, dtype=logits.dtype)
        if self._top_p is None and self._top_k is None:
            return _compiled_normalised_draw(logits, key, scale)
        return _compiled_draw(self._filtered(logits), key, scale)

    def _filtered(self, logits: mx.array) -> mx.array:
        """One row's log-probabilities with top-p and top-k applied (before the temperature)."""
        logprobs = _normalise(logits)
        if self._top_p is not None:
            logprobs = apply_top_p(logprobs, self._top_p)
        if self._top_k is not None:
            logprobs = apply_top_k(logprobs, self._top_k)
        return logprobs

    def sample_ahead(self, logits: mx.array) -> mx.array:
        """Sample each row of a ``(n, vocab)`` block as ``n`` successive calls would, without
        advancing the key: row ``i`` gets exactly what the ``i+1``-th call from now would
        return for ``logits[i : i + 1]``. Returns shape ``(n,)``. Follow it with
        :meth:`commit` to keep the first rows, before any other call.

        Rows are sampled one by one with the same ``(1, vocab)`` shape as :meth:`__call__`
        (a new shape would compile top-p again), and the per-row ops are microseconds next to
        the forward pass that produced the block."""
        samples = self._draw_ahead(logits)
        if self.logprobs is not None:
            self._ahead_logprobs = [
                pending_logprobs(logits[i : i + 1], samples[i : i + 1], self.logprobs)
                for i in range(int(logits.shape[0]))
            ]
        return samples

    def _draw_ahead(self, logits: mx.array) -> mx.array:
        rows = int(logits.shape[0])
        if rows < 1:
            raise ValueError("sample_ahead needs at least one row")
        self._ahead_from = self._key
        if self.greedy:  # greedy never splits the key (as __call__)
            self._ahead = [self._key] * rows
            return mx.argmax(logits, axis=-1)
        key, keys, samples = self._key, [], []
        for i in range(rows):
            sample, key = self._draw_with(logits[i : i + 1], key)
            keys.append(key)
            samples.append(sample)
        self._ahead = keys
        return mx.concatenate(samples)

    def commit(self, n: int) -> None:
        """Keep the first ``n`` rows of the last :meth:`sample_ahead`: the key advances as if
        ``n`` tokens had been sampled one by one. Raises :class:`RuntimeError` when no
        ``sample_ahead`` is pending or the key moved since, :class:`ValueError` for ``n``
        outside ``[1, rows]``."""
        if self._ahead_from is not self._key or not self._ahead:
            raise RuntimeError("commit() needs a sample_ahead() with no other sampling since")
        if not 1 <= n <= len(self._ahead):
            raise ValueError(f"commit() takes 1 to {len(self._ahead)} rows, not {n}")
        self._key = self._ahead[n - 1]
        self._ahead, self._ahead_from = [], None
        self._logprobs.extend(self._ahead_logprobs[:n])
        self._ahead_logprobs = []
