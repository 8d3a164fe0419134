"""Continuous batching: the concurrent requests of one runner share each decode forward pass.

A request goes through two stages on the runner's main thread:

* :class:`Prefill` computes its prompt into a cache of its own, one chunk of at most
  :data:`~skulk.engine._engine.PREFILL_STEP` tokens per call (fewer on a slow model:
  :class:`PrefillPacer`), so the runner can run a decode step of the running streams between
  two chunks of a long prompt (nothing stalls for a whole prompt). Its last prompt token goes
  through the model alone and gives the first sampled token.
* :class:`Batch` then holds it as one row of the decode batch: every :meth:`Batch.step` feeds
  each row's pending token through one forward pass of the model and samples each row's next
  token with the row's own :class:`~skulk.engine._sampling.Sampler` (own key, temperature,
  top-p, top-k) from the row's own logits, so a seeded request draws the same keys whatever runs
  beside it. Rows join between steps (:meth:`Batch.add`) and leave when they finish or are
  cancelled (:meth:`Batch.remove`).

The cache layout follows the number of rows. With one row the batch holds that request's plain
single-row cache (mlx-lm's ``KVCache`` per layer) and decodes as mlx-lm's own single-stream loop
does: no padding, no mask, no copy — the single-stream path costs nothing extra (it is the one
single-row decode path: the warm-up and in-process references use it too, through
:mod:`skulk.engine._single`). There, with ``speculative_tokens > 0``, n-gram speculative decoding
(:class:`~skulk.engine._speculate.SpeculativeDecoder`) takes over; it drafts only while it
measures that drafting pays, and :meth:`Batch.settle` hands the row back to plain decoding
before another row joins (the same tokens either way: speculation is lossless). A second row
merges the caches into mlx-lm's batch caches (``BatchKVCache``:
left-padded rows, ``merge`` / ``extend`` / ``filter`` / ``extract``); when one row is left its
cache is extracted back into a plain one.

As in mlx-lm's own ``generate_step``, the next tokens are computed asynchronously while the
current ones are handed out, so host and device overlap.

Plain data and mlx, no I/O: the runner's loop (:mod:`skulk.engine._child`) decides when to run
a prefill chunk and when a decode step.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, cast

import attrs
import mlx.core as mx

from skulk.engine._engine import PREFILL_STEP, Engine, Step, TokenOutput
from skulk.engine._grammar import Constraint, mask_rows
from skulk.engine._rows import drop_row, join_rows, sample_rows
from skulk.engine._sampling import Sampler
from skulk.engine._speculate import NGramProposer, SpeculationController, SpeculativeDecoder
from skulk.engine._tool_parse import ToolText
from skulk.wire.runner import FinishReason, SamplingParams, Usage

_async_eval = cast(Callable[..., None], mx.async_eval)  # untyped in mlx's stubs


@attrs.define(eq=False)
class Row:
    """One request's decode state. ``tokens``: its prompt, then every token sampled for it;
    ``fed``: how many of them its KV cache holds (what a prefix cache may keep);
    ``cached_tokens``: prompt tokens reused from the prefix cache; ``reserved``: KV bytes the
    runner's budget holds for it; ``constraint``: its grammar state when it asked for
    structured output (see :func:`_hand_out` and :meth:`Batch.step`); ``tool_text``: its
    emitted text, kept when it offered tools to a model with a tool parser
    (:mod:`skulk.engine._tool_parse`)."""

    request_id: str
    out: TokenOutput
    sampler: Sampler
    tokens: list[int]
    fed: int = 0
    cached_tokens: int = 0
    reserved: int = 0
    speculation: Speculation | None = None
    constraint: Constraint | None = None
    tool_text: ToolText | None = None

    @classmethod
    def open(
        cls,
        engine: Engine,
        request_id: str,
        tokens: Sequence[int],
        params: SamplingParams,
        constraint: Constraint | None = None,
    ) -> Row:
        """A row for ``tokens`` (from :meth:`Engine.tokenize`) with ``params`` (checked) and,
        for structured output, its ``constraint``."""
        engine.check_params(params)
        out = TokenOutput(engine.tokenizer, params, len(tokens), engine.context_length)
        sampler = Sampler(params, engine.vocab_size)
        return cls(request_id, out, sampler, list(tokens), constraint=constraint)

    def usage(self) -> Usage:
        return Usage(self.out.prompt_tokens, self.out.completion_tokens, self.cached_tokens)

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.out.finish_reason


@attrs.define(eq=False)
class Speculation:
    """What a row's speculative decoding learns across its single-row spells: its n-gram
    proposer (the tokens handed out, in order) and the controller's measurements."""

    proposer: NGramProposer
    controller: SpeculationController


class Prefill:
    """A row's prompt computed into its own cache, one chunk per :meth:`advance`.

    ``cache`` already holds the first ``start`` prompt tokens (a prefix-cache hit; 0 for a fresh
    cache); at least one prompt token is always computed here, since its logits give the first
    token.
    """

    def __init__(self, engine: Engine, row: Row, cache: list[Any], start: int = 0) -> None:
        if not 0 <= start < len(row.tokens):
            raise ValueError(f"start {start} leaves no prompt token to compute")
        self.row = row
        self.cache = cache
        self.chunks = 0
        self._engine = engine
        self._pos = start
        row.fed = start

    def advance(self, most: int = PREFILL_STEP) -> mx.array | None:
        """Compute the next chunk of the prompt (at most ``most`` tokens); ``None`` while more
        remain, then the first sampled token (shape ``(1,)``, computing asynchronously) once
        the whole prompt is in."""
        prompt = self.row.tokens[: self.row.out.prompt_tokens]
        remaining = len(prompt) - self._pos
        if remaining > 1:
            n = max(1, min(most, remaining - 1))
            self._engine.model(mx.array(prompt[self._pos : self._pos + n])[None], cache=self.cache)
            mx.eval([c.state for c in self.cache])
            self._pos += n
            self.row.fed = self._pos
            self.chunks += 1
            return None
        logits = self._engine.model(mx.array(prompt[self._pos :])[None], cache=self.cache)
        last = logits[:, -1, :]
        if self.row.constraint is not None:  # the first token is constrained too
            last = self.row.constraint.mask(last)
        first = self.row.sampler(last)
        _async_eval(first)
        self.row.fed = len(prompt)
        return first


#: A prefill chunk aims to take about this long (see :class:`PrefillPacer`).
PREFILL_TARGET_SECONDS = 0.25
#: The fewest tokens a prefill chunk holds (while more remain), and the first chunk's size
#: before anything was measured.
PREFILL_LEAST = 16
PREFILL_FIRST = 32


class PrefillPacer:
    """Sizes prefill chunks so that each takes about ``target`` seconds, from what earlier
    chunks took per token (a moving average over the runner's chunks, so a model's speed is
    learned once): a chunk is at most :data:`~skulk.engine._engine.PREFILL_STEP` tokens, and
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


class Batch:
    """The rows decoding together; see the module docstring for the cache layout."""

    def __init__(self, engine: Engine, speculative_tokens: int = 0) -> None:
        self._engine = engine
        self.speculative_tokens = speculative_tokens
        self.rows: list[Row] = []
        self._cache: list[Any] = []
        self._pending: mx.array | None = None  # (rows,): each row's next token, not yet fed
        self._decoder: SpeculativeDecoder | None = None  # a lone row speculating

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: Row, cache: list[Any], first: mx.array) -> None:
        """Join ``row`` (its prompt in ``cache``, ``first`` its first sampled token) to the
        batch; it decodes from the next :meth:`step`. Call :meth:`settle` first."""
        assert self._decoder is None, "settle() before add()"
        if self.rows:
            assert self._pending is not None
            first = mx.concatenate([self._pending, first])
        self._cache = join_rows(self._cache, len(self.rows), cache)
        self._pending = first
        self.rows.append(row)

    def step(self) -> list[tuple[Row, Step]]:
        """Hand out every row's next token (the caller removes the rows that finished)."""
        if len(self.rows) == 1 and self.speculative_tokens > 0 and self.rows[0].constraint is None:
            return self._speculative_step(self.rows[0])
        current = self._pending
        assert current is not None and self.rows, "step() on an empty batch"
        rows = list(self.rows)
        if any(r.constraint is not None for r in rows):
            return self._constrained_step(rows, current)
        if any(not r.out.next_is_last for r in rows):
            self._pending = self._forward(current)
            _async_eval(self._pending)
            for r in rows:
                r.fed += 1
        else:
            self._pending = None  # every row ends with this token: compute nothing more
        ids = [int(cast(int, current.item()))] if len(rows) == 1 else current.tolist()
        steps = []
        for r, token in zip(rows, cast(list[int], ids), strict=True):
            steps += _hand_out(r, [token])
        return steps

    def _constrained_step(self, rows: list[Row], current: mx.array) -> list[tuple[Row, Step]]:
        """A step of a batch holding a constrained row: the mask of a row's next token depends
        on the token handed out now, so the tokens are read (and accepted by their grammars,
        in :func:`_hand_out`) *before* the next forward pass is queued — no sampling ahead
        while a constrained row runs. Rows that just finished are left unmasked (their
        grammar is done; the token computed for them is never fed)."""
        ids = cast(list[int], current.tolist())
        steps = []
        for r, token in zip(rows, ids, strict=True):
            steps += _hand_out(r, [token])
        if any(r.finish_reason is None for r in rows):
            self._pending = self._forward(current)
            _async_eval(self._pending)
            for r in rows:
                r.fed += 1
        else:
            self._pending = None
        return steps

    def _speculative_step(self, row: Row) -> list[tuple[Row, Step]]:
        """A lone row's step through :class:`~skulk.engine._speculate.SpeculativeDecoder`,
        which drafts only while its controller measures that drafting pays; it takes over the
        row's plain state (cache, pending token) and keeps it until :meth:`settle`."""
        if self._decoder is None:
            assert self._pending is not None, "step() on a finished row"
            spec = row.speculation
            if spec is None:
                controller = SpeculationController(self.speculative_tokens)
                spec = row.speculation = Speculation(NGramProposer(), controller)
            self._decoder = SpeculativeDecoder(
                self._engine.model,
                self._cache,
                row.sampler,
                self._pending,
                row.tokens[len(spec.proposer) :],
                row.out.max_tokens - row.out.completion_tokens,
                controller=spec.controller,
                proposer=spec.proposer,
            )
            self._pending = None
        steps = _hand_out(row, self._decoder.step())
        # The decoder has queued the pass after the last token (unless it was the last): the
        # cache holds at least every token handed out but that one.
        row.fed = len(row.tokens) - 1
        return steps

    def settle(self) -> list[tuple[Row, Step]]:
        """Bring a speculating lone row back to the plain state (before another row joins):
        the tokens a verify pass in flight yields are handed out here (the caller emits them,
        and removes the row if they end it)."""
        if self._decoder is None:
            return []
        decoder, self._decoder = self._decoder, None
        tokens, self._pending = decoder.detach()
        row = self.rows[0]
        steps = _hand_out(row, tokens)
        row.fed = len(row.tokens)
        return steps

    def _forward(self, tokens: mx.array) -> mx.array:
        logits = self._engine.model(tokens[:, None], cache=self._cache)[:, -1, :]
        constraints = [r.constraint if r.finish_reason is None else None for r in self.rows]
        logits = mask_rows(logits, constraints)
        return sample_rows(logits, [r.sampler for r in self.rows])

    def remove(self, row: Row, *, keep_cache: bool = False) -> list[Any] | None:
        """Take ``row`` out of the batch; with ``keep_cache``, return its own single-row cache
        (holding ``row.fed`` tokens) for the prefix cache."""
        i = self.rows.index(row)
        self._cache, own, keep = drop_row(self._cache, len(self.rows), i, keep_cache=keep_cache)
        if not keep:
            self._pending, self._decoder = None, None
        elif self._pending is not None:
            self._pending = self._pending[mx.array(keep)]
        del self.rows[i]
        return own


def _hand_out(row: Row, tokens: list[int]) -> list[tuple[Row, Step]]:
    """Feed ``tokens`` to ``row``'s output, stopping at the one that ends it. A constrained
    row's grammar accepts each token (not EOS) as it is handed out; once its document is
    complete the row ends with ``"stop"`` at once (EOS is the only token left to sample)."""
    steps = []
    for token in tokens:
        row.tokens.append(token)
        step = row.out.feed(token, row.sampler.pop_logprobs())
        steps.append((row, step))
        if step.finish_reason is not None:
            break
        if row.constraint is not None:
            row.constraint.accept(token)
            if row.constraint.is_finished:
                steps.append((row, row.out.feed(row.constraint.eos_token)))
                break
    return steps


def batchable(cache: list[Any]) -> bool:
    """Whether every layer's cache type can be merged into a batch (mlx-lm's ``merge``)."""
    return all(callable(getattr(type(c), "merge", None)) for c in cache)


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
