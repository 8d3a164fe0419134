"""The loop that serves requests in a runner process, single or rank 0 of a sharded instance.

The main thread alternates between the node's frames (its inbox, filled by the link's reader
thread) and one turn of the :class:`~skulk.engine._scheduler.Scheduler`: it blocks for frames
only when there is nothing to compute (a sharded rank 0 for a bounded idle time, see
:meth:`~skulk.engine._forward.Forward.idle`), and heartbeats after every turn.
"""

from __future__ import annotations

import logging
from pathlib import Path

from skulk.engine._engine import Engine
from skulk.engine._link import EOF, Link
from skulk.engine._prepare import Prepared, load_failure_reason, shorten
from skulk.engine._scheduler import Scheduler
from skulk.engine._single import warm_up
from skulk.engine._speculation_control import DEFAULT_SPECULATIVE_TOKENS
from skulk.engine.faults import Faults
from skulk.wire.runner import (
    Cancel,
    Embed,
    Generate,
    Load,
    Loaded,
    LoadProgress,
    RunnerFailed,
    Shutdown,
    Tokenize,
    WarmedUp,
)

log = logging.getLogger("skulk.engine")


def run_single(link: Link, load: Load, faults: Faults) -> int:
    """Load the whole model, warm up and serve; the exit code."""
    try:
        try:
            engine = _load(link, load, faults)
        except (BrokenPipeError, ConnectionResetError):
            raise  # the link itself, handled below
        except Exception as exc:
            link.send(RunnerFailed(reason=load_failure_reason(exc), message=shorten(str(exc))))
            return 2
        return warm_and_serve(link, engine, faults, load)
    except (BrokenPipeError, ConnectionResetError):
        return 0  # the node closed the link: it is stopping us


def _load(link: Link, load: Load, faults: Faults) -> Engine:
    path = Path(load.model_path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no model at {path} (config.json missing)")

    def progress(n: int, total: int) -> None:
        link.send(LoadProgress(loaded=n, total=total))
        faults.hit("load")

    engine = Engine.load(path, progress)
    link.send(Loaded(model_id=load.model_id, context_length=engine.context_length))
    return engine


def warm_and_serve(link: Link, engine: Engine, faults: Faults, load: Load) -> int:
    """Warm the engine up (``WarmedUp``), then serve until ``Shutdown`` or the node closes the
    link; the exit code. One loop for every runner: a sharded instance's rank 0 runs it with
    its distributed forward pass."""
    faults.hit("warm")
    speculative = load.speculative_tokens
    warm_up(engine, DEFAULT_SPECULATIVE_TOKENS if speculative is None else speculative)
    scheduler = Scheduler(link, engine, faults, load)  # measures (and agrees on) the budgets
    engine.forward.warmed()
    link.send(WarmedUp())
    link.stats = scheduler.stats
    try:
        return _serve(link, engine, faults, scheduler)
    finally:
        engine.forward.close()


def _serve(link: Link, engine: Engine, faults: Faults, scheduler: Scheduler) -> int:
    while True:
        # Block for work only when idle; otherwise take what has arrived and keep decoding.
        frames: list[object | None] = []
        if not scheduler.busy:
            wait = engine.forward.idle(soon=bool(scheduler.waiting))
            frames.append(link.next_frame(block=True) if wait is None else link.wait_frame(wait))
        while (frame := link.next_frame(block=False)) is not None:
            frames.append(frame)
        for frame in frames:
            if frame is None:
                continue
            if frame is EOF or isinstance(frame, Shutdown):
                return 0
            if isinstance(frame, (Generate, Tokenize, Embed)):
                scheduler.accept(frame)
            elif isinstance(frame, Prepared):
                scheduler.start(frame)
            elif isinstance(frame, Cancel):
                faults.hit("cancel")
                scheduler.cancel(frame.request_id)
            else:
                log.error("runner: unexpected frame %r", frame)
                return 3
        scheduler.advance()
        link.beat()


