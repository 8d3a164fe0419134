"""An n-rank sharded instance of runners on this machine (loopback ports): for tests and
benchmarks (``python -m skulk.bench distributed``), and for trying a sharding by hand.

:func:`open_local_group` starts one :class:`~skulk.runner.Runner` per rank, each supervised
on its own (one rank's failure does not cancel the others, so each rank's own typed failure
can be observed), and stops them all when the block ends::

    specs = shard_specs("pipeline", loopback_hosts(2), layers=16)
    async with open_local_group("m", path, specs, config) as group:
        async with group.runners[0].open_request(rid, prompt, params) as events:
            ...
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Literal

import attrs
import trio

from skulk.runner._config import RunnerConfig
from skulk.runner._errors import RunnerCrashed, RunnerError
from skulk.runner._process import Runner
from skulk.wire.runner import ShardSpec


def loopback_hosts(world: int, host: str = "127.0.0.1") -> tuple[str, ...]:
    """``world`` distinct ``host:port`` endpoints whose ports were free a moment ago (bound to
    port 0 together, then released)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(world)]
    try:
        for s in socks:
            s.bind((host, 0))
        return tuple(f"{host}:{s.getsockname()[1]}" for s in socks)
    finally:
        for s in socks:
            s.close()


def even_layers(layers: int, world: int, rank: int) -> tuple[int, int]:
    """Rank ``rank``'s layers ``[start, end)`` when ``layers`` are split evenly."""
    return rank * layers // world, (rank + 1) * layers // world


def shard_specs(
    sharding: Literal["pipeline", "tensor"],
    hosts: Sequence[str],
    layers: int,
    *,
    connect_timeout: float = 30.0,
    collective_timeout: float = 30.0,
) -> tuple[ShardSpec, ...]:
    """One spec per host: pipeline ranks get an even split of ``layers``, tensor ranks all."""
    world = len(hosts)
    return tuple(
        ShardSpec(
            sharding,
            rank,
            tuple(hosts),
            *(even_layers(layers, world, rank) if sharding == "pipeline" else (0, layers)),
            connect_timeout=connect_timeout,
            collective_timeout=collective_timeout,
        )
        for rank in range(world)
    )


@attrs.define
class LocalGroup:
    """The runners of one local sharded instance, by rank; ``ended[r]`` is set once rank
    ``r``'s :meth:`Runner.run` returned (its failure, if any, is ``runners[r].failure``)."""

    runners: list[Runner]
    ended: list[trio.Event]
    _changed: trio.Event = attrs.field(factory=trio.Event)
    _scopes: list[trio.CancelScope] = attrs.field(factory=list)

    def stop(self, rank: int) -> None:
        """Stop rank ``rank``'s runner as its node would (rank 0: the whole group follows)."""
        self._scopes[rank].cancel()

    def _phase_changed(self, runner: Runner) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_ready(self) -> None:
        """Until every rank is ready; raises the first failure (by rank) if a rank fails or
        stops first."""
        while True:
            for r, runner in enumerate(self.runners):
                if runner.failure is not None:
                    raise runner.failure
                if self.ended[r].is_set():
                    raise RunnerCrashed(f"rank {r} stopped before the group was ready")
            if all(r.phase in ("ready", "busy") for r in self.runners):
                return
            changed = self._changed
            with trio.move_on_after(0.5):  # ended events are set without a phase change
                await changed.wait()


@asynccontextmanager
async def open_local_group(
    model_id: str,
    model_path: str,
    specs: Sequence[ShardSpec],
    config: RunnerConfig | None = None,
    *,
    faults: Mapping[int, str] | None = None,
    kv_cache_bytes: Mapping[int, int] | None = None,
    wait_ready: bool = True,
) -> AsyncIterator[LocalGroup]:
    """Run one runner per spec (``faults`` and ``kv_cache_bytes`` by rank override
    ``config``'s); with ``wait_ready``, yield once all are ready (raising the first failure
    otherwise). Every runner is stopped when the block ends."""
    base = config or RunnerConfig()
    group = LocalGroup([], [trio.Event() for _ in specs])
    group._scopes = [trio.CancelScope() for _ in specs]
    for spec in specs:
        cfg = attrs.evolve(
            base,
            faults=(faults or {}).get(spec.rank, base.faults),
            kv_cache_bytes=(kv_cache_bytes or {}).get(spec.rank, base.kv_cache_bytes),
        )
        group.runners.append(
            Runner(model_id, model_path, cfg, on_phase=group._phase_changed, shard=spec)
        )

    async def supervise(rank: int) -> None:
        try:
            with group._scopes[rank]:
                await group.runners[rank].run()
        except RunnerError:
            pass  # kept as the runner's failure
        finally:
            group.ended[rank].set()
            group._phase_changed(group.runners[rank])

    try:
        async with trio.open_nursery() as nursery:
            for rank in range(len(specs)):
                nursery.start_soon(supervise, rank)
            if wait_ready:
                await group.wait_ready()
            yield group
            nursery.cancel_scope.cancel()
    except BaseExceptionGroup as exc:
        # Our nursery only wraps (its tasks never raise): hand the caller its own exception.
        if len(exc.exceptions) == 1:
            raise exc.exceptions[0] from None
        raise
