"""The runner side of the node link: blocking frame I/O over the inherited socket, the inbox
the reader thread fills, the heartbeat clock, and the holding of token chunks.

Token chunks are the one frame sent per decode step, so they are what a fast model pays for per
token: a CBOR encode and a socket write here, a wake-up, a read, a decode and a delivery in
the node. While steps are fast (each main-loop iteration, beat to beat, shorter than
:data:`HOLD`), a request's chunks are held and merged into one ``TokenChunk`` written at most
once per ``HOLD`` — about ``HOLD`` ÷ step time tokens per frame. Nothing is held when it would
cost latency that matters: a request's first :data:`EAGER` chunks (its time to first token, its
first words) go out at once, any other frame (``Finished``, a heartbeat, …) first writes what
is held before it (so a request's tokens always precede its end), and so do a blocking wait for
frames and every beat after a slow iteration (a large model, a long batch step: one write per
step, all its chunks together).
Should the main loop stall inside an iteration (a wedged runner), the chunks held then wait
with it: they were at most ``HOLD`` old, and the stall delays the request's next token anyway.
"""

from __future__ import annotations

import logging
import os
import queue
import resource
import socket
import threading
import time
from collections.abc import Callable

from skulk.engine.protocol import FROM_RUNNER, TO_RUNNER
from skulk.wire import FrameReader, WireError
from skulk.wire.runner import (
    CollectiveTrace,
    EngineStats,
    Finished,
    FromRunner,
    Heartbeat,
    RequestFailed,
    TokenChunk,
)

log = logging.getLogger("skulk.engine")

#: Put on the inbox when the node's side of the socket closed (or sent garbage).
EOF = object()
#: Seconds a token chunk may be held to be merged with the next ones (see the module doc).
HOLD = 0.004
#: A request's chunks written at once, whatever ``HOLD`` says (see the module doc).
EAGER = 3


class Link:
    """Blocking frame I/O over the socket inherited from the node, and the heartbeat clock.

    Frames are written under a lock (the main thread, and the collective watchdog's last
    words). ``trace``, when set, is asked for a ``CollectiveTrace`` with every heartbeat, and
    ``stats`` for ``EngineStats`` (``None``: nothing changed).
    Token chunks may be held up to about ``hold`` seconds (see the module doc; 0: never)."""

    def __init__(self, sock: socket.socket, heartbeat_interval: float, hold: float = HOLD) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._interval = heartbeat_interval
        self._last_beat = time.monotonic()
        self._seq = 0
        self.inbox: queue.Queue[object] = queue.Queue()  # frames, Prepared prompts, EOF
        self.trace: Callable[[], CollectiveTrace | None] | None = None
        self.stats: Callable[[], EngineStats | None] | None = None
        self._hold = hold
        self._held: dict[str, list[TokenChunk]] = {}  # request id → its chunks not written yet
        self._sent: dict[str, int] = {}  # request id → its chunks written at once so far
        self._last_write = 0.0
        self._last_loop = time.monotonic()  # the last beat(): one main-loop iteration ago

    @property
    def heartbeat_interval(self) -> float:
        return self._interval

    def send(self, frame: FromRunner) -> None:
        """Write ``frame`` — or hold it, if it is a token chunk that may wait (module doc)."""
        if isinstance(frame, TokenChunk):
            sent = self._sent.get(frame.request_id, 0)
            if sent >= EAGER and self._hold > 0:
                with self._lock:
                    self._held.setdefault(frame.request_id, []).append(frame)
                return
            self._sent[frame.request_id] = sent + 1
        elif isinstance(frame, Finished | RequestFailed):
            self._sent.pop(frame.request_id, None)
        data = FROM_RUNNER.pack(frame)
        with self._lock:
            self._write(self._take_held() + data)

    def send_within(self, frame: FromRunner, seconds: float) -> bool:
        """Send unless the lock stays taken for ``seconds`` (the main thread stuck in a send);
        returns whether it was sent."""
        data = FROM_RUNNER.pack(frame)
        if not self._lock.acquire(timeout=seconds):
            return False
        try:
            self._write(self._take_held() + data)
        finally:
            self._lock.release()
        return True

    def flush(self) -> None:
        """Write the held token chunks now."""
        with self._lock:
            if self._held:
                self._write(self._take_held())

    def _take_held(self) -> bytes:
        """The held chunks, one merged frame per request, packed (call under the lock)."""
        if not self._held:
            return b""
        frames = []
        for request_id, chunks in self._held.items():
            ids = tuple(i for c in chunks for i in c.token_ids)
            logprobs = tuple(e for c in chunks for e in c.logprobs)
            frames.append(TokenChunk(request_id, ids, "".join(c.text for c in chunks), logprobs))
        self._held.clear()
        return b"".join(map(FROM_RUNNER.pack, frames))

    def _write(self, data: bytes) -> None:
        if data:
            self._sock.sendall(data)
            self._last_write = time.monotonic()

    def beat(self) -> None:
        """Send a heartbeat (and the collective trace) if one is due, and the held token chunks
        unless iterations are fast and one was written less than ``hold`` ago. Call from the
        main loop only, once per iteration: it proves *that* runs, and times its iterations."""
        now = time.monotonic()
        slow, self._last_loop = now - self._last_loop >= self._hold, now
        if self._held and (slow or now - self._last_write >= self._hold):
            self.flush()
        if now - self._last_beat < self._interval:
            return
        self._last_beat = now
        self._seq += 1
        self.send(Heartbeat(seq=self._seq, rss_bytes=rss(), mlx_active_bytes=mlx_active()))
        if self.trace is not None and (trace := self.trace()) is not None:
            self.send(trace)
        if self.stats is not None and (stats := self.stats()) is not None:
            self.send(stats)

    def next_frame(self, block: bool) -> object | None:
        """The next frame; when ``block``, wait for one (after writing what is held), beating
        while idle."""
        if block:
            self.flush()
        while True:
            try:
                return self.inbox.get(timeout=self._interval) if block else self.inbox.get_nowait()
            except queue.Empty:
                self.beat()
                if not block:
                    return None

    def wait_frame(self, seconds: float) -> object | None:
        """The next frame if one comes within ``seconds`` (beating meanwhile, after writing
        what is held), else ``None``."""
        self.flush()
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                return self.inbox.get(timeout=min(left, self._interval))
            except queue.Empty:
                self.beat()
        return None

    def read_forever(self) -> None:
        """Reader thread: frames onto the inbox; ``EOF`` on close or a protocol error."""
        reader = FrameReader(TO_RUNNER)
        try:
            while data := self._sock.recv(1 << 16):
                for frame in reader.feed(data):
                    self.inbox.put(frame)
        except (OSError, WireError) as exc:
            log.error("runner: link from node failed: %s", exc)
        self.inbox.put(EOF)


def rss() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def mlx_active() -> int:
    import mlx.core as mx

    get = getattr(mx, "get_active_memory", None)
    return int(get()) if get is not None else 0
