"""Speculative decoding with an n-gram (prompt-lookup) proposer: no draft model, lossless.

When an answer copies from its context (code editing, "repeat this", quoting, and the loops a
small model falls into), the tokens that follow the last few tokens have usually been seen
before. :class:`NGramProposer` finds the most recent earlier occurrence of the last ``n`` tokens
and proposes what followed it; one forward pass over ``[pending, *draft]`` then checks the whole
draft and yields up to ``len(draft) + 1`` tokens for about the price of one.

**Contract of a speculative step** (:func:`speculative_step`, or :func:`start_verification` then
:meth:`Verification.finish` to overlap the host with the device). Inputs: the model, its per-layer
cache list, the request's :class:`~skulk.engine._sampling.Sampler`, ``pending`` (the latest sampled
token, *not yet fed*: the cache holds every token before it — the invariant of plain decoding,
:class:`~skulk.engine._batch.Batch`'s single-row path; an ``int`` or a ``(1,)`` mx array, possibly
still being computed) and a non-empty ``draft``. It runs the model once on ``[pending, *draft]``
(``k + 1`` positions), samples all ``k + 1`` rows with :meth:`Sampler.sample_ahead` — row ``i`` with
the subkey plain decoding would use for that position — and accepts drafts while
``sample[i] == draft[i]``. It returns ``(accepted, next_pending)``: ``accepted`` the ``m`` drafts
kept (``0 <= m <= k``) and ``next_pending`` the sample at row ``m`` (the correction, or the bonus
token when all ``k`` were kept); the sequence grew by ``[*accepted, next_pending]`` after
``pending``. Afterwards the sampler's key has advanced ``m + 1`` times (as after ``m + 1`` plain
tokens) and the cache holds exactly the context up to ``accepted[-1]`` (it was trimmed by
``k - m``), so ``next_pending`` is the new pending token: the invariant holds.

**Why lossless.** At every drafted position the token sampled is the one plain decoding would
have sampled there with the same key and the same context (the context *is* the same as long
as the drafts before it were accepted), so the emitted sequence is exactly the plain one:
greedy output is identical, a seeded request gives the same tokens with and without
speculation (and whatever runs beside it), and at ``temperature > 0`` the distribution is the
model's. For a deterministic draft token ``d`` this *is* rejection sampling: ``d`` is accepted
with probability ``p(d)``; on rejection the token is distributed as ``p`` restricted to
``≠ d``, renormalised. "Identical" assumes the forward pass gives the same logits for a
position whether it is computed alone or inside a block; true to the bit on the CPU backend
(checked by the tests), while a GPU kernel may differ in the last bits, which can flip a
near-tie (as in every speculative decoder).

**Caches.** Only caches that can drop the rejected tail (``mlx_lm`` ``KVCache``,
``QuantizedKVCache``, a ``RotatingKVCache`` while the block fits its window; see
:func:`can_speculate`); others raise :class:`SpeculationUnsupported` before the model runs.

**When it pays** is measured, not guessed: :class:`SpeculationController` compares the wall
time per token of recent speculative steps with that of plain steps (as the caller sees them,
overlap of host and device included), stops drafting — backing off exponentially, probing
again later — when drafts do not pay or are not kept, and shortens the draft when late
positions are rarely accepted. :class:`SpeculativeDecoder` ties proposer, controller and step
into a single-row decode loop that keeps plain decoding's overlap of host and device, and can
hand its state back to plain decoding (:meth:`~SpeculativeDecoder.detach`) when another request
joins; its :meth:`~SpeculativeDecoder.statistics` (drafted, accepted, steps) give the acceptance
rate for diagnostics.

**Ends.** A step may return tokens past an end token or stop string: the caller feeds them in
order and stops where its ``TokenOutput`` finishes, as with plain steps; the cache then holds a
few tokens past the emitted ones (trim it before keeping it, e.g. in a prefix cache).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Final, cast

import mlx.core as mx
from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

from skulk.engine._sampling import Sampler
from skulk.engine._speculation_control import (
    SpeculationController,
    SpeculationStatistics,
)

#: The n-gram lengths the proposer matches, longest first.
DEFAULT_MAX_NGRAM: Final = 3
DEFAULT_MIN_NGRAM: Final = 1

_async_eval = cast(Callable[..., None], mx.async_eval)  # untyped in mlx's stubs

#: Drops the last ``n`` positions of a cache (a rejected draft's).
Trim = Callable[[Sequence[Any], int], None]


def _trim(cache: Sequence[Any], n: int) -> None:
    trim_prompt_cache(list(cache), n)


class SpeculationUnsupported(Exception):
    """The model's cache cannot drop a rejected draft (a state-space layer, a sliding window
    the block would overflow): decode this request plainly."""


class NGramProposer:
    """Proposes a request's next tokens by copying what followed the last ``n`` tokens the
    most recent time they occurred (``n`` from ``max_ngram`` down to ``min_ngram``).

    Holds the request's token history — the prompt, then every token sampled, each appended
    once, in order. An index per ``n`` maps each n-gram to the position after its latest
    occurrence that has a follower, updated as tokens are appended, so :meth:`append` costs
    ``O(max_ngram)`` and :meth:`propose` ``O(max_ngram + k)``, whatever the history's length.
    A match that runs into the present copies on from its own output (``a b a b`` → ``a b …``),
    so a repeating loop is drafted to any length.
    """

    def __init__(
        self,
        tokens: Iterable[int] = (),
        *,
        min_ngram: int = DEFAULT_MIN_NGRAM,
        max_ngram: int = DEFAULT_MAX_NGRAM,
    ) -> None:
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, not {min_ngram}, {max_ngram}")
        self._min, self._max = min_ngram, max_ngram
        self._tokens: list[int] = []
        self._index: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_ngram, max_ngram + 1)
        }
        self.extend(tokens)

    def __len__(self) -> int:
        return len(self._tokens)

    @property
    def tokens(self) -> Sequence[int]:
        """The history (read-only view by convention)."""
        return self._tokens

    def append(self, token: int) -> None:
        at = len(self._tokens)
        for n, index in self._index.items():
            if at >= n:  # the n-gram ending just before ``token`` is now followed, at ``at``
                index[tuple(self._tokens[at - n : at])] = at
        self._tokens.append(token)

    def extend(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.append(token)

    def propose(self, k: int) -> list[int]:
        """Up to ``k`` tokens to follow the history; ``[]`` when no suffix was seen before."""
        tokens, size = self._tokens, len(self._tokens)
        if k <= 0:
            return []
        for n in range(min(self._max, size), self._min - 1, -1):
            start = self._index[n].get(tuple(tokens[size - n :]))
            if start is None:
                continue
            draft: list[int] = []
            for pos in range(start, start + k):
                draft.append(tokens[pos] if pos < size else draft[pos - size])
            return draft
        return []


def can_speculate(cache: Sequence[Any], new_tokens: int) -> bool:
    """Whether ``cache`` can take ``new_tokens`` more positions and drop them again: every layer
    trimmable, and a sliding-window layer (``max_size``) with room for all of them (past its
    window a rotating cache overwrites what a trim would need)."""
    layers = list(cache)
    if not layers or not can_trim_prompt_cache(layers):
        return False
    while layers:
        layer = layers.pop()
        layers.extend(getattr(layer, "caches", ()))  # a CacheList holds several
        max_size = getattr(layer, "max_size", None)
        if isinstance(max_size, int) and int(layer.offset) + new_tokens > max_size:
            return False
    return True


class Verification:
    """A verify pass in flight (from :func:`start_verification`); :meth:`finish` waits for it.
    Nothing else may use the cache or the sampler in between."""

    def __init__(
        self,
        cache: Sequence[Any],
        sampler: Sampler,
        draft: list[int],
        samples: mx.array,
        trim: Trim = _trim,
    ) -> None:
        self.draft = draft
        self._trim = trim
        self._cache = cache
        self._sampler = sampler
        self._samples = samples
        self._done = False

    def finish(self) -> tuple[list[int], int]:
        """``(accepted, next_pending)``; trims the cache and advances the sampler's key (see
        the module's contract). Call once."""
        if self._done:
            raise RuntimeError("verification already finished")
        self._done = True
        sampled = cast(list[int], self._samples.tolist())
        m = 0
        while m < len(self.draft) and sampled[m] == self.draft[m]:
            m += 1
        self._sampler.commit(m + 1)
        self._trim(self._cache, len(self.draft) - m)
        return self.draft[:m], sampled[m]


def start_verification(
    model: Callable[..., mx.array],
    cache: Sequence[Any],
    sampler: Sampler,
    pending: int | mx.array,
    draft: Sequence[int],
    trim: Trim = _trim,
) -> Verification:
    """Queue the model on ``[pending, *draft]`` and the sampling of its ``k + 1`` rows, without
    waiting; ``pending`` may be an array still being computed. Raises
    :class:`SpeculationUnsupported` (before running anything) for a cache that cannot trim."""
    if not draft:
        raise ValueError("an empty draft has nothing to verify: take a plain step")
    if not can_speculate(cache, len(draft) + 1):
        raise SpeculationUnsupported("this model's cache cannot drop a rejected draft")
    head = pending.reshape(1) if isinstance(pending, mx.array) else mx.array([pending], mx.uint32)
    block = mx.concatenate([head, mx.array(list(draft), head.dtype)])
    logits = model(block[None], cache=cache)[0]
    samples = sampler.sample_ahead(logits)
    _async_eval(samples)
    return Verification(cache, sampler, list(draft), samples, trim)


def speculative_step(
    model: Callable[..., mx.array],
    cache: Sequence[Any],
    sampler: Sampler,
    pending: int | mx.array,
    draft: Sequence[int],
) -> tuple[list[int], int]:
    """Verify ``draft`` after ``pending`` in one forward pass: ``(accepted, next_pending)``.
    See the module docstring for the exact contract."""
    return start_verification(model, cache, sampler, pending, draft).finish()


class SpeculativeDecoder:
    """One request's single-row decode loop with speculation; what an engine's single-row path
    runs instead of plain steps when exactly one request is active.

    Takes over from plain decoding's state (the invariant of
    :class:`~skulk.engine._batch.Batch`'s single-row path): the cache holds the prompt and the
    tokens emitted so far, and ``pending`` is the next sampled token, not yet fed nor returned
    (a ``(1,)`` array, may still be computing).
    ``tokens`` are appended to the proposer's history: with a fresh proposer, everything the
    cache holds; with one reused from an earlier spell, what was emitted since.

    :meth:`step` returns the tokens whose values became known, in order, never one twice, at
    most ``max_tokens`` in all, ``pending`` included (the caller feeds them to its
    ``TokenOutput`` and stops at an end token or stop string, as with plain steps). Between
    steps the cache may also hold a verify pass's draft (trimmed when the pass finishes).
    :meth:`detach` hands the state back to plain decoding (when a second request joins), the
    cache exact again; a later decoder can take over, given the same ``controller`` (what it
    measured) and ``proposer`` (with every token emitted in between appended).

    Like plain decoding it queues the next forward pass before it waits for the current one,
    so host and device overlap: while the pending token is still computing, the draft is
    proposed from the history without it and starts with a guess for it, so the first drafted
    token that counts is checked against the real pending token.
    """

    def __init__(
        self,
        model: Callable[..., mx.array],
        cache: Sequence[Any],
        sampler: Sampler,
        pending: mx.array,
        tokens: Iterable[int],
        max_tokens: int,
        *,
        controller: SpeculationController | None = None,
        proposer: NGramProposer | None = None,
        clock: Callable[[], float] = time.perf_counter,
        trim: Trim = _trim,
    ) -> None:
        self._model = model
        self._trim = trim
        self._cache = cache
        self._sampler = sampler
        self._lazy: mx.array | None = pending  # the pending token, not yet returned
        self._verification: Verification | None = None
        self.controller = controller or SpeculationController()
        self.proposer = proposer or NGramProposer()
        self.proposer.extend(tokens)
        self._remaining = max_tokens
        self._clock = clock
        self._last: float | None = None  # the first step waits for the prefill: not timed
        # an unsupported cache never speculates (checked once: the test is per layer type)
        self._speculate = can_speculate(cache, 1)

    @property
    def finished(self) -> bool:
        """Whether ``max_tokens`` tokens were returned."""
        return self._remaining <= 0

    def statistics(self) -> SpeculationStatistics:
        return self.controller.statistics()

    def step(self) -> list[int]:
        """The next tokens (one or more); queues the work for the ones after them."""
        if self._remaining <= 0:
            raise RuntimeError("generation already finished")
        verification, self._verification = self._verification, None
        if verification is not None:
            accepted, nxt = verification.finish()
            out = [*accepted, nxt]
            self.proposer.extend(out)
            self._remaining -= len(out)
            # before the next launch, so that it is decided knowing this pass (the launch's
            # own cost is counted in the next step)
            self._record(len(out), speculative=True)
            self.controller.record_verify(len(verification.draft), len(accepted))
            if self._remaining > 0:
                self._launch(mx.array([nxt], mx.uint32), known=True)
            return out
        pending, self._lazy = self._lazy, None
        assert pending is not None
        self._remaining -= 1
        if self._remaining > 0:
            self._launch(pending, known=False)
        token = int(cast(int, pending.item()))
        self.proposer.append(token)
        self._record(1, speculative=self._verification is not None)
        return [token]

    def _record(self, tokens: int, *, speculative: bool) -> None:
        """Report the seconds since the previous step returned (what the caller's throughput
        sees, its own work on the tokens included); not for the first step, which waited for
        the prefill."""
        now, last = self._clock(), self._last
        self._last = now
        if last is not None:
            self.controller.record_step(tokens, now - last, speculative=speculative)

    def _launch(self, pending: mx.array, *, known: bool) -> None:
        """Queue the forward pass after ``pending``: a verify pass when a draft is worth it,
        else a plain one. ``known``: ``pending`` is in the proposer's history already."""
        # a verify step returns up to k + 1 tokens: never more than remain
        k = min(self.controller.draft_length(), self._remaining - 1) if self._speculate else 0
        draft: list[int] = []
        if k > 0:
            draft = self.proposer.propose(k) if known else self.proposer.propose(k + 1)[1:]
        if draft and can_speculate(self._cache, len(draft) + 1):
            self._verification = start_verification(
                self._model, self._cache, self._sampler, pending, draft, self._trim
            )
        else:
            self._launch_plain(pending)

    def _launch_plain(self, pending: mx.array) -> None:
        """Queue a plain forward pass after ``pending`` (what ``Batch``'s plain step does)."""
        logits = self._model(pending[None], cache=self._cache)[:, -1, :]
        self._lazy = self._sampler(logits)
        _async_eval(self._lazy)

    def detach(self) -> tuple[list[int], mx.array | None]:
        """Hand the request back to plain decoding: ``(tokens, pending)``. ``tokens`` finished
        a verify pass in flight and must be emitted first, as if :meth:`step` had returned
        them; then the cache holds every token before ``pending``, the next token (a ``(1,)``
        array, not yet returned; ``None`` when ``max_tokens`` were reached). Use the decoder
        no more afterwards."""
        out: list[int] = []
        verification, self._verification = self._verification, None
        if verification is not None:
            accepted, nxt = verification.finish()
            out = [*accepted, nxt]
            self.proposer.extend(out)
            self._remaining -= len(out)
            if self._remaining > 0:
                self._launch_plain(mx.array([nxt], mx.uint32))
        pending, self._lazy = self._lazy, None
        self._remaining = 0
        return out, pending
