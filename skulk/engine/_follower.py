"""Every rank of a sharded instance but rank 0: :class:`Follower` applies rank 0's messages
(:mod:`skulk.engine._ops`) in order — the same caches under the same keys, the same forward
passes with rank 0 (:meth:`~skulk.engine._shard.Shard.follow`) — until the group ends, and
answers its own node's frames (only rank 0 serves requests). See
:mod:`skulk.engine._sharded_forward` for rank 0's side.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable
from typing import Any

from mlx_lm.models.cache import trim_prompt_cache

from skulk.engine import _ops as ops
from skulk.engine._forward import compact
from skulk.engine._link import EOF, Link
from skulk.engine._ring import CollectiveError, Ring, budget_tokens
from skulk.engine._rows import drop_row, join_rows, kv_bytes_per_token
from skulk.engine._shard import Shard
from skulk.engine._watchdog import CollectiveWatchdog
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

#: A rank told to idle wakes this much before rank 0 said it would send the next message.
IDLE_MARGIN = 0.001


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
        self._ring = Ring(shard, watchdog)
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
