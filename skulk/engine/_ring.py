"""One rank's end of a sharded instance's message ring: rank 0 sends the messages of its
forward pass along the ring (:mod:`skulk.engine._ops`), every other rank receives them from its
left and passes them on to its right; with the collectives every rank joins (the barrier after
loading, the ``all_min`` of the budgets). Every operation runs under the collective watchdog,
its failure a :class:`CollectiveError`, after which nothing more is sent on the ring
(:attr:`Ring.broken`): an operation on a ring that failed may never return.

With the shard's doorbell (:mod:`skulk.engine._doorbell`) every message (header and body
together) is rung before it is sent and waited for before it is received, so a rank waiting
for the next message sleeps instead of spinning a core in mlx's receive.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import cast

import attrs
import mlx.core as mx

from skulk.engine import _ops as ops
from skulk.engine._budget import kv_capacity
from skulk.engine._prefix_cache import DEFAULT_PREFIX_CACHE_BYTES
from skulk.engine._shard import Shard
from skulk.engine._watchdog import CollectiveWatchdog, Note

#: The most tokens a rank's budgets are said to hold in the ``all_min`` (an int32).
TOKENS_MAX = 2**31 - 1


class CollectiveError(Exception):
    """A distributed evaluation failed (a peer's connection lost), or the ranks lost step."""


def budget_tokens(
    kv_configured: int | None, prefix_configured: int | None, per_token: int, context: int
) -> list[int]:
    """The tokens this rank's KV budget and prefix bound hold (what the ranks agree on)."""
    capacity = kv_capacity(kv_configured, per_token, context)
    prefix = DEFAULT_PREFIX_CACHE_BYTES if prefix_configured is None else prefix_configured
    return [min(capacity // per_token, TOKENS_MAX), min(prefix // per_token, TOKENS_MAX)]


class Ring:
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
            self._ring()
            mx.eval(mx.distributed.send(head, 1, group=group))
            if payload:
                mx.eval(mx.distributed.send(mx.array(payload, dtype=mx.int32), 1, group=group))
            if header.echo:
                self._wait()
                mx.eval(mx.distributed.recv_like(head, self.world - 1, group=group))
            note.detail = ops.describe(todo)
        self.seq += 1

    def receive(self) -> tuple[ops.Header, list[ops.Op]]:
        """A rank after the first: the next message from its left, passed on to its right."""
        group, rank = self.shard.group, self.rank
        with self.collective("broadcast(control)") as note:
            self._wait()
            head = mx.distributed.recv((ops.HEADER_SIZE,), mx.int32, rank - 1, group=group)
            if rank < self.world - 1:
                mx.eval(head)
                self._ring()
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
                self._ring()
                mx.eval(mx.distributed.send(head, 0, group=self.shard.group))

    def _ring(self) -> None:
        """Before sending a message (its header; the body follows at once): wake the right
        neighbour (:mod:`skulk.engine._doorbell`)."""
        if self.shard.doorbell is not None:
            self.shard.doorbell.ring()

    def _wait(self) -> None:
        """Before receiving a message: sleep until the left neighbour is about to send it."""
        if self.shard.doorbell is not None:
            self.shard.doorbell.wait()
