"""Embeddings from a causal language model: pooled final hidden states.

The pooling (documented in docs/api.md): run the input's tokens through the model's layers and
its final norm (the hidden states the language-model head would read), take the **mean over
the input's tokens**, and **L2-normalise** it. The vector's length is the model's hidden size.
Mean pooling keeps every token's contribution (a causal model's last token alone sees the
whole text, but is dominated by what would come next); normalising makes cosine similarity a
dot product, what the OpenAI and Ollama clients expect.

Batching: inputs are grouped in order, each group padded on the right to its longest input and
run as one forward pass of at most a turn's token budget (:data:`EMBED_BATCH_TOKENS`, fewer on
a slow model: the runner sizes it from measured speed, as its prefill chunks). Attention is
causal, so padding after an input changes none of its hidden states: an input's vector is the
same alone or in a batch (up to float rounding). An input longer than the budget goes alone, in
chunks through a KV cache, one chunk a turn, its hidden states summed as they come (the same
vector up to rounding). The runner's loop runs one group or chunk per turn
(:meth:`EmbedJob.advance`), so it heartbeats and decodes other streams in between, however
large the model and the inputs.

Tokenizing text inputs happens on the runner's preparation thread (:func:`input_tokens`), like
a prompt's; everything else here is mlx and runs on the main thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from skulk.engine._engine import Engine, RequestError
from skulk.wire.runner import EmbedInput, TextPrompt, TokenIds

#: Most padded tokens one embedding forward pass computes on a fast model (the rest wait for
#: the next turn).
EMBED_BATCH_TOKENS = 4096
#: Most numbers one ``Embedded`` answer carries (inputs times hidden size): about 2.4 MB of CBOR,
#: under every link's frame limit, including the 4 MiB of a routed answer.
MAX_EMBED_FLOATS = 262_144


def hidden_size(engine: Engine) -> int | None:
    """The model's hidden size, or ``None`` when it exposes no final hidden states we can
    read (``model.model(tokens)`` returning ``(batch, tokens, hidden)``: llama, qwen2 and most
    mlx-lm families)."""
    inner = getattr(engine.model, "model", None)
    args = getattr(engine.model, "args", None)
    size = getattr(args, "hidden_size", None)
    if inner is None or not callable(inner) or not isinstance(size, int):
        return None
    return size


def check_inputs(engine: Engine, count: int) -> None:
    """Refuse (``unsupported``, ``invalid_request``) an ``Embed`` this model cannot answer,
    before anything is tokenized."""
    size = hidden_size(engine)
    if size is None:
        raise RequestError("unsupported", "this model exposes no hidden states to embed")
    if count < 1:
        raise RequestError("invalid_request", "no input to embed")
    if count * size > MAX_EMBED_FLOATS:
        raise RequestError(
            "invalid_request",
            f"{count} inputs of {size} dimensions exceed the {MAX_EMBED_FLOATS} numbers one "
            "answer may carry; send fewer inputs per request",
        )


def input_tokens(engine: Engine, item: EmbedInput, truncate: bool) -> list[int]:
    """``item``'s token ids, checked: in the vocabulary, not empty, within the context (cut
    to it when ``truncate``, else ``prompt_too_long``). Tokenizer only: safe on a thread."""
    if isinstance(item, TokenIds):
        ids = list(item.tokens)
        bad = next((t for t in ids if not 0 <= t < engine.vocab_size), None)
        if bad is not None:
            raise RequestError(
                "invalid_request",
                f"token id {bad} is outside this model's vocabulary (0..{engine.vocab_size - 1})",
            )
    else:
        assert isinstance(item, TextPrompt)
        if not truncate:
            ids = engine.tokenize(item)  # refuses a text too long before encoding it
        else:
            tok: Any = engine.tokenizer
            ids = [int(i) for i in tok.encode(item.text)]
    if not ids:
        raise RequestError("empty_prompt", "an input encodes to no tokens")
    limit = engine.context_length
    if len(ids) > limit:
        if not truncate:
            raise RequestError(
                "prompt_too_long",
                f"an input has {len(ids)} tokens; this model's context is {limit} tokens",
            )
        ids = ids[:limit]
    return ids


def pool(hidden: mx.array, lengths: Sequence[int]) -> mx.array:
    """Mean over each row's first ``lengths[i]`` positions of ``hidden`` (batch, tokens,
    hidden), L2-normalised, as float32 (batch, hidden)."""
    h = hidden.astype(mx.float32)
    n = mx.array(list(lengths), dtype=mx.float32)[:, None]
    mask = (mx.arange(h.shape[1])[None, :] < n).astype(mx.float32)
    return _unit((h * mask[:, :, None]).sum(axis=1) / n)


def _unit(mean: mx.array) -> mx.array:
    """Each row of ``mean`` (float32) L2-normalised."""
    norm = mx.sqrt((mean * mean).sum(axis=-1, keepdims=True))
    return mean / mx.maximum(norm, mx.array(1e-12, dtype=mx.float32))


def embed_group(engine: Engine, group: Sequence[Sequence[int]]) -> list[tuple[float, ...]]:
    """One forward pass over ``group`` (right-padded), pooled: one vector per input."""
    width = max(len(ids) for ids in group)
    padded = mx.array([list(ids) + [0] * (width - len(ids)) for ids in group])
    hidden = engine.forward.hidden(padded)
    return _rows(pool(hidden, [len(ids) for ids in group]))


def _rows(vectors: mx.array) -> list[tuple[float, ...]]:
    mx.eval(vectors)
    rows: list[list[float]] = vectors.tolist()  # type: ignore[assignment]
    return [tuple(float(x) for x in row) for row in rows]


class _Chunked:
    """One input longer than a turn's budget, computed a chunk at a time through a KV cache:
    the sum of its final hidden states so far (float32, shape ``(1, hidden)``)."""

    def __init__(self, engine: Engine) -> None:
        self.cache = engine.new_cache()
        self.done = 0
        self.total: mx.array | None = None

    def advance(self, engine: Engine, ids: Sequence[int], most: int) -> tuple[float, ...] | None:
        """Compute the next ``most`` tokens; the input's vector once all are in, else None."""
        piece = ids[self.done : self.done + most]
        hidden = engine.forward.hidden(mx.array([list(piece)]), self.cache)
        part = hidden.astype(mx.float32).sum(axis=1)
        self.total = part if self.total is None else self.total + part
        mx.eval(self.total)
        self.done += len(piece)
        if self.done < len(ids):
            return None
        return _rows(_unit(self.total / len(ids)))[0]


def groups(inputs: Sequence[Sequence[int]], budget: int = EMBED_BATCH_TOKENS) -> list[range]:
    """Consecutive index ranges of ``inputs`` whose padded size (count times longest) stays within
    ``budget`` (a longer input goes alone)."""
    out: list[range] = []
    start, longest = 0, 0
    for i, ids in enumerate(inputs):
        wider = max(longest, len(ids))
        if i > start and wider * (i - start + 1) > budget:
            out.append(range(start, i))
            start, wider = i, len(ids)
        longest = wider
    if inputs:
        out.append(range(start, len(inputs)))
    return out


class EmbedJob:
    """One ``Embed`` request on the runner's main loop: its tokenized inputs, embedded one
    group (or one chunk of a long input) per :meth:`advance`."""

    def __init__(self, engine: Engine, request_id: str, inputs: Sequence[Sequence[int]]) -> None:
        self.request_id = request_id
        self.prompt_tokens = sum(len(ids) for ids in inputs)
        self._engine = engine
        self._inputs = inputs
        self._chunked: _Chunked | None = None  # the long input in progress
        self.vectors: list[tuple[float, ...]] = []

    @property
    def done(self) -> bool:
        return len(self.vectors) == len(self._inputs)

    def advance(self, budget: int = EMBED_BATCH_TOKENS) -> int:
        """Embed the next group of inputs whose padded size fits ``budget`` tokens, or the next
        ``budget`` tokens of an input longer than that; the tokens computed (check
        :attr:`done`)."""
        if self.done:
            return 0
        start = len(self.vectors)
        ids = self._inputs[start]
        if self._chunked is not None or len(ids) > budget:
            chunked = self._chunked = self._chunked or _Chunked(self._engine)
            before = chunked.done
            vector = chunked.advance(self._engine, ids, max(1, budget))
            if vector is not None:
                self.vectors.append(vector)
                self._chunked = None
            return chunked.done - before
        (group, *_) = groups(self._inputs[start:], budget)
        batch = [self._inputs[start + i] for i in group]
        self.vectors.extend(embed_group(self._engine, batch))
        return len(batch) * max(len(i) for i in batch)
