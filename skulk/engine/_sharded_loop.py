"""The lockstep loop of a sharded runner: every rank does the same work, step by step.

Rank 0 alone talks to its node about requests (``Generate``, ``Cancel``, ``Shutdown``) and
alone tokenizes and detokenizes. Every iteration of every rank begins with one fixed-shape
collective, the control block (:mod:`skulk.engine._lockstep`), which rank 0 broadcasts along
the ring (rank ``r`` receives it from ``r - 1`` and passes it to ``r + 1``) and which tells
the others what this step does: shut down, free slots, open a slot for a new request with its
sampling parameters, a prefill chunk of up to :data:`~skulk.engine._engine.PREFILL_STEP` prompt
tokens for one slot, and a decode step for every slot in the decode batch (with the token each
one feeds). Then every rank runs that work (:mod:`skulk.engine._shard`): in a pipeline, rank 0
embeds and the last rank samples and sends the tokens back to rank 0; in tensor mode rank 0
samples. The tokens rank 0 learns go into the next block, so every rank sees the same tokens.
A prompt is prefilled in chunks sized as in one process (at most ``PREFILL_STEP``, fewer on a
slow model: rank 0's :class:`~skulk.engine._batch.PrefillPacer`, from the time its own share of
each chunk took, times the world for a pipeline, so no chunk nears ``collective_timeout``); all
but its last token: the last one is fed by the slot's first decode step, which yields its first
new token.

**Continuous batching.** Every rank keeps one decode batch of its own layers' KV caches
(:mod:`skulk.engine._rows`: one row is a plain cache, more are mlx-lm batch caches), rows in
the order they joined. A slot prefills into a cache of its own; the first block whose decode
set names it joins that cache to the batch (slots joining in one block join in slot order),
and a block that frees it drops its row. Every rank applies the same blocks, so every rank
holds the same rows in the same order, and one decode step is one forward pass — one
collective sequence along the ring — for all rows, whatever their number. Each step runs at
most one prefill chunk (of the oldest prompt still prefilling) and then the batch's decode
step, so a long prompt never stalls the running streams for more than one chunk. On the
sampling rank each row has its own sampler and random key, so a seeded request gives the same
tokens whatever runs beside it. At most :data:`~skulk.engine._lockstep.MAX_SLOTS` requests are
open at once (one, for a model whose caches cannot be batched); more wait for a slot.

**KV budget.** Every rank measures the KV bytes one token takes in its own layers' caches (at
its first decode step, in the warm-up) and gives itself a budget, ``Load.kv_cache_bytes``
(``--kv-cache-memory``) or the default fraction of the memory it has free (as one process
does, :func:`~skulk.engine._batch.kv_capacity`). The block that says the warm-up is done makes
every rank agree, in one ``all_min``, on the fewest tokens any rank's budget holds; rank 0 then
admits requests against that many tokens exactly as one process does
(:class:`~skulk.engine._batch.KvBudget`: a request reserves its prompt plus its most new
tokens), so no rank can run out of memory for KV state. A request that does not fit waits in a
FIFO of at most ``Load.kv_waiting`` (for room in the budget or for a slot), beyond which it
fails ``kv_cache_full``; one that could never fit fails ``prompt_too_long`` or
``max_tokens_too_large`` at once.

**Cancel** frees the slot on every rank through the next block, before its decode step (rank 0
answers the node at once), so a cancelled row leaves the batch within one step. **Shutdown**
(or the node closing rank 0's link) is a block with the shutdown flag: every rank leaves; the
others tell their node ``RunnerFailed(group_stopped)``.

**Idle.** A rank waiting inside a collective spins a CPU core (the ring backend polls its
sockets), so when rank 0 has nothing to do it sends an idle block saying how long it will wait
before the next one (2 ms at first, doubling to :data:`IDLE_MAX_MS`); the other ranks sleep
that long (less a small margin) on their own inbox instead. A request that arrives while the
group idles therefore waits at most that long to start. An idle block travels the whole ring
back to rank 0, so a stopped peer is noticed while idle too. Every rank heartbeats from this
loop.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections import deque
from collections.abc import Iterator
from typing import Any, cast

import attrs
import mlx.core as mx

from skulk.engine._batch import KvBudget, PrefillPacer, batchable, kv_capacity
from skulk.engine._engine import PREFILL_STEP, Engine, RequestError, TokenOutput
from skulk.engine._link import EOF, Link
from skulk.engine._lockstep import (
    CONTROL_SIZE,
    MAX_SLOTS,
    Chunk,
    Control,
    LockstepError,
    Opening,
    decode,
    encode,
)
from skulk.engine._prepare import Prepared, PromptPreparer, log_failure, shorten
from skulk.engine._rows import drop_row, join_rows, kv_bytes_per_token
from skulk.engine._sampling import Sampler
from skulk.engine._shard import Shard, TensorShard
from skulk.engine._single import WARM_UP, WARM_UP_PROMPT
from skulk.engine._stats import EngineTotals
from skulk.engine._watchdog import CollectiveWatchdog, Note
from skulk.engine.faults import Faults
from skulk.wire.runner import (
    Cancel,
    EngineStats,
    Finished,
    FinishReason,
    Generate,
    GenerationEnd,
    Load,
    RequestFailed,
    RunnerFailed,
    SamplingParams,
    Shutdown,
    TokenChunk,
    Usage,
    WarmedUp,
)

log = logging.getLogger("skulk.engine")

IDLE_MIN_MS = 2
IDLE_MAX_MS = 64
#: A rank told to idle wakes this much before rank 0 said it would send the next block.
IDLE_MARGIN = 0.001
#: The most tokens a rank's KV budget is said to hold in the ``all_min`` (an int32).
KV_TOKENS_MAX = 2**31 - 1


class CollectiveError(Exception):
    """A distributed evaluation failed (a peer's connection lost), or the ranks lost step."""


@attrs.define
class _Slot:
    """Every rank's state of one open request; ``cache``: its own while it prefills (the batch
    takes it over when the slot joins)."""

    cache: list[Any]
    sampler: Sampler | None
    chunks: int = 0
    decodes: int = 0


@attrs.define
class _Request:
    """Rank 0's view of an open or queued request (``request_id`` ``None``: the warm-up)."""

    request_id: str | None
    tokens: list[int]
    params: SamplingParams
    out: TokenOutput
    fed: int = 0
    last: int | None = None
    reserved: int = 0  # KV bytes the budget holds for it once admitted


class Lockstep:
    """One rank's loop; :meth:`run` serves until shutdown and returns the exit code."""

    def __init__(
        self,
        link: Link,
        shard: Shard,
        engine: Engine | None,
        watchdog: CollectiveWatchdog,
        faults: Faults,
        load: Load,
        context_length: int,
    ) -> None:
        self._link = link
        self._shard = shard
        self._spec = shard.spec
        self._engine = engine
        self._watchdog = watchdog
        self._faults = faults
        self._load = load
        self._context = context_length
        self._kv_per_token: int | None = None  # of this rank's layers, measured when decoding
        self._pacer: PrefillPacer | None = None  # rank 0's: sizes the prefill chunks
        self.step = 0
        self.slots: dict[int, _Slot] = {}
        self.rows: list[int] = []  # the slots in the decode batch, in row order
        self._cache: list[Any] = []  # the batch's caches (see skulk.engine._rows)
        self._rows_decoded = 0  # rows of the last decode step (the trace notes changes)

    # ---- every rank ------------------------------------------------------------------------

    def barrier(self, seconds: float) -> None:
        """Wait (up to ``seconds``) until every rank got here."""
        with self._collective("barrier(loaded)", seconds):
            one = mx.array([1], dtype=mx.int32)
            count = int(cast(int, mx.distributed.all_sum(one, group=self._shard.group).item()))
        if count != self._spec.world:
            raise CollectiveError(f"barrier counted {count} of {self._spec.world}")

    def run(self) -> int:
        return self._lead() if self._spec.rank == 0 else self._follow()

    @contextlib.contextmanager
    def _collective(self, name: str, seconds: float | None = None) -> Iterator[Note]:
        """Build and evaluate, inside the block, work that contains a distributed operation:
        under the watchdog (``collective_timeout`` unless ``seconds``), its failure a
        :class:`CollectiveError`. Building belongs inside too: mlx may evaluate eagerly."""
        limit = self._spec.collective_timeout if seconds is None else seconds
        with self._watchdog.guard(name, self.step, limit) as note:
            try:
                yield note
            except (CollectiveError, LockstepError):
                raise
            except Exception as exc:
                raise CollectiveError(f"{name} at step {self.step} failed: {exc}") from exc

    def _exchange(self, control: Control | None) -> Control:
        """The step's control block: rank 0 gives ``control``, the others ``None`` and get
        rank 0's. The block goes along the ring, rank ``r`` to ``r + 1`` (a chain of sends is
        ~50 µs a hop here, where an ``all_sum`` between a pipeline's sends and receives costs
        ~2 ms). An idle block goes all the way round, back to rank 0, so rank 0 notices a
        stopped peer while idle too, not only at the next request."""
        rank, world, group = self._spec.rank, self._spec.world, self._shard.group
        with self._collective("broadcast(control)") as note:
            if control is not None:
                block = mx.array(encode(control), dtype=mx.int32)
                mx.eval(mx.distributed.send(block, 1, group=group))
                if control.idle_ms:
                    mx.eval(mx.distributed.recv_like(block, world - 1, group=group))
                agreed = control
            else:
                got = mx.distributed.recv((CONTROL_SIZE,), mx.int32, rank - 1, group=group)
                if rank < world - 1:
                    mx.eval(mx.distributed.send(got, rank + 1, group=group))
                try:
                    agreed = decode(cast(list[int], got.tolist()), self.step)
                except LockstepError as exc:
                    raise CollectiveError(f"lockstep lost at step {self.step}: {exc}") from exc
                if rank == world - 1 and agreed.idle_ms:
                    mx.eval(mx.distributed.send(got, 0, group=group))
            note.detail = agreed.describe()
        return agreed

    def _apply(self, control: Control, chunk: list[int] | None = None) -> dict[int, int]:
        """Run ``control`` on this rank; rank 0 gives the prefill ``chunk`` and gets the token
        sampled for each slot of the decode step."""
        for freed in control.frees:
            if freed in self.rows:
                i = self.rows.index(freed)
                self._cache, _, _ = drop_row(self._cache, len(self.rows), i)
                del self.rows[i]
            self.slots.pop(freed, None)
        if (o := control.opening) is not None:
            params = SamplingParams(
                temperature=o.temperature, top_p=o.top_p, top_k=o.top_k, seed=o.seed
            )
            self.slots[o.slot] = _Slot(self._shard.new_cache(), self._shard.sampler(params))
        if (c := control.prefill) is not None:
            if c.slot in self.rows:
                raise CollectiveError(f"step {self.step}: prefill for slot {c.slot}, decoding")
            self._prefill(c, self._open_slot(c.slot, "prefill"), chunk)
        return self._decode(dict(control.batch)) if control.batch else {}

    def _open_slot(self, slot: int, what: str) -> _Slot:
        found = self.slots.get(slot)
        if found is None:
            raise CollectiveError(f"step {self.step}: {what} for slot {slot}, not open")
        return found

    def _prefill(self, c: Chunk, slot: _Slot, chunk: list[int] | None) -> None:
        started = time.perf_counter()
        with self._collective("forward(prefill)"):
            if isinstance(self._shard, TensorShard):  # every rank embeds: share the tokens
                buf = [0] * PREFILL_STEP
                if chunk is not None:
                    buf[: len(chunk)] = chunk
                mine = mx.array(buf, dtype=mx.int32)
                tokens = mx.distributed.all_sum(mine, group=self._shard.group)[: c.n][None]
            elif chunk is not None:
                tokens = mx.array(chunk, dtype=mx.int32)[None]
            else:  # a later pipeline rank: only the shape matters, the hidden state comes in
                tokens = mx.zeros((1, c.n), dtype=mx.int32)
            mx.eval(self._shard.prefill(tokens, slot.cache))
        if self._pacer is not None:  # rank 0: a pipeline's other ranks take about as long each
            share = self._spec.world if self._spec.sharding == "pipeline" else 1
            self._pacer.record(c.n, (time.perf_counter() - started) * share)
        slot.chunks += 1
        self._faults.hit("prefill", slot.chunks)

    def _decode(self, feeds: dict[int, int]) -> dict[int, int]:
        """One decode step of the batch: the slots of ``feeds`` not in it yet join (in slot
        order), then one forward pass feeds each row its token."""
        for s in sorted(feeds):
            if s not in self.rows:
                slot = self._open_slot(s, "decode")
                self._cache = join_rows(self._cache, len(self.rows), slot.cache)
                slot.cache = []
                self.rows.append(s)
        if len(self.rows) != len(feeds):
            raise CollectiveError(
                f"step {self.step}: decode for slots {sorted(feeds)}, the batch holds "
                f"{sorted(self.rows)}"
            )
        slots = [self.slots[s] for s in self.rows]
        for slot in slots:
            self._faults.hit("decode", slot.decodes)
        samplers = [s.sampler for s in slots if s.sampler is not None] or None
        with self._collective("forward(decode)") as note:
            if len(slots) != self._rows_decoded:
                note.detail = f"rows {len(slots)}"
            tokens = mx.array([[feeds[s]] for s in self.rows], dtype=mx.int32)
            work, back = self._shard.decode(tokens, self._cache, samplers)
            mx.eval(work)
            sampled = None if back is None else cast(list[int], back.tolist())
        if self._kv_per_token is None:
            self._kv_per_token = kv_bytes_per_token(self._cache)
        self._rows_decoded = len(slots)
        for slot in slots:
            slot.decodes += 1
        return {} if sampled is None else dict(zip(self.rows, sampled, strict=True))

    def _agree_kv_tokens(self) -> int:
        """The tokens of KV state every rank's budget holds (see the module doc): this rank's
        budget over its bytes per token, the least of all ranks (a collective)."""
        per_token = self._kv_per_token
        if per_token is None:  # the warm-up decoded nothing (it failed): count nothing
            log.warning("runner: no decode step measured the KV bytes per token")
            per_token = 1
        capacity = kv_capacity(self._load.kv_cache_bytes, per_token, self._context)
        mine = mx.array([min(capacity // per_token, KV_TOKENS_MAX)], dtype=mx.int32)
        with self._collective("all_min(kv budget)"):
            least = mx.distributed.all_min(mine, group=self._shard.group)
            return int(cast(int, least.item()))

    # ---- ranks > 0 --------------------------------------------------------------------------

    def _follow(self) -> int:
        wait = 0.0
        while True:
            frames = [] if wait <= 0 else [self._link.wait_frame(wait)]
            while (frame := self._link.next_frame(block=False)) is not None:
                frames.append(frame)
            for frame in frames:
                if frame is None:
                    continue
                if frame is EOF or isinstance(frame, Shutdown):
                    return 0  # our node stops this rank: the group breaks, the others see it
                if isinstance(frame, Generate):
                    self._link.send(
                        RequestFailed(frame.request_id, "not_rank_zero", "only rank 0 serves")
                    )
                elif isinstance(frame, Cancel):
                    end = GenerationEnd("cancelled", Usage(0, 0))
                    self._link.send(Finished(frame.request_id, end))
                else:
                    log.error("runner: unexpected frame %r", frame)
                    return 3
            control = self._exchange(None)
            self._apply(control)
            if control.shutdown:
                message = "rank 0 ended the compute group"
                self._link.send(RunnerFailed(reason="group_stopped", message=message))
                return 0
            if control.warmed:
                self._agree_kv_tokens()
                self._link.send(WarmedUp())
            wait = control.idle_ms / 1000 - IDLE_MARGIN
            self._link.beat()
            self.step += 1

    # ---- rank 0 -----------------------------------------------------------------------------

    def _lead(self) -> int:
        assert self._engine is not None
        most = MAX_SLOTS if batchable(self._shard.new_cache()) else 1
        leader = _Leader(self._link, self._engine, self._faults, most, self._load.kv_waiting)
        self._link.stats = leader.stats
        self._pacer = leader.pacer
        leader.warm_up()
        wait = 0.0
        idle_ms = IDLE_MIN_MS
        while True:
            if wait > 0 and (frame := self._link.wait_frame(wait)) is not None:
                leader.handle(frame)
            while (frame := self._link.next_frame(block=False)) is not None:
                leader.handle(frame)
            if leader.protocol_error:
                return 3
            control, chunk = leader.compose(self.step)
            quiet = control == Control(self.step)
            if quiet:
                control = attrs.evolve(control, idle_ms=idle_ms)
                wait = idle_ms / 1000
                idle_ms = IDLE_MIN_MS if leader.waiting else min(2 * idle_ms, IDLE_MAX_MS)
            else:
                wait, idle_ms = 0.0, IDLE_MIN_MS
            control = self._exchange(control)
            sampled = self._apply(control, chunk)
            leader.applied(control)
            if control.shutdown:
                return 0
            if control.warmed:
                tokens = self._agree_kv_tokens()
                per_token = self._kv_per_token or 1
                leader.open_budget(KvBudget(tokens * per_token, per_token, self._context))
                self._link.send(WarmedUp())
            leader.advance(sampled)
            self._link.beat()
            self.step += 1


class _Leader:
    """Rank 0's bookkeeping: requests from the node, the KV budget, slots, what each step
    does, and the frames that go back to the node.

    A tokenized request is *admitted* — its KV bytes reserved — when it fits the budget and at
    most ``most`` requests are admitted; it then waits in ``_ready`` for the next block to open
    a slot for it. Otherwise it waits in ``_queue`` (FIFO, at most ``max_waiting``), and is
    admitted in order as requests close. Until every rank has agreed on the budget (after the
    warm-up, :meth:`open_budget`) only the warm-up requests are admitted."""

    def __init__(
        self, link: Link, engine: Engine, faults: Faults, most: int, max_waiting: int
    ) -> None:
        self._link = link
        self._engine = engine
        self._faults = faults
        self._most = most
        self._max_waiting = max(0, max_waiting)
        self._preparer = PromptPreparer(engine.tokenize, link.inbox)
        self.waiting: dict[str, int] = {}  # request id → tokenizer job
        self.budget: KvBudget | None = None
        self._ready: deque[_Request] = deque()  # admitted, each to open a slot
        self._queue: deque[_Request] = deque()  # waiting for room: the budget or a slot
        self._open: dict[int, _Request] = {}
        self._prefilling: deque[int] = deque()  # open slots still prefilling, oldest first
        self._decoding: set[int] = set()  # open slots in the decode batch
        self._free = set(range(MAX_SLOTS))
        self._to_free: deque[int] = deque()  # slots to free in a coming block
        self._warming = 0
        self._warmed_due = False
        self._stopping = False
        self.protocol_error = False
        self._totals = EngineTotals()
        self.pacer = PrefillPacer()

    def warm_up(self) -> None:
        """Queue the warm-up requests: greedy and sampled (top-p, top-k) generations, so the
        first real request pays neither for lazy set-up nor for compiling the sampler."""
        tokens = self._engine.tokenize(WARM_UP_PROMPT)
        for params in WARM_UP:
            self._ready.append(self._request(None, tokens, params))
        self._warming = len(WARM_UP)

    def open_budget(self, budget: KvBudget) -> None:
        """Every rank agreed on ``budget``: refuse the queued requests that can never fit it,
        and admit those that fit now."""
        self.budget = budget
        for req in list(self._queue):
            if (refusal := budget.refusal(len(req.tokens), req.params.max_tokens)) is not None:
                self._queue.remove(req)
                assert req.request_id is not None  # the warm-up never waits here
                self._fail(req.request_id, *refusal)
        self._admit_waiting()

    def stats(self) -> EngineStats | None:
        """The KV budget and the requests, if they changed since the last call that returned
        them (the link asks once per heartbeat); a sharded instance neither speculates nor
        keeps prefixes. The budget is counted in rank 0's bytes."""
        budget = self.budget or KvBudget(0, 1, 1)
        stats = EngineStats(
            speculation_verify_steps=0,
            speculation_plain_steps=0,
            speculation_drafted=0,
            speculation_accepted=0,
            prefix_hits=0,
            prefix_reused_tokens=0,
            prefix_bytes=0,
            prefix_entries=0,
            kv_capacity_bytes=budget.capacity,
            kv_reserved_bytes=budget.used,
            running=len(self._open),
            queued=len(self._ready) + len(self._queue),
        )
        return self._totals.changed(stats)

    def handle(self, frame: object) -> None:
        if frame is EOF or isinstance(frame, Shutdown):
            self._stopping = True
        elif isinstance(frame, Generate):
            self._accept(frame)
        elif isinstance(frame, Prepared):
            self._prepared(frame)
        elif isinstance(frame, Cancel):
            self._faults.hit("cancel")
            self._cancel(frame.request_id)
        else:
            log.error("runner: unexpected frame %r", frame)
            self.protocol_error = True

    def compose(self, step: int) -> tuple[Control, list[int] | None]:
        """This step's control block, and the prompt chunk its prefill feeds."""
        frees = tuple(self._to_free)
        self._to_free.clear()
        opening = None
        if self._ready and self._free:
            req = self._ready.popleft()
            slot = min(self._free)
            self._free.discard(slot)
            self._open[slot] = req
            self._prefilling.append(slot)
            p = req.params
            seed = p.seed if p.seed is not None else int.from_bytes(os.urandom(8), "little")
            opening = Opening(slot, p.temperature, p.top_p, p.top_k, seed)
        prefill, chunk = None, None
        while self._prefilling and prefill is None:
            slot = self._prefilling[0]
            req = self._open[slot]
            n = min(self.pacer.size(), len(req.tokens) - 1 - req.fed)
            if n > 0:
                prefill, chunk = Chunk(slot, n), req.tokens[req.fed : req.fed + n]
                req.fed += n
            if req.fed == len(req.tokens) - 1:  # its last prompt token is fed by a decode step
                self._prefilling.popleft()
                self._decoding.add(slot)
        batch = tuple((slot, self._feed(self._open[slot])) for slot in self._decoding)
        warmed, self._warmed_due = self._warmed_due, False
        control = Control(
            step,
            shutdown=self._stopping,
            warmed=warmed,
            frees=frees,
            opening=opening,
            prefill=prefill,
            batch=batch,
        )
        return control, chunk

    @staticmethod
    def _feed(req: _Request) -> int:
        """The token ``req``'s next decode step feeds: its last prompt token, then the last
        one sampled."""
        return req.tokens[-1] if req.last is None else req.last

    def applied(self, control: Control) -> None:
        """Every rank has freed ``control.frees``: the slots may be opened again."""
        self._free.update(control.frees)

    def advance(self, sampled: dict[int, int]) -> None:
        """Hand out the token sampled for each slot of the step's decode batch."""
        for slot, token in sampled.items():
            req = self._open.get(slot)
            if req is not None:
                self._emit(slot, req, token)

    def _emit(self, slot: int, req: _Request, token: int) -> None:
        req.last = token
        try:
            step = req.out.feed(token)
        except Exception as exc:
            log_failure("emitting a token failed", exc)
            self._close(slot)
            if req.request_id is None:
                self._finished(req, "stop")  # the warm-up ran all the same
            else:
                self._fail(req.request_id, "engine_error", f"decode failed: {exc}")
            return
        if req.request_id is not None and (step.token_ids or step.text):
            self._link.send(TokenChunk(req.request_id, step.token_ids, step.text))
        if step.finish_reason is not None:
            self._close(slot)
            self._finished(req, step.finish_reason)

    # ---- requests ---------------------------------------------------------------------------

    def _accept(self, req: Generate) -> None:
        rid = req.request_id
        if rid in self.waiting or self._find(rid) is not None:
            self._fail(rid, "duplicate_request", "request id already active")
            return
        try:
            self._engine.check_params(req.params)
        except RequestError as exc:
            self._fail(rid, exc.reason, exc.message)
            return
        if req.params.logprobs is not None:  # the sampling rank is not always rank 0
            self._fail(rid, "unsupported", "logprobs are not supported on sharded instances")
            return
        if req.params.json_schema is not None:  # the lockstep loop has no per-slot grammar
            what = "forced tool calls" if req.params.tool_call else "structured output"
            self._fail(rid, "unsupported", f"{what} are not supported on sharded instances")
            return
        self.waiting[rid] = self._preparer.submit(req)

    def _prepared(self, prepared: Prepared) -> None:
        req = prepared.request
        if self.waiting.get(req.request_id) != prepared.job:
            return  # cancelled while it was tokenized: already answered
        del self.waiting[req.request_id]
        if prepared.failure is not None:
            self._fail(req.request_id, *prepared.failure)
            return
        assert isinstance(req, Generate)  # the only job submitted here
        request = self._request(req.request_id, list(prepared.tokens), req.params)
        budget = self.budget
        if budget is not None:
            refusal = budget.refusal(len(request.tokens), req.params.max_tokens)
            if refusal is not None:
                self._fail(req.request_id, *refusal)
                return
        if not self._queue and self._room_for(request):
            self._admit(request)
        elif len(self._queue) < self._max_waiting:
            self._queue.append(request)
        else:
            self._fail(
                req.request_id,
                "kv_cache_full",
                f"the runner's KV cache is in use by {len(self._open) + len(self._ready)} "
                f"requests and {len(self._queue)} more wait for it",
            )

    def _request(self, rid: str | None, tokens: list[int], params: SamplingParams) -> _Request:
        out = TokenOutput(self._engine.tokenizer, params, len(tokens), self._engine.context_length)
        return _Request(rid, tokens, params, out)

    def _room_for(self, req: _Request) -> bool:
        """Whether ``req`` can be admitted now: a slot to come and room in the budget."""
        if self.budget is None or len(self._open) + len(self._ready) >= self._most:
            return False
        return self.budget.fits(self.budget.need(len(req.tokens), req.params.max_tokens))

    def _admit(self, req: _Request) -> None:
        assert self.budget is not None
        req.reserved = self.budget.need(len(req.tokens), req.params.max_tokens)
        self.budget.take(req.reserved)
        self._ready.append(req)

    def _release(self, req: _Request) -> None:
        """Give ``req``'s KV bytes back, and admit the queued requests that now fit, in order."""
        if self.budget is not None:
            self.budget.release(req.reserved)
        req.reserved = 0
        self._admit_waiting()

    def _admit_waiting(self) -> None:
        while self._queue and self._room_for(self._queue[0]):
            self._admit(self._queue.popleft())

    def _cancel(self, rid: str) -> None:
        found = self._find(rid)
        if found is not None:
            slot, req = found
            if slot is not None:
                self._close(slot)
            elif req in self._ready:
                self._ready.remove(req)
                self._release(req)
            else:
                self._queue.remove(req)
            usage = Usage(req.out.prompt_tokens, req.out.completion_tokens)
            end = GenerationEnd("cancelled", usage if slot is not None else Usage(0, 0))
            self._link.send(Finished(rid, end))
            return
        # Being tokenized (its tokens are dropped when they come) or unknown: acknowledge.
        self.waiting.pop(rid, None)
        self._link.send(Finished(rid, GenerationEnd("cancelled", Usage(0, 0))))

    def _find(self, rid: str) -> tuple[int | None, _Request] | None:
        for slot, req in self._open.items():
            if req.request_id == rid:
                return slot, req
        for req in (*self._ready, *self._queue):
            if req.request_id == rid:
                return None, req
        return None

    def _close(self, slot: int) -> None:
        """Stop serving ``slot``; it is freed on every rank by the next block, and its KV
        bytes go back to the budget."""
        req = self._open.pop(slot, None)
        if slot in self._prefilling:
            self._prefilling.remove(slot)
        self._decoding.discard(slot)
        self._to_free.append(slot)
        if req is not None:
            self._release(req)

    def _finished(self, req: _Request, reason: FinishReason) -> None:
        if req.request_id is None:
            self._warming -= 1
            self._warmed_due = self._warming == 0
            return
        usage = Usage(req.out.prompt_tokens, req.out.completion_tokens)
        end = GenerationEnd(reason, usage, req.out.stop_sequence)
        self._link.send(Finished(req.request_id, end))

    def _fail(self, rid: str, reason: str, message: str) -> None:
        self._link.send(RequestFailed(rid, reason, shorten(message)))
