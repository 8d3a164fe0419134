"""Log-probabilities of sampled tokens (``SamplingParams.logprobs``), computed beside sampling.

Which distribution: the log-softmax of the logits the sampler is handed — the model's, after a
structured-output mask when the request has one, *before* temperature, top-p and top-k. That is
what OpenAI reports (a token's logprob does not change with ``temperature``), it is defined for
every token (top-p and top-k would give most alternatives ``-inf``), and greedy decoding picks
its maximum, so a greedy token's logprob is the top alternative's. The sampled token's value
is read from the same row as its alternatives, so the two always agree.

Cost is paid only by requests that ask: a :class:`~skulk.engine._sampling.Sampler` made
without ``logprobs`` records nothing. A request that asks adds, per token, a log-softmax of its
own row, one ``argpartition`` for the top ``k`` and a host transfer of ``k + 1`` floats.

The arrays are lazy (:class:`PendingLogprobs`): they are computed with the token they belong to
and read on the host when that token is handed out (:meth:`PendingLogprobs.resolve`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import cache
from typing import Any, cast

import attrs
import mlx.core as mx
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer

from skulk.wire.runner import TokenLogprob, TopLogprob

_async_eval = cast(Callable[..., None], mx.async_eval)  # untyped in mlx's stubs

#: What a log-probability below this (``-inf`` for a masked token) is reported as: the wire
#: carries only finite numbers, and OpenAI uses the same floor.
LOGPROB_FLOOR = -9999.0


@attrs.frozen
class PendingLogprobs:
    """One sampled position's values, not yet on the host: ``chosen`` (shape ``(1,)``) the
    sampled token's log-probability, ``top_ids`` / ``top_values`` (shape ``(k,)``, unordered)
    the ``k`` most likely tokens (``None`` for ``k = 0``)."""

    chosen: mx.array
    top_ids: mx.array | None
    top_values: mx.array | None

    def arrays(self) -> list[mx.array]:
        """Every array this holds."""
        if self.top_ids is None or self.top_values is None:
            return [self.chosen]
        return [self.chosen, self.top_ids, self.top_values]

    def resolve(self, token: int, token_bytes: Callable[[int], bytes]) -> TokenLogprob:
        """The wire entry for the sampled ``token`` (its alternatives most likely first, ties
        by token id)."""
        mx.eval(*self.arrays())
        chosen = cast(list[float], self.chosen.tolist())[0]
        top: tuple[TopLogprob, ...] = ()
        if self.top_ids is not None and self.top_values is not None:
            ids = cast(list[int], self.top_ids.tolist())
            values = cast(list[float], self.top_values.tolist())
            pairs = sorted(zip(ids, values, strict=True), key=lambda p: (-p[1], p[0]))
            top = tuple(TopLogprob(i, token_bytes(i), _finite(v)) for i, v in pairs)
        return TokenLogprob(token, token_bytes(token), _finite(chosen), top)


def _finite(value: float) -> float:
    return value if math.isfinite(value) and value > LOGPROB_FLOOR else LOGPROB_FLOOR


def pending_logprobs(logits: mx.array, token: mx.array, top: int) -> PendingLogprobs:
    """The lazy values for ``token`` (shape ``(1,)``) sampled from ``logits`` (shape
    ``(1, vocab)``), with the ``top`` most likely alternatives."""
    row = logits.astype(mx.float32).reshape(-1)
    logprobs = row - mx.logsumexp(row)
    chosen = mx.take(logprobs, token.reshape(1).astype(mx.int32))
    top = min(top, int(row.shape[0]))
    if top <= 0:
        pending = PendingLogprobs(chosen, None, None)
    else:
        ids = mx.argpartition(-logprobs, kth=top - 1)[:top]
        pending = PendingLogprobs(chosen, ids, mx.take(logprobs, ids))
    # Queued now, with the token: reading them when the token is handed out must not wait for
    # the forward pass queued after it (that would undo the host/device overlap).
    _async_eval(*pending.arrays())
    return pending


def token_bytes(detokenizer: Any, tokenizer: Any) -> Callable[[int], bytes]:
    """How to spell one token id as the bytes it adds to the text, for ``detokenizer`` (a
    request's mlx-lm streaming detokenizer, whose token table it reuses) of ``tokenizer``.
    A token may hold part of a UTF-8 character; a leading space marker (BPE ``Ġ``, SentencePiece
    ``▁``) is a space."""
    if isinstance(detokenizer, BPEStreamingDetokenizer):
        table: list[str] = detokenizer.tokenmap
        decoder = _byte_decoder()

        def bpe(token: int) -> bytes:
            piece = table[token] if 0 <= token < len(table) else ""
            return b"".join(
                bytes([decoder[c]]) if c in decoder else c.encode("utf-8") for c in piece
            )

        return bpe
    if isinstance(detokenizer, SPMStreamingDetokenizer):
        pieces: list[bytes] = detokenizer.tokenmap

        def spm(token: int) -> bytes:
            piece = pieces[token] if 0 <= token < len(pieces) else b""
            return piece.replace("\u2581".encode(), b" ")

        return spm

    def plain(token: int) -> bytes:
        return str(tokenizer.decode([token])).encode("utf-8", "surrogatepass")

    return plain


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, reversed: the character standing for each byte."""
    visible = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    visible += range(ord("®"), ord("ÿ") + 1)
    chars, extra = {}, 0
    for b in range(256):
        if b in visible:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars
