"""The rows of a decode batch in one forward pass: their KV caches joined and split, and each
row's token sampled with its own sampler.

Used through :class:`~skulk.engine._forward.Forward` (by :mod:`skulk.engine._batch`), and by
the other ranks of a sharded instance when they replay rank 0's joins and drops
(:mod:`skulk.engine._sharded_forward`, where every rank keeps one batch of its own layers'
caches), so all lay their rows out the same way:

* one row: that request's plain single-row cache (mlx-lm's ``KVCache`` per layer), so a lone
  stream decodes exactly as it would alone — no padding, no mask, no copy;
* two or more rows: mlx-lm's batch caches (``BatchKVCache``: left-padded rows), built with
  ``merge`` and grown with ``extend``; a row leaves with ``filter``, and when one row is left
  its cache is ``extract``\\ ed back into a plain one.

Rows join at the end and keep their order, so whoever applies the same joins and leaves in
the same order holds the same layout. Plain mlx, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from skulk.engine._sampling import Sampler


def join_rows(cache: list[Any], rows: int, own: list[Any]) -> list[Any]:
    """The caches of a batch of ``rows`` rows (``cache``; ``[]`` when empty) with a new last
    row whose prompt is in ``own`` (its single-row cache, which the batch takes over)."""
    if rows == 0:
        return own
    if rows == 1:
        return [type(a).merge([a, b]) for a, b in zip(cache, own, strict=True)]
    for batched, single in zip(cache, own, strict=True):
        batched.extend(type(single).merge([single]))
    return cache


def drop_row(
    cache: list[Any], rows: int, i: int, *, keep_cache: bool = False
) -> tuple[list[Any], list[Any] | None, list[int]]:
    """Take row ``i`` out of a batch of ``rows`` rows: the batch's caches now (``[]`` when
    none is left), row ``i``'s own single-row cache when ``keep_cache`` (else ``None``), and
    the indices of the rows that stay, in order (for the caller's per-row arrays)."""
    keep = [j for j in range(rows) if j != i]
    if rows == 1:
        return [], cache if keep_cache else None, keep
    own = [c.extract(i) for c in cache] if keep_cache else None
    if len(keep) == 1:
        return [c.extract(keep[0]) for c in cache], own, keep
    index = mx.array(keep)
    for c in cache:
        c.filter(index)
    return cache, own, keep


def sample_rows(logits: mx.array, samplers: Sequence[Sampler]) -> mx.array:
    """Each row of ``logits`` (``(rows, vocab)``) sampled with that row's sampler (its own key,
    temperature, top-p, top-k), so a seeded row draws what it would alone: ``(rows,)``."""
    if len(samplers) == 1:
        return samplers[0](logits)
    return mx.concatenate([s(logits[i : i + 1]) for i, s in enumerate(samplers)])


def kv_bytes_per_token(cache: list[Any]) -> int:
    """Bytes of KV state one token of one row takes in ``cache`` (a single-row or batch cache
    that has seen at least one token): keys and values as the layers store them, so kv heads,
    head dim and dtype are whatever the checkpoint says. Layers whose state does not grow per
    token (recurrent state, quantized tuples) count nothing; at least 1."""
    total = 0
    for layer in cache:
        for arr in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(arr, mx.array) and arr.ndim == 4:
                total += arr.shape[1] * arr.shape[3] * arr.dtype.size
    return max(1, total)
