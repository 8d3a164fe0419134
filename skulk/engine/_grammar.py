"""Grammar-constrained decoding: which tokens a structured-output request may sample next.

Independent of any decode loop. A loop holds one :class:`Constraint` per constrained request
and, per step:

1. ``logits = constraint.mask(logits)`` (or :func:`mask_rows` for a batch: one ``where`` over
   all rows, ``None`` for unconstrained rows) — disallowed tokens become ``-inf``;
2. samples as usual (greedy, top-p, top-k and temperature all work on masked logits);
3. ``constraint.accept(token)`` with the sampled token, *before* the next mask;
4. if ``constraint.is_finished`` the document is complete and only EOS may follow: end the
   request now with finish reason ``"stop"`` (feed ``constraint.eos_token`` to the request's
   ``TokenOutput``: it ends it with ``"stop"`` and no forward pass is spent on sampling the
   only token allowed).

A grammar that is complete but could go on (a top-level number) allows EOS and the model picks.
Because the mask for step ``n + 1`` depends on the token of step ``n``, a constrained request
cannot sample ahead of the token it hands out: compute the forward pass, build the mask while it
runs (llguidance works with the GIL released), then mask and sample.

``max_tokens`` still ends a request: llguidance cannot force the shortest completion when the
budget runs out, so such a request ends with ``"length"`` and an incomplete document, as
OpenAI's own structured output does. A bounded schema (``maxLength``, ``maxItems``, bounded
integers, ``multipleOf`` numbers, ``additionalProperties: false``) has bounded instances because
output is compact (:data:`skulk.grammar.COMPILE_OPTIONS`): with a large enough budget it always
ends with ``"stop"``.

Speculative decoding can use :meth:`Constraint.draft_masks` (the masks at each draft
position) and :meth:`Constraint.rollback`.
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from copy import copy
from pathlib import Path
from typing import Any, Final

import attrs
import llguidance
import llguidance.numpy as llnp
import mlx.core as mx
import numpy as np
from mlx_lm.tokenizer_utils import TokenizerWrapper
from numpy.typing import NDArray

from skulk.engine._engine import RequestError
from skulk.grammar import (
    COMPILE_OPTIONS,
    JSON_OBJECT_SCHEMA,
    SchemaRefused,
    grammar_for,
    schema_error,
)
from skulk.wire.runner import SamplingParams

#: Compiled schemas kept per tokenizer: a new request with a recent schema copies the compiled
#: matcher (~5 µs) instead of compiling it again (~0.5 ms for a small schema, ~60 ms at the
#: size cap).
COMPILED_CACHE_SIZE: Final = 64


class GrammarUnavailable(Exception):
    """This model's tokenizer cannot drive llguidance (it has no ``tokenizers`` backend, e.g.
    a slow SentencePiece or tiktoken tokenizer); the engine refuses structured output."""


class ConstraintViolated(RuntimeError):
    """The grammar is in an error state: a token it forbids was accepted (a decode-loop bug,
    since masked tokens cannot be sampled) or a per-step parser limit was exceeded."""


@attrs.frozen
class ConstraintStatistics:
    """One request's constraint: tokens accepted, masks computed and the time spent on them."""

    tokens: int
    masks: int
    mask_seconds: float


class GrammarTokenizer:
    """llguidance's view of one tokenizer: its tokens as bytes, its EOS ids. Build it once per
    engine (:func:`grammar_tokenizer`) and start every request's :class:`Constraint` from it.

    Masks are computed over the tokenizer's vocabulary (:attr:`vocab_size`); a model whose
    logits are wider (padded embedding rows) gets ``-inf`` for the extra ids.
    """

    def __init__(self, tokenizer: llguidance.LLTokenizer) -> None:
        self._tokenizer = tokenizer
        self.vocab_size = int(tokenizer.vocab_size)
        self.eos_token_ids: tuple[int, ...] = tuple(tokenizer.eos_tokens)
        self._compiled: OrderedDict[tuple[str, str, str], llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()  # the prompt-preparing thread and the decode loop

    @classmethod
    def from_json(cls, tokenizer_json: str, eos_token_ids: Iterable[int]) -> GrammarTokenizer:
        """From a ``tokenizers`` serialisation (a ``tokenizer.json``'s text)."""
        eos = sorted({int(i) for i in eos_token_ids})
        if not eos:
            raise GrammarUnavailable("the tokenizer has no EOS token")
        try:
            return cls(llguidance.LLTokenizer(tokenizer_json, eos_token=eos))
        except ValueError as e:  # not a tokenizers JSON, or a model type llguidance lacks
            raise GrammarUnavailable(f"llguidance cannot use this tokenizer: {e}") from None

    @classmethod
    def from_directory(cls, path: Path, eos_token_ids: Iterable[int]) -> GrammarTokenizer:
        """From a model directory's ``tokenizer.json`` (tokens added only by
        ``tokenizer_config.json`` are missed: prefer :meth:`from_wrapper`)."""
        try:
            text = (path / "tokenizer.json").read_text(encoding="utf-8")
        except FileNotFoundError:
            raise GrammarUnavailable(f"{path} has no tokenizer.json") from None
        return cls.from_json(text, eos_token_ids)

    @classmethod
    def from_wrapper(cls, tokenizer: TokenizerWrapper) -> GrammarTokenizer:
        """From mlx-lm's tokenizer (what the engine loaded): its ``tokenizers`` backend,
        added tokens included, and its EOS ids (``generation_config`` ones included)."""
        hf: Any = getattr(tokenizer, "_tokenizer", None)
        backend = getattr(hf, "backend_tokenizer", None)
        if backend is None:
            raise GrammarUnavailable(f"{type(hf).__name__} has no tokenizers backend")
        backend = copy(backend)  # as llguidance.hf does: no padding or truncation in the JSON
        backend.no_padding()
        backend.no_truncation()
        return cls.from_json(backend.to_str(), tokenizer.eos_token_ids)

    def constraint(
        self,
        schema: str = JSON_OBJECT_SCHEMA,
        param: str = "schema",
        *,
        before: str = "",
        after: str = "",
    ) -> Constraint:
        """A fresh :class:`Constraint` for the JSON schema text ``schema`` (from
        :func:`skulk.grammar.schema_text`; the default is any JSON object), optionally
        wrapped: the output is exactly ``before``, the document, then ``after`` (a forced tool
        call: ``before="<tool_call>\\n"``, ``after="\\n</tool_call>"``; a special token in
        them must be produced as that token). Raises :class:`skulk.grammar.SchemaRefused`
        (naming ``param``) for a schema llguidance refuses. Safe to call from a worker thread
        (the runner's prompt-preparing one)."""
        key = (schema, before, after)
        with self._lock:
            template = self._compiled.get(key)
            if template is not None:
                self._compiled.move_to_end(key)
        if template is None:  # compiled outside the lock: it may take tens of milliseconds
            grammar = self._wrapped(schema, before, after, param) if before or after else None
            template = llguidance.LLMatcher(
                self._tokenizer, grammar or grammar_for(schema), log_level=0
            )
            if template.is_error():
                raise schema_error(param, template.get_error(), json.loads(schema))
            with self._lock:
                self._compiled[key] = template
                while len(self._compiled) > COMPILED_CACHE_SIZE:
                    self._compiled.popitem(last=False)
        return Constraint(template.deep_copy(), self.vocab_size, self.eos_token_ids)

    def _wrapped(self, schema: str, before: str, after: str, param: str) -> str:
        """A Lark grammar: ``before``, the JSON document, ``after``, with the JSON options
        in the schema's ``x-guidance`` key (where an inline ``%json`` reads them)."""
        inline = json.loads(schema)
        if not isinstance(inline, dict):
            raise SchemaRefused(param, "invalid", "a schema must be a JSON object")
        inline["x-guidance"] = dict(COMPILE_OPTIONS)
        parts = [self._literal(before), f"%json {json.dumps(inline)}", self._literal(after)]
        return llguidance.LLMatcher.grammar_from_lark("start: " + " ".join(p for p in parts if p))

    def _literal(self, text: str) -> str:
        """``text`` as a Lark sequence: quoted strings, and ``<[id]>`` for special tokens (a
        quoted string never matches a special token's text)."""
        parts: list[str] = []
        plain: list[int] = []
        for token in self._tokenizer.tokenize_str(text, parse_special=True):
            if self._tokenizer.is_special_token(token):
                if plain:
                    parts.append(json.dumps(self._tokenizer.decode_str(plain)))
                    plain = []
                parts.append(f"<[{token}]>")
            else:
                plain.append(token)
        if plain:
            parts.append(json.dumps(self._tokenizer.decode_str(plain)))
        return " ".join(parts)


_by_wrapper: weakref.WeakKeyDictionary[TokenizerWrapper, GrammarTokenizer] = (
    weakref.WeakKeyDictionary()
)


def grammar_tokenizer(tokenizer: TokenizerWrapper) -> GrammarTokenizer:
    """The :class:`GrammarTokenizer` of an engine's tokenizer, built on first use (~5 ms for
    the demo model's 1024 tokens; about a second for a 150k vocabulary) and kept as long as the
    tokenizer lives."""
    found = _by_wrapper.get(tokenizer)
    if found is None:
        found = _by_wrapper[tokenizer] = GrammarTokenizer.from_wrapper(tokenizer)
    return found


class Constraint:
    """One request's grammar state. Not thread-safe: one decode loop drives it.

    * :meth:`mask` / :meth:`allowed` — which tokens may come next;
    * :meth:`accept` — the token sampled (must be one :meth:`allowed` allowed);
    * :attr:`is_finished` — the document is complete and only EOS may follow;
      :attr:`allows_eos` — EOS is allowed now (the document could end here);
    * :meth:`rollback` — forget the last ``n`` accepted tokens (speculative decoding);
    * :meth:`draft_masks` — the masks along a draft, without accepting it.
    """

    def __init__(
        self, matcher: llguidance.LLMatcher, vocab_size: int, eos_token_ids: tuple[int, ...]
    ) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._words = llnp.allocate_token_bitmask(1, vocab_size)
        self.eos_token = eos_token_ids[0]
        self._tokens = 0
        self._masks = 0
        self._mask_ns = 0

    @property
    def is_finished(self) -> bool:
        """Whether no token but EOS can follow: end the request with ``"stop"``."""
        return self._matcher.is_stopped() and not self._matcher.is_error()

    @property
    def allows_eos(self) -> bool:
        """Whether the text so far is a complete document (EOS is allowed next)."""
        return self._matcher.is_accepting()

    def statistics(self) -> ConstraintStatistics:
        return ConstraintStatistics(self._tokens, self._masks, self._mask_ns / 1e9)

    def allowed_row(self, width: int) -> NDArray[np.bool_]:
        """The next token's allowed ids as a boolean row of ``width`` (the logits' width: ids
        past the tokenizer's vocabulary are never allowed). Raises
        :class:`ConstraintViolated` if the grammar is in an error state."""
        start = time.perf_counter_ns()
        self._check()
        llnp.fill_next_token_bitmask(self._matcher, self._words)
        self._check()
        row = np.zeros(width, dtype=np.bool_)
        n = min(width, self._vocab_size)
        row[:n] = np.unpackbits(self._words.view(np.uint8), count=n, bitorder="little")
        self._masks += 1
        self._mask_ns += time.perf_counter_ns() - start
        return row

    def allowed(self, width: int) -> mx.array:
        """:meth:`allowed_row` as an mlx boolean array of shape ``(width,)``."""
        return mx.array(self.allowed_row(width))

    def mask(self, logits: mx.array) -> mx.array:
        """``logits`` (shape ``(vocab,)`` or ``(1, vocab)``) with every token the grammar does
        not allow next set to ``-inf``; same shape and dtype. A batch is :func:`mask_rows`'
        job: one constraint masks one row."""
        if logits.ndim not in (1, 2) or (logits.ndim == 2 and logits.shape[0] != 1):
            raise ValueError(f"logits of shape {tuple(logits.shape)}: one row expected")
        allowed = self.allowed(logits.shape[-1])
        return mx.where(allowed, logits, mx.array(-float("inf"), dtype=logits.dtype))

    def accept(self, token: int) -> None:
        """Advance past the sampled ``token``; raises :class:`ConstraintViolated` if the
        grammar forbids it (it then stays in its error state)."""
        if not self._matcher.consume_token(int(token)):
            raise ConstraintViolated(f"token {token} refused: {self._matcher.get_error()}")
        self._tokens += 1

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` accepted tokens (those a verifier rejected)."""
        if not 0 <= n <= self._tokens:
            raise ValueError(f"cannot roll back {n} of {self._tokens} tokens")
        if not self._matcher.rollback(n):
            raise ConstraintViolated(f"rollback refused: {self._matcher.get_error()}")
        self._tokens -= n

    def draft_masks(self, draft: Sequence[int], width: int) -> tuple[int, NDArray[np.bool_]]:
        """For speculative decoding: ``(k, rows)`` where the first ``k`` draft tokens are
        allowed in turn and ``rows`` (shape ``(k + 1, width)``) are the masks before each of
        them and after the ``k``-th. The state is left as it was: :meth:`accept` the tokens
        the verifier keeps."""
        k = self._matcher.validate_tokens([int(t) for t in draft])
        rows = []
        for token in draft[:k]:
            rows.append(self.allowed_row(width))
            self.accept(token)
        rows.append(self.allowed_row(width))
        if k:
            self.rollback(k)
        return k, np.stack(rows)

    def _check(self) -> None:
        if self._matcher.is_error():
            raise ConstraintViolated(self._matcher.get_error())


def mask_rows(logits: mx.array, constraints: Sequence[Constraint | None]) -> mx.array:
    """A batch's logits (shape ``(rows, vocab)``) with row ``i`` masked by
    ``constraints[i]`` (``None``: left as is), in one ``where``."""
    rows, width = logits.shape
    if len(constraints) != rows:
        raise ValueError(f"{len(constraints)} constraints for {rows} rows")
    if all(c is None for c in constraints):
        return logits
    allowed = np.ones((rows, width), dtype=np.bool_)
    for i, constraint in enumerate(constraints):
        if constraint is not None:
            allowed[i] = constraint.allowed_row(width)
    return mx.where(mx.array(allowed), logits, mx.array(-float("inf"), dtype=logits.dtype))


def request_constraint(tokenizer: TokenizerWrapper, params: SamplingParams) -> Constraint | None:
    """The constraint a request's ``params`` ask for (``None``: unconstrained), built on the
    runner's prompt-preparing thread beside tokenizing (compiling a schema can take tens of
    milliseconds). A forced tool call (``params.tool_call``) is wrapped in the tokenizer's
    tool-call markers when it has them (``<tool_call>\\n`` … ``\\n</tool_call>``, what
    mlx-lm's parsers look for), else it is the bare JSON call. Raises
    :class:`~skulk.engine._engine.RequestError`: ``invalid_request`` for a schema llguidance
    refuses (the message names the feature), ``unsupported`` for a tokenizer it cannot use."""
    if params.json_schema is None:
        return None
    try:
        grammar = grammar_tokenizer(tokenizer)
    except GrammarUnavailable as exc:
        raise RequestError("unsupported", f"structured output is unavailable: {exc}") from None
    before = after = ""
    if params.tool_call and tokenizer.has_tool_calling:
        before = f"{tokenizer.tool_call_start}\n"
        after = f"\n{tokenizer.tool_call_end}"
    param = "tools" if params.tool_call else "schema"
    try:
        return grammar.constraint(params.json_schema, param, before=before, after=after)
    except SchemaRefused as exc:
        raise RequestError("invalid_request", exc.message) from None
    except ValueError as exc:  # not JSON text: a node bug or a hand-made frame
        raise RequestError("invalid_request", f"{param}: invalid schema text: {exc}") from None
