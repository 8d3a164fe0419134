"""Continuous batching: the concurrent requests of one runner share each decode forward pass.

A request goes through two stages on the runner's main thread:

* :class:`Prefill` computes its prompt into a cache of its own, one chunk of at most
  :data:`~skulk.engine._budget.PREFILL_STEP` tokens per call (fewer on a slow model:
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
current ones are handed out, so host and device overlap. On a pipeline that overlaps
micro-batches the next tokens may be a :class:`~skulk.engine._forward.Later` (the pass is
still with the other ranks): a step completes it first, and so does a change of the rows.

Plain data and mlx, no I/O: the runner's scheduler (:mod:`skulk.engine._scheduler`) decides
when to run a prefill chunk and when a decode step. Every pass and every change of a cache's
layout goes through the engine's :class:`~skulk.engine._forward.Forward`, which on a sharded
instance is distributed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import attrs
import mlx.core as mx

from skulk.engine._budget import PREFILL_STEP
from skulk.engine._engine import Engine, Step, TokenOutput
from skulk.engine._forward import Later
from skulk.engine._grammar import Constraint, mask_rows
from skulk.engine._rows import sample_rows
from skulk.engine._sampling import Sampler
from skulk.engine._speculate import NGramProposer, SpeculativeDecoder
from skulk.engine._speculation_control import SpeculationController
from skulk.engine._tool_parse import ToolText
from skulk.wire.runner import FinishReason, SamplingParams, Usage

_async_eval = cast(Callable[..., None], mx.async_eval)  # untyped in mlx's stubs


@attrs.define(eq=False)
class Row:
    """One request's decode state. ``tokens``: its prompt, then every token sampled for it;
    ``fed``: how many of them its KV cache holds (what a prefix cache may keep);
    ``cached_tokens``: prompt tokens reused from the prefix cache; ``reserved``: KV bytes the
    runner's budget holds for it; ``queued_at`` (monotonic seconds) when it was ready for the
    budget, ``queue_seconds`` how long it waited for it; ``constraint``: its grammar state
    when it asked for structured output (see :func:`_hand_out` and :meth:`Batch.step`);
    ``tool_text``: its emitted text, kept when it offered tools to a model with a tool parser
    (:mod:`skulk.engine._tool_parse`)."""

    request_id: str
    out: TokenOutput
    sampler: Sampler
    tokens: list[int]
    fed: int = 0
    cached_tokens: int = 0
    reserved: int = 0
    queued_at: float = 0.0
    queue_seconds: float = 0.0
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
            chunk = mx.array(prompt[self._pos : self._pos + n])[None]
            self._engine.forward.fill(chunk, self.cache)
            self._pos += n
            self.row.fed = self._pos
            self.chunks += 1
            return None
        logits = self._engine.forward(mx.array(prompt[self._pos :])[None], self.cache)
        last = logits[:, -1, :]
        if self.row.constraint is not None:  # the first token is constrained too
            last = self.row.constraint.mask(last)
        first = self.row.sampler(last)
        _async_eval(first)
        self.row.fed = len(prompt)
        return first


class Batch:
    """The rows decoding together; see the module docstring for the cache layout."""

    def __init__(self, engine: Engine, speculative_tokens: int = 0) -> None:
        self._engine = engine
        self.speculative_tokens = speculative_tokens
        self.rows: list[Row] = []
        self._cache: list[Any] = []
        # (rows,): each row's next token, not yet fed (a Later: its pass still in flight)
        self._pending: mx.array | Later | None = None
        self._decoder: SpeculativeDecoder | None = None  # a lone row speculating

    def __len__(self) -> int:
        return len(self.rows)

    def add(self, row: Row, cache: list[Any], first: mx.array) -> None:
        """Join ``row`` (its prompt in ``cache``, ``first`` its first sampled token) to the
        batch; it decodes from the next :meth:`step`. Call :meth:`settle` first."""
        assert self._decoder is None, "settle() before add()"
        self._resolve()
        if self.rows:
            assert isinstance(self._pending, mx.array)
            first = mx.concatenate([self._pending, first])
        self._cache = self._engine.forward.join(self._cache, len(self.rows), cache)
        self._pending = first
        self.rows.append(row)

    def _resolve(self) -> None:
        """Complete the pass in flight, if any (:meth:`~skulk.engine._forward.Forward.start`)."""
        if isinstance(self._pending, Later):
            self._pending = self._pending.value()

    def step(self) -> list[tuple[Row, Step]]:
        """Hand out every row's next token (the caller removes the rows that finished)."""
        self._resolve()
        if len(self.rows) == 1 and self.speculative_tokens > 0 and self.rows[0].constraint is None:
            return self._speculative_step(self.rows[0])
        current = self._pending
        assert isinstance(current, mx.array) and self.rows, "step() on an empty batch"
        rows = list(self.rows)
        if any(r.constraint is not None for r in rows):
            return self._constrained_step(rows, current)
        if any(not r.out.next_is_last for r in rows):
            self._pending = self._forward(current)
            if isinstance(self._pending, mx.array):
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
            if isinstance(self._pending, mx.array):
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
            assert isinstance(self._pending, mx.array), "step() on a finished row"
            spec = row.speculation
            if spec is None:
                controller = SpeculationController(self.speculative_tokens)
                spec = row.speculation = Speculation(NGramProposer(), controller)
            self._decoder = SpeculativeDecoder(
                self._engine.forward,
                self._cache,
                row.sampler,
                self._pending,
                row.tokens[len(spec.proposer) :],
                row.out.max_tokens - row.out.completion_tokens,
                controller=spec.controller,
                proposer=spec.proposer,
                trim=self._engine.forward.trim,
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

    def _forward(self, tokens: mx.array) -> mx.array | Later:
        """The next tokens of ``tokens``' pass: lazy, or later if the pass is in flight."""
        out = self._engine.forward.start(tokens[:, None], self._cache)
        constraints = [r.constraint if r.finish_reason is None else None for r in self.rows]
        samplers = [r.sampler for r in self.rows]

        def sample(logits: mx.array) -> mx.array:
            return sample_rows(mask_rows(logits[:, -1, :], constraints), samplers)

        return out.then(sample) if isinstance(out, Later) else sample(out)

    def remove(self, row: Row, *, keep_cache: bool = False) -> list[Any] | None:
        """Take ``row`` out of the batch; with ``keep_cache``, return its own single-row cache
        (holding ``row.fed`` tokens) for the prefix cache."""
        self._resolve()
        i = self.rows.index(row)
        forward = self._engine.forward
        self._cache, own, keep = forward.drop(self._cache, len(self.rows), i, keep_cache=keep_cache)
        if not keep:
            self._pending, self._decoder = None, None
        elif isinstance(self._pending, mx.array):
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
