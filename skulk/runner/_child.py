"""The runner process's main loop (``python -m skulk.runner``).

The runner is deliberately not a Trio program: decode steps are blocking mlx calls, so the main
thread runs the engine and a reader thread turns the socket's bytes into frames on a queue. The
main thread looks at that queue between decode steps, so a ``Cancel`` takes effect within one
token, and it sends a ``Heartbeat`` every heartbeat interval — while idle, between prefill
chunks and between decode steps — so a runner whose main loop is stuck falls silent and the node
can tell it is wedged. Nothing a request carries may stall that loop for long: prompts are
tokenized on a worker thread (:mod:`skulk.runner._prepare`) whose results come back through the
same queue, and sampling parameters never trigger a compilation (:mod:`skulk.runner._sampling`).
Frames are written under a lock.

The runner never outlives its node: a watchdog thread exits the process within 0.2 s of the
parent pid changing (the node died, even by SIGKILL), and the node's socket closing ends it too.

A ``Load`` with a shard makes the runner one rank of a sharded instance; that mode lives in
:mod:`skulk.runner._sharded` (group formation, shard loading, the lockstep loop).

Exit codes: 0 after ``Shutdown`` or when the node closes the socket (a rank > 0: also when
rank 0 ended the group); 2 after a load failure (reported first as ``RunnerFailed``); 3 on a
protocol error from the node; 70 when the node is gone; 13 from a ``crash`` fault hook; 71 after
``CollectiveTimeout`` and 72 after ``RunnerFailed(collective_failed)`` (a sharded rank whose
compute group broke, see :mod:`skulk.runner._watchdog`); killed by ``SIGALRM`` when the compute
group did not form within its connect timeout.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path

from skulk import __version__
from skulk.runner._engine import Engine, Generation, RequestError
from skulk.runner._link import EOF, Link
from skulk.runner._prepare import Prepared, PromptPreparer, log_failure, shorten
from skulk.runner.faults import Faults
from skulk.wire.runner import (
    PROTOCOL_VERSION,
    Cancel,
    Finished,
    FinishReason,
    Generate,
    Hello,
    Load,
    Loaded,
    LoadProgress,
    RequestFailed,
    RunnerFailed,
    Shutdown,
    TokenChunk,
    Usage,
    WarmedUp,
)

log = logging.getLogger("skulk.runner")

PARENT_GONE_EXIT_CODE = 70


def main(
    fd: int,
    parent_pid: int,
    incarnation: int,
    heartbeat_interval: float,
    load_timeout: float = 600.0,
) -> int:
    _die_with_parent(parent_pid)
    faults = Faults.from_env(incarnation)
    faults.arm()
    link = Link(socket.socket(fileno=fd), heartbeat_interval)
    threading.Thread(target=link.read_forever, name="runner-reader", daemon=True).start()
    faults.hit("hello")
    link.send(Hello(protocol_version=PROTOCOL_VERSION, pid=os.getpid(), skulk_version=__version__))
    first = link.next_frame(block=True)
    if not isinstance(first, Load):
        return 0 if first is EOF or isinstance(first, Shutdown) else 3
    if first.shard is not None:
        from skulk.runner._sharded import run_sharded  # mlx, distributed: only when sharded

        run_sharded(link, first, first.shard, faults, load_timeout)
    try:
        try:
            engine = _load(link, first, faults)
        except (BrokenPipeError, ConnectionResetError):
            raise  # the link itself, handled below
        except Exception as exc:
            link.send(RunnerFailed(reason=load_failure_reason(exc), message=shorten(str(exc))))
            return 2
        return _serve(link, engine, faults)
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
    faults.hit("warm")
    engine.warm_up()
    link.send(WarmedUp())
    return engine


def load_failure_reason(exc: Exception) -> str:
    if isinstance(exc, FileNotFoundError):
        return "model_not_found"
    if isinstance(exc, MemoryError):
        return "out_of_memory"
    return "load_error"


def _serve(link: Link, engine: Engine, faults: Faults) -> int:
    requests = _Requests(link, engine, faults)
    while True:
        # Block for work only when idle; otherwise take what has arrived and keep decoding.
        frames = [] if requests.active else [link.next_frame(block=True)]
        while (frame := link.next_frame(block=False)) is not None:
            frames.append(frame)
        for frame in frames:
            if frame is EOF or isinstance(frame, Shutdown):
                return 0
            if isinstance(frame, Generate):
                requests.accept(frame)
            elif isinstance(frame, Prepared):
                requests.start(frame)
            elif isinstance(frame, Cancel):
                faults.hit("cancel")
                requests.cancel(frame.request_id)
            else:
                log.error("runner: unexpected frame %r", frame)
                return 3
        for request_id, gen in list(requests.active.items()):
            faults.hit("decode", gen.completion_tokens)
            requests.step(request_id, gen)
        link.beat()


class _Requests:
    """The requests a runner serves: those whose prompt is being tokenized (``waiting``, on the
    :class:`PromptPreparer`'s thread) and those decoding (``active``, on the main thread).

    Every request ends with exactly one ``Finished`` or ``RequestFailed``, and a failure of one
    request — a refusal, an engine exception — ends only that request. Every ``Cancel`` is
    answered with one ``Finished(cancelled)``: for an active or waiting request that is its end;
    for an id the runner does not know (it finished first, or never started) it is a bare
    acknowledgement with zero usage, which the node needs to clear its cancel deadline.
    """

    def __init__(self, link: Link, engine: Engine, faults: Faults) -> None:
        self._link = link
        self._engine = engine
        self._faults = faults
        self._preparer = PromptPreparer(engine.tokenize, link.inbox)
        self.active: dict[str, Generation] = {}
        self.waiting: dict[str, int] = {}  # request id → job number of its tokenization

    def accept(self, req: Generate) -> None:
        if req.request_id in self.active or req.request_id in self.waiting:
            self._fail(req.request_id, "duplicate_request", "request id already active")
            return
        try:
            self._engine.check_params(req.params)
        except RequestError as exc:
            self._fail(req.request_id, exc.reason, exc.message)
            return
        self.waiting[req.request_id] = self._preparer.submit(req)

    def start(self, prepared: Prepared) -> None:
        """Prefill a tokenized prompt (ticking between chunks) and make it active."""
        req = prepared.request
        if self.waiting.get(req.request_id) != prepared.job:
            return  # cancelled while it was tokenized: already answered
        del self.waiting[req.request_id]
        if prepared.failure is not None:
            self._fail(req.request_id, *prepared.failure)
            return
        chunks = 0

        def tick() -> None:
            nonlocal chunks
            chunks += 1
            self._faults.hit("prefill", chunks)
            self._link.beat()

        try:
            gen = self._engine.generation(list(prepared.tokens), req.params, tick=tick)
        except RequestError as exc:
            self._fail(req.request_id, exc.reason, exc.message)
        except Exception as exc:
            log_failure("could not start a request", exc)
            self._fail(req.request_id, "engine_error", f"prefill failed: {exc}")
        else:
            self.active[req.request_id] = gen

    def step(self, request_id: str, gen: Generation) -> None:
        try:
            step = gen.step()
        except Exception as exc:
            log_failure("a decode step failed", exc)
            del self.active[request_id]
            self._fail(request_id, "engine_error", f"decode failed: {exc}")
            return
        if step.token_ids or step.text:
            self._link.send(TokenChunk(request_id, step.token_ids, step.text))
        if step.finish_reason is not None:
            del self.active[request_id]
            self._link.send(_finished(request_id, gen, step.finish_reason))

    def cancel(self, request_id: str) -> None:
        gen = self.active.pop(request_id, None)
        if gen is not None:
            self._link.send(_finished(request_id, gen, "cancelled"))
            return
        # Waiting (its tokens are dropped when they come) or unknown: acknowledge all the same.
        self.waiting.pop(request_id, None)
        self._link.send(Finished(request_id, "cancelled", Usage(0, 0)))

    def _fail(self, request_id: str, reason: str, message: str) -> None:
        self._link.send(RequestFailed(request_id, reason, shorten(message)))


def _finished(request_id: str, gen: Generation, reason: FinishReason) -> Finished:
    usage = Usage(prompt_tokens=gen.prompt_tokens, completion_tokens=gen.completion_tokens)
    return Finished(request_id, reason, usage)


def _die_with_parent(parent_pid: int) -> None:
    """Exit within 0.2 s when the node dies, even by SIGKILL: a watchdog thread notices that
    the parent pid changed (the orphan is re-parented). Not ``PR_SET_PDEATHSIG``: that fires
    when the *thread* that spawned us exits, and Trio spawns from short-lived worker threads."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.2)
        os._exit(PARENT_GONE_EXIT_CODE)

    if os.getppid() != parent_pid:  # the parent died before we got here
        os._exit(PARENT_GONE_EXIT_CODE)
    threading.Thread(target=watch, name="runner-parent-watch", daemon=True).start()
