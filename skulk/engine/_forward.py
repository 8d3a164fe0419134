"""The forward pass and the KV caches it works on: everything the scheduler asks of the model.

The scheduler (:mod:`skulk.engine._scheduler`), its batches and prefills
(:mod:`skulk.engine._batch`), speculation (:mod:`skulk.engine._speculate`), the prefix cache
(:mod:`skulk.engine._prefix_cache`) and embeddings (:mod:`skulk.engine._embed`) never call the
mlx model or touch a cache's layout themselves: they go through a :class:`Forward`. This one
runs the whole model in this process; :class:`~skulk.engine._sharded_forward.ShardForward`
runs the same calls on rank 0 of a sharded instance, where every call is also replayed by the
other ranks on their own layers (pipeline) or slices (tensor). Nothing above this interface
knows which it has, so every feature works on both.

The calls:

* :meth:`~Forward.__call__` — logits of ``tokens`` ``(rows, n)`` through ``cache``
  (lazy: the caller evaluates them; it must, see :class:`ShardForward`); :meth:`~Forward.start`
  — the same for a decode step, possibly still in flight (a :class:`Later`; see
  :attr:`~Forward.micro_batches`);
* :meth:`~Forward.fill` — feed ``tokens`` into ``cache`` and evaluate, no output (a prefill
  chunk);
* :meth:`~Forward.hidden` — the final hidden states (embeddings), lazy;
* cache layout: :meth:`~Forward.new_cache`, :meth:`~Forward.join` and :meth:`~Forward.drop`
  (rows of a decode batch, :mod:`skulk.engine._rows`), :meth:`~Forward.trim` (a rejected
  draft), :meth:`~Forward.keep` and :meth:`~Forward.copy` (prefix-cache entries);
* :meth:`~Forward.budgets` — the KV budget and prefix-cache bound, in this rank's bytes;
* the loop's hooks: :meth:`~Forward.guard` (a turn of work, under a deadline where peers are
  involved), :meth:`~Forward.idle` (how long the loop may block for frames), :meth:`~Forward.check`
  (after a failed step: is the forward pass itself still sound?) and :meth:`~Forward.close`.

Plain mlx, no I/O.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.models.cache import KVCache, make_prompt_cache, trim_prompt_cache

from skulk.engine._budget import kv_capacity
from skulk.engine._prefix_cache import DEFAULT_PREFIX_CACHE_BYTES
from skulk.engine._rows import drop_row, join_rows, kv_bytes_per_token


@attrs.frozen
class Budgets:
    """What a runner may hold, in its own (rank 0's) bytes: ``kv_bytes`` for running requests,
    ``prefix_bytes`` for kept prefixes, and the KV bytes one token takes."""

    kv_bytes: int
    prefix_bytes: int
    bytes_per_token: int


def states(cache: Sequence[Any] | None) -> list[Any]:
    """What evaluating a cache's update means: every layer's state arrays (none without one)."""
    return [] if cache is None else [c.state for c in cache]


def compact(cache: Sequence[Any], n: int) -> list[Any] | None:
    """A compact copy of the first ``n`` tokens of a single-row cache of plain ``KVCache``
    layers (what the prefix cache keeps), or ``None`` when it holds fewer or another kind."""
    kept = []
    for c in cache:
        keys, values = c.keys, c.values
        if type(c) is not KVCache or keys is None or values is None or c.offset < n:
            return None
        entry = KVCache()  # type: ignore[no-untyped-call]
        entry.keys = mx.contiguous(keys[..., :n, :])
        entry.values = mx.contiguous(values[..., :n, :])
        entry.offset = n
        kept.append(entry)
    mx.eval([(e.keys, e.values) for e in kept])
    return kept


class Later:
    """What a pass in flight will give (:meth:`Forward.start`): :meth:`value` computes it the
    first time (completing the pass: on a pipeline, waiting for the other ranks), once."""

    def __init__(self, make: Callable[[], mx.array]) -> None:
        self._make: Callable[[], mx.array] | None = make
        self._value: mx.array | None = None

    @property
    def done(self) -> bool:
        return self._make is None

    def value(self) -> mx.array:
        if self._make is not None:
            make, self._make = self._make, None
            self._value = make()
        assert self._value is not None
        return self._value

    def then(self, f: Callable[[mx.array], mx.array]) -> Later:
        """``f`` of the value, later."""
        return Later(lambda: f(self.value()))


class Forward:
    """The whole model in this process (see the module doc for the calls)."""

    #: Decode micro-batches the scheduler should keep apart: 1 (one batch) unless the ranks
    #: of a pipeline can work on different micro-batches at once (:meth:`start`).
    micro_batches = 1

    def __init__(self, model: Any) -> None:
        self.model = model
        self._bytes_per_token: int | None = None

    def __call__(self, tokens: mx.array, cache: list[Any] | None = None) -> mx.array:
        out: mx.array = self.model(tokens, cache=cache)
        return out

    def start(self, tokens: mx.array, cache: list[Any]) -> mx.array | Later:
        """The logits of a decode pass, like calling the forward pass (lazy), or — on a
        pipeline's rank 0 that overlaps micro-batches — a :class:`Later`: the pass is on its
        way through the other ranks, and its value completes it (passes complete in the
        order they started), so this rank can start another micro-batch meanwhile."""
        return self(tokens, cache)

    def fill(self, tokens: mx.array, cache: list[Any]) -> None:
        mx.eval([self.model.model(tokens, cache=cache), *states(cache)])

    def hidden(self, tokens: mx.array, cache: list[Any] | None = None) -> mx.array:
        out: mx.array = self.model.model(tokens, cache=cache)
        return out

    def layout(self) -> list[Any]:
        """A fresh cache to look at (its layer types), never computed through."""
        cache: list[Any] = make_prompt_cache(self.model)
        return cache

    def new_cache(self) -> list[Any]:
        """A fresh single-row KV cache (one entry per layer)."""
        return self.layout()

    def join(self, cache: list[Any], rows: int, own: list[Any]) -> list[Any]:
        return join_rows(cache, rows, own)

    def drop(
        self, cache: list[Any], rows: int, i: int, *, keep_cache: bool = False
    ) -> tuple[list[Any], list[Any] | None, list[int]]:
        return drop_row(cache, rows, i, keep_cache=keep_cache)

    def trim(self, cache: Sequence[Any], n: int) -> None:
        trim_prompt_cache(list(cache), n)

    def keep(self, cache: Sequence[Any], n: int) -> list[Any] | None:
        """A prefix-cache entry: the first ``n`` tokens of ``cache`` (see :func:`compact`)."""
        return compact(cache, n)

    def copy(self, fetched: list[Any], n: int) -> list[Any]:
        """A cache to compute on from ``fetched``, the prefix cache's own copy of a kept entry,
        cut to its first ``n`` tokens."""
        held = int(fetched[0].offset) if fetched else 0
        if held > n:
            trim_prompt_cache(fetched, held - n)
        return list(fetched)

    def budgets(
        self, kv_configured: int | None, prefix_configured: int | None, context_length: int
    ) -> Budgets:
        """The KV budget (``--kv-cache-memory``, else the default share of free memory) and the
        prefix-cache bound (``--prefix-cache-memory``, else the default), measured by running
        one token through a fresh cache."""
        per_token = self.bytes_per_token()
        return Budgets(
            kv_capacity(kv_configured, per_token, context_length),
            DEFAULT_PREFIX_CACHE_BYTES if prefix_configured is None else prefix_configured,
            per_token,
        )

    def bytes_per_token(self) -> int:
        """KV bytes one token of one request takes in this process's layers (measured once)."""
        if self._bytes_per_token is None:
            cache = self.new_cache()
            self.fill(mx.array([[0]]), cache)
            self._bytes_per_token = kv_bytes_per_token(cache)
        return self._bytes_per_token

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """One turn of the loop's work (``what``: its kind, for a trace)."""
        yield

    def idle(self, soon: bool = False) -> float | None:
        """The loop has nothing to compute: how long it may wait for a frame (``None``: as
        long as it takes); ``soon``: a request is being tokenized."""
        return None

    def warmed(self) -> None:
        """The warm-up is over."""

    def check(self, error: Exception) -> None:
        """A step failed with ``error``: raise if the forward pass can no longer be trusted
        (one process: the failure was the step's own)."""

    def close(self) -> None:
        """The runner stops."""
