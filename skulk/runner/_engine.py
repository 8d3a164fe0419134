"""The inference engine inside a runner process: an mlx-lm model, our own decode loop.

Everything here is synchronous and runs on the runner's main thread. Several generations may be
active at once; the runner advances each by one token in turn. Each generation owns its KV cache,
its random key (so a seeded request gives the same tokens whatever else runs beside it), its
streaming detokenizer and its stop matcher.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import attrs
import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache
from mlx_lm.sample_utils import apply_top_k, apply_top_p
from mlx_lm.tokenizer_utils import TokenizerWrapper
from mlx_lm.utils import load_model, load_tokenizer

from skulk.runner._stops import StopMatcher
from skulk.wire.runner import ChatPrompt, FinishReason, Prompt, SamplingParams, TextPrompt

PREFILL_STEP = 512
_async_eval = cast(Callable[..., None], mx.async_eval)  # untyped in mlx's stubs
DEFAULT_CONTEXT = 4096


class RequestError(Exception):
    """A request the engine refuses; ``reason`` is the typed name sent to the node."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@attrs.frozen
class Step:
    """What one decode step produced: token ids, text to emit and, at the end, why it ended."""

    token_ids: tuple[int, ...]
    text: str
    finish_reason: FinishReason | None = None


class Engine:
    """A loaded model and tokenizer, ready to start generations."""

    def __init__(self, model: Any, tokenizer: TokenizerWrapper, context_length: int) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.context_length = context_length
        self.vocab_size = int(model.args.vocab_size) if hasattr(model, "args") else len(tokenizer)

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

    def encode(self, prompt: Prompt) -> list[int]:
        tok: Any = self.tokenizer
        if isinstance(prompt, ChatPrompt):
            messages = [{"role": m.role, "content": m.content} for m in prompt.messages]
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids)
        assert isinstance(prompt, TextPrompt)
        return list(tok.encode(prompt.text))

    def start(
        self, prompt: Prompt, params: SamplingParams, tick: Callable[[], None] = lambda: None
    ) -> Generation:
        """Tokenize and prefill (calling ``tick()`` between prefill chunks); refuses with
        :class:`RequestError` a prompt that is empty or does not fit the context."""
        tokens = self.encode(prompt)
        if not tokens:
            raise RequestError("empty_prompt", "the prompt encodes to no tokens")
        if len(tokens) >= self.context_length:
            raise RequestError(
                "prompt_too_long",
                f"the prompt has {len(tokens)} tokens; this model's context is "
                f"{self.context_length} tokens",
            )
        return Generation(self, tokens, params, tick)

    def warm_up(self) -> None:
        """Run one tiny generation so the first real request does not pay for lazy set-up."""
        gen = self.start(TextPrompt("warm up"), SamplingParams(temperature=0.0, max_tokens=2))
        while gen.step().finish_reason is None:
            pass


class Generation:
    """One request's decode state. ``step()`` yields one token per call until it finishes.

    The next token is computed asynchronously while the current one is handed out, as mlx-lm's
    own ``generate_step`` does, so the host and the device overlap.
    """

    def __init__(
        self,
        engine: Engine,
        prompt_tokens: list[int],
        params: SamplingParams,
        tick: Callable[[], None] = lambda: None,
    ) -> None:
        self._engine = engine
        self._params = params
        self.prompt_tokens = len(prompt_tokens)
        self.completion_tokens = 0
        limit = engine.context_length - len(prompt_tokens)
        self._max_tokens = limit if params.max_tokens is None else min(params.max_tokens, limit)
        seed = params.seed if params.seed is not None else int.from_bytes(os.urandom(8), "little")
        self._key = mx.random.key(seed % (1 << 64))
        self._cache = make_prompt_cache(engine.model)
        self._detok = engine.tokenizer.detokenizer
        self._stops = StopMatcher(params.stop)
        self._eos = set(engine.tokenizer.eos_token_ids)
        self.finish_reason: FinishReason | None = None
        self._pending = self._prefill(mx.array(prompt_tokens), tick)

    def _prefill(self, prompt: mx.array, tick: Callable[[], None]) -> mx.array:
        while prompt.size > 1:
            n = min(PREFILL_STEP, prompt.size - 1)
            self._engine.model(prompt[:n][None], cache=self._cache)
            mx.eval([c.state for c in self._cache])
            prompt = prompt[n:]
            tick()
        nxt = self._forward(prompt)
        _async_eval(nxt)
        return nxt

    def _forward(self, tokens: mx.array) -> mx.array:
        logits = self._engine.model(tokens[None], cache=self._cache)[:, -1, :]
        return self._sample(logits)

    def _sample(self, logits: mx.array) -> mx.array:
        p = self._params
        if p.temperature == 0:
            return mx.argmax(logits, axis=-1)
        logprobs = logits - mx.logsumexp(logits, keepdims=True)
        if 0 < p.top_p < 1:
            logprobs = apply_top_p(logprobs, p.top_p)
        if 0 < p.top_k < self._engine.vocab_size:
            logprobs = apply_top_k(logprobs, p.top_k)
        self._key, sub = mx.random.split(self._key)
        return mx.random.categorical(logprobs * (1.0 / p.temperature), key=sub)

    def step(self) -> Step:
        """Hand out the next token; the returned step has ``finish_reason`` set on the last."""
        if self.finish_reason is not None:
            raise RuntimeError("generation already finished")
        current = self._pending
        self.completion_tokens += 1
        last = self.completion_tokens >= self._max_tokens
        if not last:
            self._pending = self._forward(current)
            _async_eval(self._pending)
        token = int(cast(int, current.item()))
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
