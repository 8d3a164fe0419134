"""The inference engine inside a runner process: an mlx-lm model, our own decode loop.

Two halves with different threading rules:

* :meth:`Engine.tokenize` touches only the tokenizer (no mlx) and is safe to call from a worker
  thread while the main thread decodes: the runner tokenizes prompts off its main loop (see
  :mod:`skulk.engine._prepare`), so a huge prompt never stops the other streams or the
  heartbeats. A prompt that cannot fit the context is refused before it is tokenized when the
  tokenizer allows a sound character bound (:mod:`skulk.engine._prompt_bound`).
* Everything else is synchronous and runs on the runner's main thread. The decode loop is
  :mod:`skulk.engine._batch`: a serving runner batches its concurrent requests into shared
  forward passes, and a request alone takes the batch's single-row path (the warm-up, and the
  references of tests and benchmarks, decode through that same path:
  :mod:`skulk.engine._single`). Each request owns its sampler and random key (so a seeded
  request gives the same tokens whatever else runs beside it), its streaming detokenizer and
  its stop matcher (:class:`TokenOutput`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_model, load_tokenizer

from skulk.engine._forward import Forward
from skulk.engine._logprobs import PendingLogprobs, token_bytes
from skulk.engine._prompt_bound import max_chars_per_token
from skulk.engine._sampling import check_params
from skulk.engine._stops import StopMatcher
from skulk.engine._tools import chat_inputs
from skulk.wire.runner import (
    ChatPrompt,
    FinishReason,
    Prompt,
    SamplingParams,
    TextPrompt,
    TokenLogprob,
)

DEFAULT_CONTEXT = 4096


class RequestError(Exception):
    """A request the engine refuses; ``reason`` is the typed name sent to the node."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@attrs.frozen
class Step:
    """What one decode step produced: token ids, text to emit and, at the end, why it ended;
    ``logprobs`` (when the request asked for them) one entry per id in ``token_ids``."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None
    logprobs: tuple[TokenLogprob, ...] = ()


class Engine:
    """A loaded model and tokenizer, ready to decode (see :mod:`skulk.engine._batch`).

    ``max_chars_per_token`` is the most characters of (rendered) prompt text one token can
    stand for, or ``None`` when the tokenizer's pipeline allows no sound bound; a prompt of
    ``context_length * max_chars_per_token`` characters or more cannot fit and is refused
    without being tokenized.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: TokenizerWrapper,
        context_length: int,
        forward: Forward | None = None,
    ) -> None:
        self.model = model
        self.forward = Forward(model) if forward is None else forward
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.vocab_size = int(model.args.vocab_size) if hasattr(model, "args") else len(tokenizer)
        self.max_chars_per_token = _chars_per_token(tokenizer)

    def new_cache(self) -> list[Any]:
        """A fresh single-row KV cache for this model (one entry per layer)."""
        return self.forward.new_cache()

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of KV cache one token of one request takes, over all layers (of this rank):
        measured once by running one token through the model (keys and values as the model's
        layers store them, so kv heads, head dim and dtype are whatever the checkpoint says).
        Layers whose cache does not grow per token (recurrent state) count nothing. Main
        thread only (mlx)."""
        return self.forward.bytes_per_token()

    @classmethod
    def load(cls, path: Path, progress: Callable[[int, int], None]) -> Engine:
        """Load weights layer by layer, reporting ``progress(loaded, total)`` as they land."""
        model, config = load_model(path, lazy=True)
        layers = list(getattr(model, "layers", []))
        total = len(layers) + 2
        progress(0, total)
        for i, layer in enumerate(layers):
            mx.eval(layer.parameters())
            progress(i + 1, total)
        mx.eval(model.parameters())
        progress(total - 1, total)
        tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))  # type: ignore[no-untyped-call]
        progress(total, total)
        context = int(config.get("max_position_embeddings") or DEFAULT_CONTEXT)
        return cls(model, tokenizer, context)

    def tokenize(self, prompt: Prompt) -> list[int]:
        """The prompt's token ids; raises :class:`RequestError` (``prompt_too_long``,
        ``empty_prompt``) for one that cannot be served. Touches only the tokenizer: safe on a
        worker thread. A chat prompt is rendered by the chat template, then encoded without
        added special tokens (what ``apply_chat_template(tokenize=True)`` does)."""
        tok: Any = self.tokenizer
        if isinstance(prompt, ChatPrompt):
            messages, tools = chat_inputs(prompt, getattr(tok, "chat_template", None))
            text = tok.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=False
            )
            if not isinstance(text, str):
                raise TypeError(f"the chat template rendered {type(text).__name__}, not str")
            self._check_length(text)
            ids = tok.encode(text, add_special_tokens=False)
        else:
            assert isinstance(prompt, TextPrompt)
            self._check_length(prompt.text)
            ids = tok.encode(prompt.text)
        if not ids:
            raise RequestError("empty_prompt", "the prompt encodes to no tokens")
        if len(ids) >= self.context_length:
            raise RequestError(
                "prompt_too_long",
                f"the prompt has {len(ids)} tokens; this model's context is "
                f"{self.context_length} tokens",
            )
        return [int(i) for i in ids]

    def _check_length(self, text: str) -> None:
        """Refuse, before tokenizing it, a text too long to fit whatever its tokens."""
        per_token = self.max_chars_per_token
        if per_token is not None and len(text) >= self.context_length * per_token:
            raise RequestError(
                "prompt_too_long",
                f"the prompt has {len(text)} characters; this model's context is "
                f"{self.context_length} tokens of at most {per_token} characters each",
            )

    @staticmethod
    def check_params(params: SamplingParams) -> None:
        """Refuse with :class:`RequestError` (``invalid_request``) sampling parameters that
        have no meaning (negative temperature, ``max_tokens < 1``, …)."""
        problem = check_params(params)
        if problem is not None:
            raise RequestError("invalid_request", problem)


def _chars_per_token(tokenizer: TokenizerWrapper) -> int | None:
    """The sound characters-per-token bound for this tokenizer, if one is known: only for a
    ``tokenizers`` backend reached through transformers' own encode path (a subclass could
    rewrite the text in Python first, except mlx-lm's ``NewlineTokenizer``, which only
    lengthens it)."""
    hf: Any = getattr(tokenizer, "_tokenizer", None)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return None
    for name in ("__call__", "encode", "_encode_plus", "tokenize"):
        owner = getattr(getattr(type(hf), name, None), "__module__", "") or ""
        if not owner.startswith("transformers.") and type(hf).__name__ != "NewlineTokenizer":
            return None
    try:
        spec = json.loads(backend.to_str())
    except (AttributeError, TypeError, ValueError):
        return None
    return max_chars_per_token(spec) if isinstance(spec, dict) else None


class TokenOutput:
    """What one request's sampled tokens become: token ids and text to emit, and when the
    request ends — an end-of-sequence token, a stop string, ``max_tokens`` or the context
    limit. Holds the request's streaming detokenizer and stop matcher; no mlx. Shared by the
    single-process batch (:class:`~skulk.engine._batch.Row`) and the sharded loop (where rank 0
    alone emits)."""

    def __init__(
        self,
        tokenizer: TokenizerWrapper,
        params: SamplingParams,
        prompt_tokens: int,
        context_length: int,
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        limit = context_length - prompt_tokens
        self.max_tokens = limit if params.max_tokens is None else min(params.max_tokens, limit)
        self._detok = tokenizer.detokenizer
        self._tokenizer = tokenizer
        self._token_bytes: Callable[[int], bytes] | None = None  # made on first use
        self._stops = StopMatcher(params.stop)
        self._eos = set(tokenizer.eos_token_ids)
        self.finish_reason: FinishReason | None = None

    @property
    def stop_sequence(self) -> str | None:
        """The stop string that ended the generation (``finish_reason`` ``stop``), if one did."""
        return self._stops.matched if self.finish_reason == "stop" else None

    @property
    def next_is_last(self) -> bool:
        """Whether the next token fed is the last one ``max_tokens`` allows (so no token after
        it needs computing)."""
        return self.completion_tokens + 1 >= self.max_tokens

    def feed(self, token: int, logprobs: PendingLogprobs | None = None) -> Step:
        """The step for the next sampled ``token``; ``finish_reason`` is set on the last.
        ``logprobs``: the token's (from the request's sampler), resolved into the step unless
        the token is not emitted (end of sequence)."""
        step = self._feed(token)
        if logprobs is not None and step.token_ids:
            if self._token_bytes is None:
                self._token_bytes = token_bytes(self._detok, self._tokenizer)
            entry = logprobs.resolve(token, self._token_bytes)
            step = attrs.evolve(step, logprobs=(entry,))
        return step

    def _feed(self, token: int) -> Step:
        if self.finish_reason is not None:
            raise RuntimeError("generation already finished")
        last = self.next_is_last
        self.completion_tokens += 1
        if token in self._eos:
            return self._finish((), "stop")
        self._detok.add_token(token)
        text, stopped = self._stops.feed(self._detok.last_segment)
        if stopped:
            return self._finish((token,), "stop", text, flush=False)
        if last:
            return self._finish((token,), "length", text)
        return Step((token,), text)

    def _finish(
        self, ids: tuple[int, ...], reason: FinishReason, text: str = "", *, flush: bool = True
    ) -> Step:
        """End the generation; unless a stop string cut it, release held-back text."""
        self.finish_reason = reason
        if flush:
            self._detok.finalize()
            tail, stopped = self._stops.feed(self._detok.last_segment)
            text += tail if stopped else tail + self._stops.flush()
        return Step(ids, text, reason)
