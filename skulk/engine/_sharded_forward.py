"""The distributed forward pass of a sharded instance: rank 0's :class:`ShardForward`, and
:class:`~skulk.engine._follower.Follower`, the loop of every other rank.

Rank 0 runs the one scheduler (:mod:`skulk.engine._scheduler`) exactly as a single process
does; its :class:`~skulk.engine._forward.Forward` is a :class:`ShardForward`. Every call the
scheduler makes on it that the other ranks must mirror — a new cache, a forward pass, a row
joining or leaving the decode batch, a rejected draft trimmed, a prefix kept or copied, a cache
forgotten — is done on rank 0's own caches and recorded as an op (:mod:`skulk.engine._ops`);
the ops go along the ring (rank ``r`` to ``r + 1``) in a message sent before each forward pass,
and every rank applies them in order, so every rank holds the same caches under the same keys
and runs every pass with rank 0. The logits come out on rank 0 (:mod:`skulk.engine._shard`:
a pipeline's last rank sends its hidden state back round the ring; a tensor group's rank 0
holds the head), so sampling, logprobs, grammar masks and speculation happen there, as in one
process. The prefix cache's index lives on rank 0; every rank keeps the entries' KV state of
its own layers, within a bound all ranks agree on in tokens (:class:`~skulk.engine._ops.Measure`,
an ``all_min``, as for the KV budget).

Rank 0's caches are :class:`Cache` lists that carry their key; when the scheduler lets one go
(garbage), a ``Free`` for its key goes out with the next message.

**Deadlines.** Rank 0 runs each turn of its loop, and every rank each message and each pass,
under the collective watchdog (:mod:`skulk.engine._watchdog`, ``collective_timeout``): a peer
that stops answering ends every rank within its deadline with a typed failure. A failure
inside a pass on rank 0 is checked (:meth:`ShardForward.check`): a compute-group failure ends
the runner at once with ``RunnerFailed(collective_failed)``; otherwise a message must still
come back round the ring, and the failure was the request's own (it fails alone).

**Waiting.** mlx's ring receive polls its socket, a whole core for as long as it waits, so
every message and every hidden state is announced on the ranks' doorbell
(:mod:`skulk.engine._doorbell`) and the receiving rank sleeps until then. **Idle.** When rank
0 has nothing to do it sends an idle message saying how long it will wait before the next
one (2 ms at first, doubling to :data:`IDLE_MAX_MS`); the others sleep that long (less a small
margin) on their own inbox, answering their node's frames, before they wait for the next
message. An idle message travels the whole ring back to rank 0, so a stopped peer is noticed
while idle too.

**Overlap.** On a pipeline (with the doorbell) the scheduler keeps its decode rows in as
many micro-batches as there are ranks (:attr:`ShardForward.micro_batches`) and starts each
one's pass with :meth:`ShardForward.start`: rank 0 computes its layers, sends the hidden state
on and returns at once, so it computes micro-batch B's layers while rank 1 computes A's (and,
with three ranks, rank 2 another's); a pass completes
(waiting for the last rank's answer, :class:`~skulk.engine._forward.Later`) when the
scheduler comes back to that micro-batch, in the order the passes started (the answers come
back in that order). The other ranks change nothing: they apply messages in order. Anything
whose answer comes back round the ring — a plain pass, an echoed message, the budgets'
``all_min`` — first completes the passes in flight. The trace notes the most passes in flight
at a completion when it grows (``in flight 2``: two micro-batches overlapped).
``SKULK_PIPELINE_OVERLAP=off`` in rank 0's environment turns this off (one batch, a
benchmark's baseline).
"""

from __future__ import annotations

import contextlib
import logging
import os
import weakref
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx

from skulk.engine import OVERLAP_ENV
from skulk.engine import _ops as ops
from skulk.engine._doorbell import DoorbellError
from skulk.engine._forward import Budgets, Forward, Later, compact
from skulk.engine._ring import CollectiveError, Ring, budget_tokens
from skulk.engine._rows import drop_row, join_rows, kv_bytes_per_token
from skulk.engine._shard import PipelineShard, Shard
from skulk.engine._watchdog import CollectiveWatchdog

log = logging.getLogger("skulk.engine")

IDLE_MIN_MS = 2
IDLE_MAX_MS = 64


class Cache(list[Any]):
    """Rank 0's cache (one entry per layer) and the key the other ranks know it by."""

    key: int


def _key_of(cache: Sequence[Any]) -> int:
    return cache.key if isinstance(cache, Cache) else 0


class ShardForward(Forward):
    """Rank 0's forward pass of a sharded instance (see the module doc)."""

    def __init__(self, shard: Shard, watchdog: CollectiveWatchdog) -> None:
        super().__init__(shard.model)
        self._shard = shard
        self._ring = Ring(shard, watchdog)
        self._pending: list[ops.Op] = []
        self._next_key = 1
        self._idle_ms = IDLE_MIN_MS
        self._what = "forward"  # the kind of the turn in progress (for a failure's message)
        self._flight: deque[Later] = deque()  # passes started, not completed, oldest first
        self._traced_flight = 1  # the most passes in flight at a completion so far (traced)
        overlap = os.environ.get(OVERLAP_ENV, "on") != "off"
        if overlap and isinstance(shard, PipelineShard) and shard.doorbell is not None:
            self.micro_batches = self._ring.world  # one micro-batch per stage

    # ---- caches -------------------------------------------------------------------------------

    def _track(self, layers: list[Any]) -> Cache:
        cache = Cache(layers)
        cache.key = self._next_key
        self._next_key += 1
        weakref.finalize(cache, self._pending.append, ops.Free(cache.key))
        return cache

    def _same_or_new(self, result: list[Any], before: Sequence[Any]) -> Cache:
        """``result`` as a tracked cache: ``before`` itself when it is the same list."""
        if result is before and isinstance(before, Cache):
            return before
        return self._track(result)

    def new_cache(self) -> list[Any]:
        cache = self._track(self._shard.new_cache())
        self._pending.append(ops.New(cache.key))
        return cache

    def join(self, cache: list[Any], rows: int, own: list[Any]) -> list[Any]:
        result = self._same_or_new(join_rows(cache, rows, own), cache if rows else own)
        self._pending.append(ops.Join(_key_of(cache), rows, _key_of(own), result.key))
        return result

    def drop(
        self, cache: list[Any], rows: int, i: int, *, keep_cache: bool = False
    ) -> tuple[list[Any], list[Any] | None, list[int]]:
        rest, own, keep = drop_row(cache, rows, i, keep_cache=keep_cache)
        kept_rest = self._same_or_new(rest, cache) if rest else None
        kept_own = None if own is None else self._track(own)
        self._pending.append(
            ops.Drop(
                _key_of(cache),
                rows,
                i,
                0 if kept_rest is None else kept_rest.key,
                0 if kept_own is None else kept_own.key,
            )
        )
        return ([] if kept_rest is None else kept_rest), kept_own, keep

    def trim(self, cache: Sequence[Any], n: int) -> None:
        super().trim(cache, n)
        if n > 0:
            self._pending.append(ops.Trim(_key_of(cache), n))

    def keep(self, cache: Sequence[Any], n: int) -> list[Any] | None:
        kept = compact(cache, n)
        if kept is None:
            return None
        entry = self._track(kept)
        self._pending.append(ops.Keep(_key_of(cache), n, entry.key))
        return entry

    def copy(self, fetched: list[Any], n: int) -> list[Any]:
        source = _key_of(fetched)  # the prefix cache's deep copy keeps its entry's key
        out = self._track(super().copy(fetched, n))
        self._pending.append(ops.Copy(source, n, out.key))
        return out

    # ---- passes -------------------------------------------------------------------------------

    def _issue(self, cache: list[Any] | None, tokens: mx.array, back: bool) -> None:
        rows, length = tokens.shape
        self._pending.append(ops.Forward(_key_of(cache or []), rows, length, back))
        self._flush()

    def __call__(self, tokens: mx.array, cache: list[Any] | None = None) -> mx.array:
        self._drain()
        self._issue(cache, tokens, back=True)
        return self._shard.logits(tokens, cache)

    def start(self, tokens: mx.array, cache: list[Any]) -> mx.array | Later:
        """With micro-batches (a pipeline with a doorbell): rank 0's layers of the pass,
        computed and sent on, and a :class:`Later` whose value waits for the last rank's
        answer (see the module doc, **Overlap**); otherwise the plain call."""
        if self.micro_batches == 1:
            return self(tokens, cache)
        assert isinstance(self._shard, PipelineShard)
        self._issue(cache, tokens, back=True)
        item = Later(self._shard.start(tokens, cache))
        self._flight.append(item)
        return Later(lambda: self._through(item))

    def _through(self, item: Later) -> mx.array:
        """Complete the passes in flight up to ``item``, oldest first (the answers come back
        in that order), under the collective deadline."""
        with self._ring.collective("forward(decode)") as note:
            if len(self._flight) > self._traced_flight:  # the trace notes a new most
                self._traced_flight = len(self._flight)
                note.detail = f"in flight {self._traced_flight}"
            while not item.done:
                self._flight.popleft().value()
        return item.value()

    def _drain(self) -> None:
        """Complete every pass in flight: before a pass or message whose answer comes back
        (it would come after theirs)."""
        if self._flight:
            self._through(self._flight[-1])

    def hidden(self, tokens: mx.array, cache: list[Any] | None = None) -> mx.array:
        self._drain()
        self._issue(cache, tokens, back=True)
        return self._shard.hidden(tokens, cache)

    def fill(self, tokens: mx.array, cache: list[Any]) -> None:
        self._issue(cache, tokens, back=False)
        self._shard.fill(tokens, cache)

    def budgets(
        self, kv_configured: int | None, prefix_configured: int | None, context_length: int
    ) -> Budgets:
        """Every rank's budgets in tokens, the least of each agreed (``all_min``), in rank
        0's bytes."""
        self._drain()
        cache = self.new_cache()
        self.fill(mx.array([[0]]), cache)
        per_token = kv_bytes_per_token(cache)
        self._pending.append(ops.Measure(_key_of(cache)))
        self._flush()
        mine = budget_tokens(kv_configured, prefix_configured, per_token, context_length)
        kv_tokens, prefix_tokens = self._ring.all_min(mine)
        return Budgets(kv_tokens * per_token, prefix_tokens * per_token, per_token)

    # ---- the loop -----------------------------------------------------------------------------

    def _flush(self, idle_ms: int = 0, echo: bool = False) -> None:
        if echo:
            self._drain()
        # The same list object throughout: the caches' finalizers append to it.
        todo = list(self._pending)
        del self._pending[: len(todo)]
        self._ring.send(ops.Header(self._ring.seq, 0, idle_ms, echo), todo)

    @contextlib.contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """A turn of rank 0's loop, named by the last message every rank was sent before it:
        the passes a turn waits on first are that message's (the next pass is queued behind
        them), so a peer that stops shows as the step the timeline last traced."""
        self._idle_ms = IDLE_MIN_MS
        self._what = what
        with self._ring.collective(what, step=max(0, self._ring.seq - 1)):
            yield

    def idle(self, soon: bool = False) -> float | None:
        idle_ms = IDLE_MIN_MS if soon else self._idle_ms
        self._flush(idle_ms, echo=True)
        self._idle_ms = min(2 * idle_ms, IDLE_MAX_MS)
        return idle_ms / 1000

    def check(self, error: Exception) -> None:
        """A failed step: a compute-group failure (mlx says ``[ring]``, or a neighbour closed
        the doorbell) ends the group at once;
        otherwise the group must still answer a message round the ring, and the failure was
        the step's own (only its requests fail)."""
        if "[ring]" in str(error) or isinstance(error, DoorbellError):
            self._ring.broken = True
            raise CollectiveError(f"{self._what} at step {self._ring.seq} failed: {error}")
        self._flush(echo=True)

    def warmed(self) -> None:
        self._pending.append(ops.Warmed())

    def close(self) -> None:
        """Tell the other ranks the group ends, unless it is broken already: an operation on
        a ring that failed may never return."""
        if self._ring.broken:
            return
        with contextlib.suppress(CollectiveError):
            self._pending.append(ops.Shutdown())
            self._flush()

    def barrier(self, seconds: float) -> None:
        self._ring.barrier(seconds)
