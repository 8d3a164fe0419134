"""The distributed forward pass of a sharded instance: rank 0's :class:`ShardForward`, and
:class:`Follower`, the loop of every other rank.

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
inside a pass on rank 0 is checked (:meth:`ShardForward.check`: a message that must come back
round the ring); a group that no longer answers ends the runner with
``RunnerFailed(collective_failed)``, a request-local failure fails only its request.

**Idle.** A rank waiting inside a receive spins a CPU core (the ring backend polls its
sockets), so when rank 0 has nothing to do it sends an idle message saying how long it will
wait before the next one (2 ms at first, doubling to :data:`IDLE_MAX_MS`); the others sleep
that long (less a small margin) on their own inbox instead. An idle message travels the whole
ring back to rank 0, so a stopped peer is noticed while idle too.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import attrs
import mlx.core as mx
from mlx_lm.models.cache import trim_prompt_cache

from skulk.engine import _ops as ops
from skulk.engine._budget import kv_capacity
from skulk.engine._forward import Budgets, Forward, compact
from skulk.engine._link import EOF, Link
from skulk.engine._prefix_cache import DEFAULT_PREFIX_CACHE_BYTES
from skulk.engine._rows import drop_row, join_rows, kv_bytes_per_token
from skulk.engine._shard import Shard
from skulk.engine._watchdog import CollectiveWatchdog, Note
from skulk.engine.faults import Faults
from skulk.wire.runner import (
    Cancel,
    Finished,
    Generate,
    GenerationEnd,
    Load,
    RequestFailed,
    RunnerFailed,
    Shutdown,
    Usage,
    WarmedUp,
)

log = logging.getLogger("skulk.engine")

IDLE_MIN_MS = 2
IDLE_MAX_MS = 64
#: A rank told to idle wakes this much before rank 0 said it would send the next message.
IDLE_MARGIN = 0.001
#: The most tokens a rank's budgets are said to hold in the ``all_min`` (an int32).
TOKENS_MAX = 2**31 - 1


class CollectiveError(Exception):
    """A distributed evaluation failed (a peer's connection lost), or the ranks lost step."""


class Cache(list[Any]):
    """Rank 0's cache (one entry per layer) and the key the other ranks know it by."""

    key: int


def _key_of(cache: Sequence[Any]) -> int:
    return cache.key if isinstance(cache, Cache) else 0


def budget_tokens(
    kv_configured: int | None, prefix_configured: int | None, per_token: int, context: int
) -> list[int]:
    """The tokens this rank's KV budget and prefix bound hold (what the ranks agree on)."""
    capacity = kv_capacity(kv_configured, per_token, context)
    prefix = DEFAULT_PREFIX_CACHE_BYTES if prefix_configured is None else prefix_configured
    return [min(capacity // per_token, TOKENS_MAX), min(prefix // per_token, TOKENS_MAX)]


class _Ring:
    """One rank's end of the message ring (see :mod:`skulk.engine._ops`)."""

    def __init__(self, shard: Shard, watchdog: CollectiveWatchdog) -> None:
        self.shard = shard
        self.rank, self.world = shard.spec.rank, shard.spec.world
        self.watchdog = watchdog
        self.seq = 0
        self.broken = False  # an operation failed: nothing more is sent on this ring

    @contextlib.contextmanager
    def collective(
        self, name: str, seconds: float | None = None, step: int | None = None
    ) -> Iterator[Note]:
        """Build and evaluate, inside the block, work that contains a distributed operation:
        under the watchdog (``collective_timeout`` unless ``seconds``), its failure a
        :class:`CollectiveError`. Building belongs inside too: mlx may evaluate eagerly. Its
        trace entry names ``step`` (default: the next message's)."""
        limit = self.shard.spec.collective_timeout if seconds is None else seconds
        at = self.seq if step is None else step
        with self.watchdog.guard(name, at, limit) as note:
            try:
                yield note
            except (CollectiveError, ops.OpsError):
                self.broken = True
                raise
            except Exception as exc:
                self.broken = True
                raise CollectiveError(f"{name} at step {self.seq} failed: {exc}") from exc

    def barrier(self, seconds: float) -> None:
        """Wait (up to ``seconds``) until every rank got here."""
        with self.collective("barrier(loaded)", seconds):
            one = mx.array([1], dtype=mx.int32)
            count = int(cast(int, mx.distributed.all_sum(one, group=self.shard.group).item()))
        if count != self.world:
            raise CollectiveError(f"barrier counted {count} of {self.world}")

    def all_min(self, values: list[int]) -> list[int]:
        with self.collective("all_min(budgets)"):
            mine = mx.array(values, dtype=mx.int32)
            least = mx.distributed.all_min(mine, group=self.shard.group)
            return cast(list[int], least.tolist())

    def send(self, header: ops.Header, todo: Sequence[ops.Op]) -> None:
        """Rank 0: a message to rank 1 (and, with ``echo``, wait for it to come back)."""
        payload = ops.encode(todo)
        header = attrs.evolve(header, length=len(payload))
        group = self.shard.group
        with self.collective("broadcast(control)") as note:
            head = mx.array(ops.encode_header(header), dtype=mx.int32)
            mx.eval(mx.distributed.send(head, 1, group=group))
            if payload:
                mx.eval(mx.distributed.send(mx.array(payload, dtype=mx.int32), 1, group=group))
            if header.echo:
                mx.eval(mx.distributed.recv_like(head, self.world - 1, group=group))
            note.detail = ops.describe(todo)
        self.seq += 1

    def receive(self) -> tuple[ops.Header, list[ops.Op]]:
        """A rank after the first: the next message from its left, passed on to its right."""
        group, rank = self.shard.group, self.rank
        with self.collective("broadcast(control)") as note:
            head = mx.distributed.recv((ops.HEADER_SIZE,), mx.int32, rank - 1, group=group)
            if rank < self.world - 1:
                mx.eval(mx.distributed.send(head, rank + 1, group=group))
            header = ops.decode_header(cast(list[int], head.tolist()), self.seq)
            words: list[int] = []
            if header.length:
                body = mx.distributed.recv((header.length,), mx.int32, rank - 1, group=group)
                if rank < self.world - 1:
                    mx.eval(mx.distributed.send(body, rank + 1, group=group))
                words = cast(list[int], body.tolist())
            todo = ops.decode(words)
            note.detail = ops.describe(todo)
        self.seq += 1
        return header, todo

    def echo(self, header: ops.Header) -> None:
        """The last rank: an echoed message goes back to rank 0 once applied."""
        if header.echo and self.rank == self.world - 1:
            with self.collective("broadcast(control)"):
                head = mx.array(ops.encode_header(header), dtype=mx.int32)
                mx.eval(mx.distributed.send(head, 0, group=self.shard.group))


class ShardForward(Forward):
    """Rank 0's forward pass of a sharded instance (see the module doc)."""

    def __init__(self, shard: Shard, watchdog: CollectiveWatchdog) -> None:
        super().__init__(shard.model)
        self._shard = shard
        self._ring = _Ring(shard, watchdog)
        self._pending: list[ops.Op] = []
        self._next_key = 1
        self._idle_ms = IDLE_MIN_MS
        self._what = "forward"  # the kind of the turn in progress (for a failure's message)

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
        self._issue(cache, tokens, back=True)
        return self._shard.logits(tokens, cache)

    def hidden(self, tokens: mx.array, cache: list[Any] | None = None) -> mx.array:
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
        """A failed step: a compute-group failure (mlx says ``[ring]``) ends the group at once;
        otherwise the group must still answer a message round the ring, and the failure was
        the step's own (only its requests fail)."""
        if "[ring]" in str(error):
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


class Follower:
    """A rank after the first: :meth:`run` applies rank 0's messages until the group ends."""

    def __init__(
        self,
        link: Link,
        shard: Shard,
        watchdog: CollectiveWatchdog,
        faults: Faults,
        load: Load,
        context: int,
    ) -> None:
        self._link = link
        self._shard = shard
        self._ring = _Ring(shard, watchdog)
        self._faults = faults
        self._load = load
        self._context = context
        self._caches: dict[int, list[Any]] = {}
        self._passes: dict[int, int] = {}  # passes through a cache (the fault hooks' count)
        self._rows = 0  # rows of the last decode pass (the trace notes changes)

    def barrier(self, seconds: float) -> None:
        self._ring.barrier(seconds)

    def run(self) -> int:
        wait = 0.0
        while True:
            if (code := self._frames(wait)) is not None:
                return code
            header, todo = self._ring.receive()
            for op in todo:
                if isinstance(op, ops.Shutdown):
                    message = "rank 0 ended the compute group"
                    self._link.send(RunnerFailed(reason="group_stopped", message=message))
                    return 0
                self._apply(op)
            self._ring.echo(header)
            wait = header.idle_ms / 1000 - IDLE_MARGIN
            self._link.beat()

    def _frames(self, wait: float) -> int | None:
        """Answer the node's frames (only rank 0 serves); an exit code when it stops us."""
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
                self._link.send(Finished(frame.request_id, GenerationEnd("cancelled", Usage(0, 0))))
            else:
                log.error("runner: unexpected frame %r", frame)
                return 3
        return None

    def _get(self, key: int) -> list[Any]:
        if key == 0:
            return []
        found = self._caches.get(key)
        if found is None:
            raise CollectiveError(f"message {self._ring.seq}: no cache {key} on this rank")
        return found

    def _put(self, key: int, cache: list[Any] | None) -> None:
        if key and cache is not None:
            self._caches[key] = cache

    def _apply(self, op: ops.Op) -> None:
        handler = self._HANDLERS.get(type(op))
        if handler is None:
            raise CollectiveError(f"message {self._ring.seq}: unexpected op {op!r}")
        try:
            handler(self, op)
        except (CollectiveError, ops.OpsError):
            raise
        except Exception as exc:
            raise CollectiveError(f"{op!r} at message {self._ring.seq} failed: {exc}") from exc

    def _new(self, op: ops.New) -> None:
        self._caches[op.key] = self._shard.new_cache()

    def _free(self, op: ops.Free) -> None:
        self._caches.pop(op.key, None)
        self._passes.pop(op.key, None)

    def _forward(self, op: ops.Forward) -> None:
        cache = self._get(op.key) if op.key else None
        done = self._passes.get(op.key, 0)
        decode = op.length == 1
        name = "forward(decode)" if decode else "forward(prefill)"
        for _ in range(op.rows if decode else 1):
            self._faults.hit("decode" if decode else "prefill", done)
        with self._ring.collective(name) as note:
            if decode and op.rows != self._rows:
                note.detail = f"rows {op.rows}"
            self._shard.follow(op.rows, op.length, cache, op.back)
        if decode:
            self._rows = op.rows
        self._passes[op.key] = done + 1

    def _join(self, op: ops.Join) -> None:
        own = self._get(op.own)
        result = join_rows(self._get(op.batch), op.rows, own)
        self._caches.pop(op.own, None)
        if op.batch != op.result:
            self._caches.pop(op.batch, None)
        self._put(op.result, result)
        self._passes[op.result] = max(self._passes.get(op.batch, 0), self._passes.get(op.own, 0))

    def _drop(self, op: ops.Drop) -> None:
        rest, own, _ = drop_row(self._get(op.batch), op.rows, op.index, keep_cache=bool(op.own))
        if op.rest != op.batch:
            self._caches.pop(op.batch, None)
        self._put(op.rest, rest if op.rest else None)
        self._put(op.own, own)

    def _trim(self, op: ops.Trim) -> None:
        trim_prompt_cache(self._get(op.key), op.n)

    def _keep(self, op: ops.Keep) -> None:
        kept = compact(self._get(op.key), op.n)
        if kept is None:
            raise CollectiveError(f"cannot keep {op.n} tokens of cache {op.key}")
        self._caches[op.entry] = kept

    def _copy(self, op: ops.Copy) -> None:
        fetched = copy.deepcopy(self._get(op.entry))
        held = int(fetched[0].offset) if fetched else 0
        if held > op.n:
            trim_prompt_cache(fetched, held - op.n)
        self._caches[op.key] = fetched

    def _measure(self, op: ops.Measure) -> None:
        per_token = kv_bytes_per_token(self._get(op.key))
        load = self._load
        mine = budget_tokens(
            load.kv_cache_bytes, load.prefix_cache_bytes, per_token, self._context
        )
        self._ring.all_min(mine)

    def _warmed(self, op: ops.Warmed) -> None:
        self._link.send(WarmedUp())

    _HANDLERS: dict[type, Callable[[Follower, Any], None]] = {
        ops.New: _new,
        ops.Free: _free,
        ops.Forward: _forward,
        ops.Join: _join,
        ops.Drop: _drop,
        ops.Trim: _trim,
        ops.Keep: _keep,
        ops.Copy: _copy,
        ops.Measure: _measure,
        ops.Warmed: _warmed,
    }
