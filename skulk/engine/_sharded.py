"""A runner that is one rank of a sharded instance: group formation, shard loading, then
serving: rank 0 runs the one scheduler over the distributed forward pass, the other ranks follow
it (:mod:`skulk.engine._sharded_forward`).

After ``Load`` (with a :class:`~skulk.wire.runner.ShardSpec`) the rank:

1. builds the model lazily and checks that it can be sharded as asked (``unsupported_sharding``
   names the family or the arithmetic) — before joining, so every rank refuses at once;
2. sends ``GroupJoining``, writes the MLX ring hostfile (one ``["host:port"]`` per rank) to a
   temporary file, sets ``MLX_HOSTFILE``/``MLX_RANK`` and calls
   ``mx.distributed.init(backend="ring", strict=True)`` under :func:`init_alarm`
   (``connect_timeout``; an error is ``group_connect_failed``); checks rank and size, forms
   the ranks' doorbell connections (:func:`form_doorbell`, same deadline and failure) and
   sends ``GroupJoined``;
3. loads only its shard's tensors (``LoadProgress``), waits for every rank to have loaded (a
   guarded barrier of up to the node's load timeout) and sends ``Loaded``;
4. serves: rank 0 warms up and serves through :func:`~skulk.engine._serve.warm_and_serve`
   with a :class:`~skulk.engine._sharded_forward.ShardForward`, the others run a
   :class:`~skulk.engine._sharded_forward.Follower` (``WarmedUp`` once rank 0 says so).

A collective that fails (a peer's connection lost) ends the rank with
``RunnerFailed(collective_failed)``; one that outlives its deadline, through the watchdog, with
``CollectiveTimeout``. The process then leaves with ``os._exit`` (after flushing its output):
mlx's ring threads must not be waited for at interpreter shutdown.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, NoReturn

import mlx.core as mx
from mlx_lm.utils import load_tokenizer

from skulk.engine import DOORBELL_ENV
from skulk.engine._doorbell import Doorbell, open_doorbell
from skulk.engine._engine import DEFAULT_CONTEXT, Engine
from skulk.engine._follower import Follower
from skulk.engine._link import Link
from skulk.engine._prepare import load_failure_reason, log_failure, shorten
from skulk.engine._ring import CollectiveError
from skulk.engine._serve import warm_and_serve
from skulk.engine._shard import (
    Shard,
    ShardingUnsupported,
    check_sharding,
    load_shard,
    open_model,
)
from skulk.engine._sharded_forward import ShardForward
from skulk.engine._watchdog import COLLECTIVE_FAILED_EXIT_CODE, CollectiveWatchdog, init_alarm
from skulk.engine.faults import Faults
from skulk.wire.runner import (
    GroupJoined,
    GroupJoining,
    Load,
    Loaded,
    LoadProgress,
    RunnerFailed,
    ShardSpec,
)

log = logging.getLogger("skulk.engine")

#: The init alarm fires this much after ``connect_timeout``: the node's own connect deadline
#: should speak first; the alarm is for a rank whose node is gone.
CONNECT_ALARM_SLACK = 1.0


def run_sharded(
    link: Link, load: Load, spec: ShardSpec, faults: Faults, load_timeout: float
) -> NoReturn:
    """Serve ``load`` as rank ``spec.rank``; never returns (exits the process)."""
    try:
        code = _run(link, load, spec, faults, load_timeout)
    except (BrokenPipeError, ConnectionResetError):
        code = 0  # the node closed the link: it is stopping us
    except Exception as exc:  # a bug: say so, and leave without waiting for mlx's threads
        log_failure("the sharded runner failed", exc)
        with contextlib.suppress(OSError):
            link.send(RunnerFailed(reason="runner_error", message=shorten(f"{exc!r}")))
        code = 1
    faults.hit("exit")
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run(link: Link, load: Load, spec: ShardSpec, faults: Faults, load_timeout: float) -> int:
    path = Path(load.model_path)
    try:
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"no model at {path} (config.json missing)")
        model, config = open_model(path)
        check_sharding(model, config, spec)
    except ShardingUnsupported as exc:
        link.send(RunnerFailed(reason="unsupported_sharding", message=shorten(str(exc))))
        return 2
    except (BrokenPipeError, ConnectionResetError):
        raise
    except Exception as exc:
        link.send(RunnerFailed(reason=load_failure_reason(exc), message=shorten(str(exc))))
        return 2
    faults.hit("connect")
    link.send(GroupJoining())
    try:
        group = join_group(spec)
    except Exception as exc:
        log_failure("could not join the compute group", exc)
        message = shorten(f"rank {spec.rank} could not join {', '.join(spec.hosts)}: {exc}")
        link.send(RunnerFailed(reason="group_connect_failed", message=message))
        return 2
    watchdog = CollectiveWatchdog(link.send_within)
    try:
        doorbell = form_doorbell(spec, group, watchdog)
    except Exception as exc:
        log_failure("could not form the doorbell", exc)
        message = shorten(f"rank {spec.rank} could not form its doorbell: {exc}")
        link.send(RunnerFailed(reason="group_connect_failed", message=message))
        return 2
    link.send(GroupJoined(world=group.size()))
    link.trace = watchdog.take_trace
    try:
        shard, context = _load(link, model, config, spec, group, faults, doorbell)
    except (BrokenPipeError, ConnectionResetError):
        raise
    except Exception as exc:
        log_failure("could not load the shard", exc)
        link.send(RunnerFailed(reason=load_failure_reason(exc), message=shorten(str(exc))))
        return 2
    try:
        if spec.rank == 0:  # rank 0 alone tokenizes, schedules and talks to the node
            forward = ShardForward(shard, watchdog)
            forward.barrier(max(load_timeout, spec.collective_timeout))
            link.send(Loaded(model_id=load.model_id, context_length=context))
            tokenizer = load_tokenizer(path, eos_token_ids=config.get("eos_token_id"))  # type: ignore[no-untyped-call]
            engine = Engine(shard.model, tokenizer, context, forward)
            return warm_and_serve(link, engine, faults, load)
        follower = Follower(link, shard, watchdog, faults, load, context)
        follower.barrier(max(load_timeout, spec.collective_timeout))
        link.send(Loaded(model_id=load.model_id, context_length=context))
        faults.hit("warm")
        return follower.run()
    except CollectiveError as exc:
        log.error("runner: %s", exc)
        if (trace := watchdog.take_trace()) is not None:
            link.send(trace)
        link.send(RunnerFailed(reason="collective_failed", message=shorten(str(exc))))
        return COLLECTIVE_FAILED_EXIT_CODE


def join_group(spec: ShardSpec) -> Any:
    """Form the ring with the other ranks (see the module doc); the group."""
    fd, hostfile = tempfile.mkstemp(prefix="skulk-ring-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump([[host] for host in spec.hosts], f)
    os.environ["MLX_HOSTFILE"] = hostfile
    os.environ["MLX_RANK"] = str(spec.rank)
    try:
        with init_alarm(spec.connect_timeout + CONNECT_ALARM_SLACK):
            group = mx.distributed.init(strict=True, backend="ring")
    finally:
        os.unlink(hostfile)
    if (group.rank(), group.size()) != (spec.rank, spec.world):
        raise RuntimeError(
            f"joined as rank {group.rank()} of {group.size()}, not {spec.rank} of {spec.world}"
        )
    return group


def form_doorbell(spec: ShardSpec, group: Any, watchdog: CollectiveWatchdog) -> Doorbell | None:
    """This rank's doorbell (:mod:`skulk.engine._doorbell`), unless a rank's environment says
    ``SKULK_RING_DOORBELL=off`` (a benchmark's baseline: then no rank rings, every rank
    waits spinning in mlx); the ranks agree first (an ``all_min``), all within
    ``connect_timeout``."""
    wanted = os.environ.get(DOORBELL_ENV, "on") != "off"
    with watchdog.guard("all_min(doorbell)", 0, spec.connect_timeout):
        mine = mx.array([int(wanted)], dtype=mx.int32)
        agreed = bool(mx.distributed.all_min(mine, group=group).item())
    return open_doorbell(spec.hosts, spec.rank, spec.connect_timeout) if agreed else None


def _load(
    link: Link,
    model: Any,
    config: dict[str, Any],
    spec: ShardSpec,
    group: Any,
    faults: Faults,
    doorbell: Doorbell | None,
) -> tuple[Shard, int]:
    def progress(n: int, total: int) -> None:
        link.send(LoadProgress(loaded=n, total=total))
        faults.hit("load")

    shard = load_shard(model, config, spec, group, progress, doorbell)
    return shard, int(config.get("max_position_embeddings") or DEFAULT_CONTEXT)
