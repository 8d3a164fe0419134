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
from typing import TYPE_CHECKING, Any

from mlx_lm.models.cache import KVCache, LRUPromptCache

if TYPE_CHECKING:
    from skulk.engine._forward import Forward

#: Without ``--prefix-cache-memory``: 256 MiB of kept prefixes per runner.
DEFAULT_PREFIX_CACHE_BYTES = 256 * 1024 * 1024
_MODEL = "model"  # LRUPromptCache keys entries by model too; a runner has one


class PrefixCache:
    """Kept KV state of token prefixes, at most ``max_bytes`` (``0``: keeps nothing). Entries
    are made and copied through ``forward`` (:class:`~skulk.engine._forward.Forward`), so on a
    sharded instance every rank keeps the same entries of its own layers."""

    def __init__(self, max_bytes: int, forward: Forward) -> None:
        self.max_bytes = max_bytes
        self._forward = forward
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
        # the whole prompt kept: compute its last token again
        reused = min(len(tokens) - len(rest), len(tokens) - 1)
        if reused <= 0:
            return None
        self.hits += 1
        self.reused_tokens += reused
        return self._forward.copy(cache, reused), reused

    def store(self, tokens: Sequence[int], cache: Sequence[Any]) -> None:
        """Keep ``cache`` (a row's single-row cache) as the state of ``tokens``; the cache must
        hold at least ``len(tokens)`` tokens (more are cut off)."""
        if self.max_bytes <= 0 or not tokens:
            return
        if not self.supports(cache) or any(c.keys is None or c.offset < len(tokens) for c in cache):
            return
        if sum(_entry_bytes(c, len(tokens)) for c in cache) > self.max_bytes:
            return
        kept = self._forward.keep(cache, len(tokens))
        if kept is not None:
            self._lru.insert_cache(_MODEL, list(tokens), kept)


def _entry_bytes(layer: Any, n: int) -> int:
    """The bytes ``n`` tokens of a ``KVCache`` layer take once kept."""
    k, v = layer.keys, layer.values
    per = k.shape[0] * k.shape[1] * k.shape[3] * k.dtype.size
    per += v.shape[0] * v.shape[1] * v.shape[3] * v.dtype.size
    return int(per * n)
