"""A runner's KV budget: how much KV state its running requests may reserve, and the default.

Every admitted request reserves the KV bytes of its prompt plus its most new tokens up front
(:class:`KvBudget`), so the tokens it may still generate can never run the runner out of
memory; the scheduler (:mod:`skulk.engine._scheduler`) queues or refuses what does not fit.
A sharded instance's ranks agree on the fewest tokens any rank's budget holds
(:mod:`skulk.engine._sharded_forward`). Prefill chunks are sized by measured speed
(:class:`PrefillPacer`). Pure, no mlx.
"""

from __future__ import annotations

import os

import attrs

#: The most prompt tokens one prefill chunk computes.
PREFILL_STEP = 512

#: A prefill chunk aims to take about this long (see :class:`PrefillPacer`).
PREFILL_TARGET_SECONDS = 0.25
#: The fewest tokens a prefill chunk holds (while more remain), and the first chunk's size
#: before anything was measured.
PREFILL_LEAST = 16
PREFILL_FIRST = 32


class PrefillPacer:
    """Sizes prefill chunks so that each takes about ``target`` seconds, from what earlier
    chunks took per token (a moving average over the runner's chunks, so a model's speed is
    learned once): a chunk is at most :data:`PREFILL_STEP` tokens, and
    fewer where the model is slow. On a fast model that is every chunk; on a slow one (a large
    model on a CPU: 30 ms or more a token) a 512-token chunk would stall the running streams —
    and the runner's loop, whose heartbeat proves it alive — for many seconds, long enough to
    be taken for a wedged runner. The runner sizes its embedding groups the same way
    (:meth:`budget`), and feeds their times in too. Sans-IO: the caller times the passes."""

    def __init__(
        self,
        target: float = PREFILL_TARGET_SECONDS,
        least: int = PREFILL_LEAST,
        most: int = PREFILL_STEP,
        first: int = PREFILL_FIRST,
        smoothing: float = 0.5,
    ) -> None:
        self._target, self._least, self._most = target, least, most
        self._first, self._smoothing = first, smoothing
        self.seconds_per_token: float | None = None

    def size(self) -> int:
        """The most tokens the next chunk should compute."""
        return self.budget(self._most)

    def budget(self, most: int) -> int:
        """The most tokens a forward pass over fresh tokens (a prefill chunk, an embedding
        group) should compute, at most ``most``."""
        spt = self.seconds_per_token
        if spt is None:
            return min(most, self._first)
        if spt <= 0:
            return most
        return max(min(self._least, most), min(most, int(self._target / spt)))

    def record(self, tokens: int, seconds: float) -> None:
        """A chunk of ``tokens`` tokens took ``seconds``."""
        if tokens <= 0:
            return
        spt = max(seconds, 0.0) / tokens
        old = self.seconds_per_token
        self.seconds_per_token = spt if old is None else old + self._smoothing * (spt - old)


#: Without ``--kv-cache-memory`` a runner gives running requests' KV state this fraction of the
#: memory the machine had available once its weights were loaded, and never less than one
#: request of the model's full context (what placement admitted the instance with).
DEFAULT_KV_FRACTION = 0.5


@attrs.define
class KvBudget:
    """KV-cache bytes reserved for admitted requests, at most ``capacity``.

    A request reserves ``(prompt + its most new tokens) * bytes_per_token`` up front (its most
    new tokens: ``max_tokens``, capped at what the context leaves; the whole rest of the context
    without one), so the tokens it may still generate can never run the runner out of memory.
    """

    capacity: int
    bytes_per_token: int
    context_length: int
    used: int = 0

    def need(self, prompt_tokens: int, max_tokens: int | None) -> int:
        room = self.context_length - prompt_tokens
        new = room if max_tokens is None else min(max_tokens, room)
        return (prompt_tokens + new) * self.bytes_per_token

    def refusal(self, prompt_tokens: int, max_tokens: int | None) -> tuple[str, str] | None:
        """``(reason, message)`` for a request that could not fit even alone, else ``None``:
        ``prompt_too_long`` when its prompt alone (and one token) does not, else
        ``max_tokens_too_large``."""
        if self.need(prompt_tokens, 1) > self.capacity:
            return "prompt_too_long", (
                f"the prompt has {prompt_tokens} tokens; this runner's KV cache holds at most "
                f"{self.capacity // self.bytes_per_token - 1} prompt tokens"
            )
        if self.need(prompt_tokens, max_tokens) > self.capacity:
            most = self.capacity // self.bytes_per_token - prompt_tokens
            asked = (
                "no max_tokens (the rest of the context)"
                if max_tokens is None
                else (f"max_tokens {max_tokens}")
            )
            return "max_tokens_too_large", (
                f"{asked} with a prompt of {prompt_tokens} tokens does not fit this runner's KV "
                f"cache: max_tokens can be at most {most}"
            )
        return None

    def fits(self, need: int) -> bool:
        return self.used + need <= self.capacity

    def take(self, need: int) -> None:
        self.used += need

    def release(self, need: int) -> None:
        self.used = max(0, self.used - need)


def default_kv_budget(bytes_per_token: int, context_length: int, available: int) -> int:
    """The KV budget without ``--kv-cache-memory``: see :data:`DEFAULT_KV_FRACTION`."""
    return max(bytes_per_token * context_length, int(available * DEFAULT_KV_FRACTION))


def kv_capacity(configured: int | None, bytes_per_token: int, context_length: int) -> int:
    """A runner's KV budget in bytes: ``configured`` (``--kv-cache-memory``), else the default
    (:func:`default_kv_budget`) of the memory available now."""
    if configured is not None:
        return configured
    return default_kv_budget(bytes_per_token, context_length, available_memory())


def available_memory() -> int:
    """Bytes of memory the machine has free now (free pages; where the platform cannot say, as
    on macOS, its physical memory), 0 when it says nothing."""
    for name in ("SC_AVPHYS_PAGES", "SC_PHYS_PAGES"):
        try:
            pages = int(os.sysconf(name)) * int(os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            continue
        if pages > 0:
            return pages
    return 0
