"""The runner process's main loop (``python -m skulk.runner --fd N``).

The runner is deliberately not a Trio program: decode steps are blocking mlx calls, so the main
thread runs the engine and a reader thread turns the socket's bytes into frames on a queue. The
main thread looks at that queue between decode steps, so a ``Cancel`` takes effect within one
token. Frames are written from the main thread only (a lock guards the socket for any future
writer thread, e.g. heartbeats).

Exit codes: 0 after ``Shutdown`` or when the node closes the socket; 2 after a load failure
(reported first as ``RunnerFailed``); 3 on a protocol error from the node.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
from pathlib import Path

from skulk import __version__
from skulk.runner._engine import Engine, Generation, RequestError
from skulk.runner.protocol import FROM_RUNNER, TO_RUNNER
from skulk.wire import FrameReader, WireError
from skulk.wire.runner import (
    PROTOCOL_VERSION,
    Cancel,
    Finished,
    FromRunner,
    Generate,
    Hello,
    Load,
    Loaded,
    LoadProgress,
    RequestFailed,
    RunnerFailed,
    Shutdown,
    TokenChunk,
    ToRunner,
    Usage,
)

log = logging.getLogger("skulk.runner")

_EOF = object()


class _Link:
    """Blocking frame I/O over the socket inherited from the node."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self.inbox: queue.Queue[ToRunner | object] = queue.Queue()

    def send(self, frame: FromRunner) -> None:
        data = FROM_RUNNER.pack(frame)
        with self._lock:
            self._sock.sendall(data)

    def read_forever(self) -> None:
        """Reader thread: frames onto the inbox; ``_EOF`` on close or a protocol error."""
        reader = FrameReader(TO_RUNNER)
        try:
            while data := self._sock.recv(1 << 16):
                for frame in reader.feed(data):
                    self.inbox.put(frame)
        except (OSError, WireError) as exc:
            log.error("runner: link from node failed: %s", exc)
        self.inbox.put(_EOF)


def main(fd: int) -> int:
    sock = socket.socket(fileno=fd)
    link = _Link(sock)
    threading.Thread(target=link.read_forever, name="runner-reader", daemon=True).start()
    link.send(Hello(protocol_version=PROTOCOL_VERSION, pid=os.getpid(), skulk_version=__version__))
    first = link.inbox.get()
    if not isinstance(first, Load):
        return 0 if first is _EOF or isinstance(first, Shutdown) else 3
    try:
        engine = _load(link, first)
    except Exception as exc:
        link.send(RunnerFailed(reason=_load_failure_reason(exc), message=str(exc)))
        return 2
    return _serve(link, engine)


def _load(link: _Link, load: Load) -> Engine:
    path = Path(load.model_path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no model at {path} (config.json missing)")
    engine = Engine.load(path, lambda n, total: link.send(LoadProgress(loaded=n, total=total)))
    engine.warm_up()
    link.send(Loaded(model_id=load.model_id, context_length=engine.context_length))
    return engine


def _load_failure_reason(exc: Exception) -> str:
    if isinstance(exc, FileNotFoundError):
        return "model_not_found"
    if isinstance(exc, MemoryError):
        return "out_of_memory"
    return "load_error"


def _serve(link: _Link, engine: Engine) -> int:
    active: dict[str, Generation] = {}
    while True:
        # Block for work only when idle; otherwise take what has arrived and keep decoding.
        frames: list[ToRunner | object] = [] if active else [link.inbox.get()]
        while True:
            try:
                frames.append(link.inbox.get_nowait())
            except queue.Empty:
                break
        for frame in frames:
            if frame is _EOF or isinstance(frame, Shutdown):
                return 0
            if isinstance(frame, Generate):
                _start(link, engine, active, frame)
            elif isinstance(frame, Cancel):
                gen = active.pop(frame.request_id, None)
                if gen is not None:
                    link.send(_finished(frame.request_id, gen, "cancelled"))
            else:
                log.error("runner: unexpected frame %r", frame)
                return 3
        for request_id, gen in list(active.items()):
            try:
                step = gen.step()
            except Exception as exc:
                log.exception("runner: decode step failed")
                del active[request_id]
                link.send(RequestFailed(request_id, "engine_error", f"decode failed: {exc}"))
                continue
            if step.token_ids or step.text:
                link.send(TokenChunk(request_id, step.token_ids, step.text))
            if step.finish_reason is not None:
                del active[request_id]
                link.send(_finished(request_id, gen, step.finish_reason))


def _start(link: _Link, engine: Engine, active: dict[str, Generation], req: Generate) -> None:
    if req.request_id in active:
        link.send(RequestFailed(req.request_id, "duplicate_request", "request id already active"))
        return
    try:
        active[req.request_id] = engine.start(req.prompt, req.params)
    except RequestError as exc:
        link.send(RequestFailed(req.request_id, exc.reason, exc.message))
    except Exception as exc:
        log.exception("runner: could not start request")
        link.send(RequestFailed(req.request_id, "engine_error", f"prefill failed: {exc}"))


def _finished(request_id: str, gen: Generation, reason: str) -> Finished:
    usage = Usage(prompt_tokens=gen.prompt_tokens, completion_tokens=gen.completion_tokens)
    return Finished(request_id, reason, usage)  # type: ignore[arg-type]
