"""A runner's prefix cache: KV state of token sequences already computed, reused by new prompts.

When a request ends, the KV state of its prompt and the tokens it generated (those the model
was fed) is kept, keyed by those tokens. A new prompt starts from the longest kept prefix of it
(a system prompt, the earlier turns of a chat) and computes only the rest, always at least its
last token, whose logits give the first new token. Entries are bounded in bytes and evicted
least recently used first.

The bookkeeping is mlx-lm's own ``LRUPromptCache`` (a token trie, an LRU, a byte bound, and
trimming a longer entry down to the common prefix — a chat's next turn re-tokenizes the
previous answer, so it often shares all but the last few tokens with the entry). It fits as is:
we key everything under one model, give it no entry-count limit (only the byte bound), and
store compact copies of the row's cache so an entry's bytes are the tokens it holds. Only
models whose every layer has a plain trimmable ``KVCache`` take part (a rotating window or a
recurrent state cannot be cut back to an arbitrary prefix).

Entries count against the prefix cache's own bound, never against the runner's KV budget: a
request that reuses one gets a copy, which is part of that request's own reservation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, LRUPromptCache, trim_prompt_cache

#: Without ``--prefix-cache-memory``: 256 MiB of kept prefixes per runner.
DEFAULT_PREFIX_CACHE_BYTES = 256 * 1024 * 1024
_MODEL = "model"  # LRUPromptCache keys entries by model too; a runner has one


class PrefixCache:
    """Kept KV state of token prefixes, at most ``max_bytes`` (``0``: keeps nothing)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._lru = LRUPromptCache(max_size=1 << 62, max_bytes=max_bytes)
        self.hits = 0
        self.reused_tokens = 0

    @property
    def nbytes(self) -> int:
        return int(self._lru.nbytes)

    def __len__(self) -> int:
        return len(self._lru)

    @staticmethod
    def supports(cache: Sequence[Any]) -> bool:
        """Whether a model whose fresh cache is ``cache`` can use a prefix cache."""
        return all(type(c) is KVCache for c in cache)

    def fetch(self, tokens: Sequence[int]) -> tuple[list[Any], int] | None:
        """A copy of the cache for the longest kept prefix of ``tokens`` and its length (less
        than ``len(tokens)``), or ``None`` when nothing is kept for them."""
        if self.max_bytes <= 0 or len(tokens) < 2:
            return None
        cache, rest = self._lru.fetch_nearest_cache(_MODEL, list(tokens))
        if cache is None:
            return None
        reused = len(tokens) - len(rest)
        if reused >= len(tokens):  # the whole prompt is kept: compute its last token again
            trim_prompt_cache(cache, reused - len(tokens) + 1)
            reused = len(tokens) - 1
        if reused <= 0:
            return None
        self.hits += 1
        self.reused_tokens += reused
        return list(cache), reused

    def store(self, tokens: Sequence[int], cache: Sequence[Any]) -> None:
        """Keep ``cache`` (a row's single-row cache) as the state of ``tokens``; the cache must
        hold at least ``len(tokens)`` tokens (more are cut off)."""
        if self.max_bytes <= 0 or not tokens or not self.supports(cache):
            return
        n = len(tokens)
        kept = []
        for c in cache:
            if c.keys is None or c.offset < n:
                return
            entry = KVCache()  # type: ignore[no-untyped-call]
            entry.keys = mx.contiguous(c.keys[..., :n, :])
            entry.values = mx.contiguous(c.values[..., :n, :])
            entry.offset = n
            kept.append(entry)
        if sum(e.nbytes for e in kept) > self.max_bytes:
            return
        mx.eval([(e.keys, e.values) for e in kept])
        self._lru.insert_cache(_MODEL, list(tokens), kept)
