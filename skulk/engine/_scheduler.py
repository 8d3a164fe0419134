"""The scheduler of a runner: every request from ``Generate``/``Tokenize``/``Embed`` to its
``Finished`` or ``RequestFailed``, for single and sharded instances alike.

It admits requests against the KV budget (a request reserves its prompt plus its most new
tokens, :class:`~skulk.engine._budget.KvBudget`), queues what does not fit (a bounded FIFO,
beyond which ``kv_cache_full``), refuses what never could (``prompt_too_long``,
``max_tokens_too_large``), prefills one paced chunk a turn, decodes every running request in
one batch (:mod:`skulk.engine._batch`, with n-gram speculation for a lone row; on a pipeline
that overlaps its stages, one micro-batch per rank, new rows joining the smallest), reuses and
keeps prefixes (:mod:`skulk.engine._prefix_cache`), embeds, parses tool calls, and gives every
reservation back on finish, failure or cancel. It computes only through the engine's
:class:`~skulk.engine._forward.Forward`, so a sharded instance runs this very scheduler on its
rank 0 and its forward pass is the distributed one
(:mod:`skulk.engine._sharded_forward`): logprobs, grammar masks, speculation, the prefix cache
and embeddings work the same on both.
"""

from __future__ import annotations

import time
from collections import deque
from functools import partial

from skulk.engine._batch import Batch, Prefill, Row, batchable
from skulk.engine._budget import KvBudget, PrefillPacer
from skulk.engine._embed import EMBED_BATCH_TOKENS, EmbedJob, check_inputs, input_tokens
from skulk.engine._engine import Engine, RequestError, Step
from skulk.engine._grammar import request_constraint
from skulk.engine._link import Link
from skulk.engine._prefix_cache import PrefixCache
from skulk.engine._prepare import Prepared, PromptPreparer, log_failure, shorten
from skulk.engine._speculation_control import DEFAULT_SPECULATIVE_TOKENS
from skulk.engine._stats import EngineTotals
from skulk.engine._tool_parse import ToolText
from skulk.engine.faults import Faults
from skulk.wire.runner import (
    Embed,
    Embedded,
    EngineStats,
    Finished,
    FinishReason,
    Generate,
    GenerationEnd,
    Load,
    PrefillProgress,
    RequestFailed,
    TokenChunk,
    Tokenize,
    Tokenized,
    Usage,
)


class Scheduler:
    """The requests a runner serves, in the order they move: ``waiting`` (the prompt is being
    tokenized on the :class:`PromptPreparer`'s thread), ``queued`` (tokenized, waiting FIFO for
    room in the KV budget, at most ``Load.kv_waiting``), ``prefills`` (admitted: the prompt is
    computed one chunk per loop turn) and the decode ``batch`` (see :mod:`skulk.engine._batch`).
    Each turn of the loop (:meth:`advance`) runs one prefill chunk, then one decode step of
    the whole batch, so a long prompt never stalls the running streams.

    Every request ends with exactly one ``Finished`` or ``RequestFailed``, and a failure of one
    request — a refusal, a prefill exception — ends only that request (a failed decode step
    fails the rows that shared it). Every ``Cancel`` is answered with one
    ``Finished(cancelled)``: for a request the runner holds it is its end; for an id the runner
    does not know (it finished first, or never started) it is a bare acknowledgement with zero
    usage, which the node needs to clear its cancel deadline.
    """

    def __init__(self, link: Link, engine: Engine, faults: Faults, load: Load) -> None:
        self._link = link
        self._engine = engine
        self._faults = faults
        self._preparer = PromptPreparer(
            engine.tokenize,
            link.inbox,
            partial(request_constraint, engine.tokenizer),
            lambda req: [input_tokens(engine, item, req.truncate) for item in req.inputs],
        )
        self.embeds: deque[EmbedJob] = deque()  # tokenized Embed requests, a group a turn
        forward = engine.forward
        budgets = forward.budgets(
            load.kv_cache_bytes, load.prefix_cache_bytes, engine.context_length
        )
        self.budget = KvBudget(budgets.kv_bytes, budgets.bytes_per_token, engine.context_length)
        self._max_queued = max(0, load.kv_waiting)
        layout = forward.layout()
        self._batchable = batchable(layout)
        prefix_bytes = budgets.prefix_bytes if PrefixCache.supports(layout) else 0
        self.prefix = PrefixCache(prefix_bytes, forward)
        self.waiting: dict[str, int] = {}  # request id → job number of its tokenization
        self.queued: deque[tuple[Row, int]] = deque()  # (row, KV bytes it needs)
        self.prefills: deque[Prefill] = deque()
        self.pacer = PrefillPacer()
        # one, unless the model's caches cannot be merged or a pipeline overlaps micro-batches
        self.batches: list[Batch] = []
        speculative = load.speculative_tokens
        self._speculative = DEFAULT_SPECULATIVE_TOKENS if speculative is None else speculative
        self.totals = EngineTotals()

    @property
    def busy(self) -> bool:
        """Whether there is compute to do (a prefill or a decode step) this turn."""
        return bool(self.prefills) or any(self.batches) or bool(self.embeds)

    def _known(self, request_id: str) -> bool:
        return (
            request_id in self.waiting
            or any(job.request_id == request_id for job in self.embeds)
            or any(row.request_id == request_id for row, _ in self.queued)
            or any(p.row.request_id == request_id for p in self.prefills)
            or any(r.request_id == request_id for b in self.batches for r in b.rows)
        )

    def accept(self, req: Generate | Tokenize | Embed) -> None:
        if self._known(req.request_id):
            self._fail(req.request_id, "duplicate_request", "request id already active")
            return
        try:
            if isinstance(req, Generate):
                self._engine.check_params(req.params)
            elif isinstance(req, Embed):
                check_inputs(self._engine, len(req.inputs))
        except RequestError as exc:
            self._fail(req.request_id, exc.reason, exc.message)
            return
        self.waiting[req.request_id] = self._preparer.submit(req)

    def start(self, prepared: Prepared) -> None:
        """Admit a tokenized prompt to the KV budget (or queue it, or refuse it)."""
        req = prepared.request
        if self.waiting.get(req.request_id) != prepared.job:
            return  # cancelled while it was tokenized: already answered
        del self.waiting[req.request_id]
        if prepared.failure is not None:
            self._fail(req.request_id, *prepared.failure)
            return
        if isinstance(req, Tokenize):  # counted: nothing to compute, no KV memory
            self._link.send(Tokenized(req.request_id, len(prepared.tokens)))
            return
        if isinstance(req, Embed):
            self.embeds.append(EmbedJob(self._engine, req.request_id, prepared.inputs))
            return
        try:
            row = Row.open(
                self._engine, req.request_id, prepared.tokens, req.params, prepared.constraint
            )
        except RequestError as exc:
            self._fail(req.request_id, exc.reason, exc.message)
            return
        row.tool_text = ToolText.open(self._engine.tokenizer, req.prompt)
        row.queued_at = time.monotonic()
        refusal = self.budget.refusal(len(prepared.tokens), req.params.max_tokens)
        if refusal is not None:
            self._fail(req.request_id, *refusal)
            return
        need = self.budget.need(len(prepared.tokens), req.params.max_tokens)
        if not self.queued and self.budget.fits(need):
            self._admit(row, need)
        elif len(self.queued) < self._max_queued:
            self.queued.append((row, need))
        else:
            self._fail(
                req.request_id,
                "kv_cache_full",
                f"the runner's KV cache is in use by {self._running()} requests and "
                f"{len(self.queued)} more wait for it",
            )

    def _running(self) -> int:
        return len(self.prefills) + sum(len(b) for b in self.batches)

    def _admit(self, row: Row, need: int) -> None:
        self.budget.take(need)
        row.reserved = need
        if row.queued_at:
            row.queue_seconds = max(0.0, time.monotonic() - row.queued_at)
        hit = self.prefix.fetch(row.tokens)
        if hit is None:
            self.prefills.append(Prefill(self._engine, row, self._engine.new_cache()))
        else:
            cache, reused = hit
            row.cached_tokens = reused
            self.prefills.append(Prefill(self._engine, row, cache, reused))
        self._prefill_progress(row)

    def _prefill_progress(self, row: Row) -> None:
        self._link.send(PrefillProgress(row.request_id, row.fed, row.out.prompt_tokens))

    def _release(self, row: Row) -> None:
        """Give ``row``'s KV bytes back and admit the queued requests that now fit, in order."""
        self.budget.release(row.reserved)
        row.reserved = 0
        while self.queued and self.budget.fits(self.queued[0][1]):
            queued, need = self.queued.popleft()
            self._admit(queued, need)

    def advance(self) -> None:
        """One embedding group of the oldest ``Embed``, one prefill chunk of the oldest
        admitted prompt, then one decode step (a turn of work, under the forward pass's
        :meth:`~skulk.engine._forward.Forward.guard`); nothing while there is nothing to
        compute."""
        if not self.busy:
            return
        what = "forward(prefill)" if self.prefills or self.embeds else "forward(decode)"
        with self._engine.forward.guard(what):
            if self.embeds:
                self._embed_group(self.embeds[0])
            if self.prefills:
                self._prefill_chunk(self.prefills[0])
            for batch in list(self.batches):
                self._decode(batch)

    def _prefill_chunk(self, prefill: Prefill) -> None:
        row = prefill.row
        fed, started = row.fed, time.perf_counter()
        try:
            first = prefill.advance(self.pacer.size())
        except Exception as exc:
            log_failure("could not start a request", exc)
            self._engine.forward.check(exc)
            self.prefills.popleft()
            self._release(row)
            self._fail(row.request_id, "engine_error", f"prefill failed: {exc}")
            return
        self._prefill_progress(row)
        if first is None:  # a whole chunk, evaluated: its time is the model's prefill speed
            self.pacer.record(row.fed - fed, time.perf_counter() - started)
            self._faults.hit("prefill", prefill.chunks)
            return
        self.prefills.popleft()
        if self._batchable and self.batches:
            batch = self.batches[0]
            self._emit(batch, batch.settle())  # a lone speculating row back to plain decoding
        micro = self._engine.forward.micro_batches
        if self._batchable and self.batches and len(self.batches) >= micro:
            min(self.batches, key=len).add(row, prefill.cache, first)
        else:
            batch = Batch(self._engine, self._speculative)
            batch.add(row, prefill.cache, first)
            self.batches.append(batch)
        self._speculate_alone()

    def _speculate_alone(self) -> None:
        """With micro-batches (a pipeline overlapping them), only a lone batch speculates:
        speculation's verify passes go round the ring one at a time, which the others would
        wait for."""
        if self._engine.forward.micro_batches > 1:
            alone = len(self.batches) == 1
            for batch in self.batches:
                batch.speculative_tokens = self._speculative if alone else 0

    def _decode(self, batch: Batch) -> None:
        for row in batch.rows:
            self._faults.hit("decode", row.out.completion_tokens)
        try:
            steps = batch.step()
        except Exception as exc:
            log_failure("a decode step failed", exc)
            self._engine.forward.check(exc)
            self.batches.remove(batch)
            for row in batch.rows:
                self._release(row)
                self._count_left(row)
                self._fail(row.request_id, "engine_error", f"decode failed: {exc}")
            return
        self._emit(batch, steps)

    def _embed_group(self, job: EmbedJob) -> None:
        started = time.perf_counter()
        try:
            computed = job.advance(self.pacer.budget(EMBED_BATCH_TOKENS))
        except Exception as exc:
            log_failure("an embedding failed", exc)
            self._engine.forward.check(exc)
            self.embeds.popleft()
            self._fail(job.request_id, "engine_error", f"embedding failed: {exc}")
            return
        self.pacer.record(computed, time.perf_counter() - started)
        if job.done:
            self.embeds.popleft()
            self._link.send(Embedded(job.request_id, tuple(job.vectors), job.prompt_tokens))

    def _emit(self, batch: Batch, steps: list[tuple[Row, Step]]) -> None:
        """Send what ``batch``'s rows produced; rows that finished leave it."""
        for row, step in steps:
            if step.token_ids or step.text:
                chunk = TokenChunk(row.request_id, step.token_ids, step.text, step.logprobs)
                self._link.send(chunk)
                if row.tool_text is not None:
                    row.tool_text.add(step.text)
            if step.finish_reason is not None:
                self._leave(batch, row)
                self._link.send(finished(row, step.finish_reason))

    def _leave(self, batch: Batch, row: Row) -> None:
        """Take a finished or cancelled ``row`` out of ``batch``, keeping its KV state in the
        prefix cache."""
        own = batch.remove(row, keep_cache=self.prefix.max_bytes > 0)
        if not batch:
            self.batches.remove(batch)
            self._speculate_alone()
        if own is not None:
            self.prefix.store(row.tokens[: row.fed], own)
        self._release(row)
        self._count_left(row)

    def _count_left(self, row: Row) -> None:
        spec = row.speculation
        self.totals.request_left(None if spec is None else spec.controller.statistics())

    def stats(self) -> EngineStats | None:
        """The engine counters if they changed since the last call that returned them (the
        link asks once per heartbeat)."""
        running = [p.row for p in self.prefills] + [r for b in self.batches for r in b.rows]
        live = (r.speculation.controller.statistics() for r in running if r.speculation)
        spec = self.totals.with_running(live)
        stats = EngineStats(
            speculation_verify_steps=spec.verify_steps,
            speculation_plain_steps=spec.plain_steps,
            speculation_drafted=spec.drafted,
            speculation_accepted=spec.accepted,
            prefix_hits=self.prefix.hits,
            prefix_reused_tokens=self.prefix.reused_tokens,
            prefix_bytes=self.prefix.nbytes,
            prefix_entries=len(self.prefix),
            kv_capacity_bytes=self.budget.capacity,
            kv_reserved_bytes=self.budget.used,
            running=len(running),
            queued=len(self.queued),
        )
        return self.totals.changed(stats)

    def cancel(self, request_id: str) -> None:
        for job in self.embeds:
            if job.request_id == request_id:
                self.embeds.remove(job)
                end = GenerationEnd("cancelled", Usage(job.prompt_tokens, 0))
                self._link.send(Finished(request_id, end))
                return
        for batch in self.batches:
            for row in batch.rows:
                if row.request_id == request_id:
                    self._leave(batch, row)
                    self._link.send(Finished(request_id, GenerationEnd("cancelled", row.usage())))
                    return
        for prefill in self.prefills:
            if prefill.row.request_id == request_id:
                self.prefills.remove(prefill)
                self._release(prefill.row)
                end = GenerationEnd("cancelled", prefill.row.usage())
                self._link.send(Finished(request_id, end))
                return
        for queued in self.queued:
            if queued[0].request_id == request_id:
                self.queued.remove(queued)
                end = GenerationEnd("cancelled", queued[0].usage())
                self._link.send(Finished(request_id, end))
                return
        # Waiting (its tokens are dropped when they come) or unknown: acknowledge all the same.
        self.waiting.pop(request_id, None)
        self._link.send(Finished(request_id, GenerationEnd("cancelled", Usage(0, 0))))

    def _fail(self, request_id: str, reason: str, message: str) -> None:
        self._link.send(RequestFailed(request_id, reason, shorten(message)))


def finished(row: Row, reason: FinishReason) -> Finished:
    """The ``Finished`` that ends ``row``, with the tool calls its model's parser read from
    its text when it offered tools (:mod:`skulk.engine._tool_parse`)."""
    end = GenerationEnd(
        reason, row.usage(), row.out.stop_sequence, queue_seconds=row.queue_seconds
    )
    return Finished(row.request_id, end if row.tool_text is None else row.tool_text.finish(end))

