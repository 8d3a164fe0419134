"""The runner side of the node link: blocking frame I/O over the inherited socket, the inbox
the reader thread fills, and the heartbeat clock."""

from __future__ import annotations

import logging
import os
import queue
import resource
import socket
import threading
import time
from collections.abc import Callable

from skulk.runner.protocol import FROM_RUNNER, TO_RUNNER
from skulk.wire import FrameReader, WireError
from skulk.wire.runner import CollectiveTrace, FromRunner, Heartbeat

log = logging.getLogger("skulk.runner")

#: Put on the inbox when the node's side of the socket closed (or sent garbage).
EOF = object()


class Link:
    """Blocking frame I/O over the socket inherited from the node, and the heartbeat clock.

    Frames are written under a lock (the main thread, and the collective watchdog's last
    words). ``trace``, when set, is asked for a ``CollectiveTrace`` with every heartbeat."""

    def __init__(self, sock: socket.socket, heartbeat_interval: float) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._interval = heartbeat_interval
        self._last_beat = time.monotonic()
        self._seq = 0
        self.inbox: queue.Queue[object] = queue.Queue()  # frames, Prepared prompts, EOF
        self.trace: Callable[[], CollectiveTrace | None] | None = None

    @property
    def heartbeat_interval(self) -> float:
        return self._interval

    def send(self, frame: FromRunner) -> None:
        data = FROM_RUNNER.pack(frame)
        with self._lock:
            self._sock.sendall(data)

    def send_within(self, frame: FromRunner, seconds: float) -> bool:
        """Send unless the lock stays taken for ``seconds`` (the main thread stuck in a send);
        returns whether it was sent."""
        data = FROM_RUNNER.pack(frame)
        if not self._lock.acquire(timeout=seconds):
            return False
        try:
            self._sock.sendall(data)
        finally:
            self._lock.release()
        return True

    def beat(self) -> None:
        """Send a heartbeat (and the collective trace) if one is due. Call from the main loop
        only: it proves *that* runs."""
        now = time.monotonic()
        if now - self._last_beat < self._interval:
            return
        self._last_beat = now
        self._seq += 1
        self.send(Heartbeat(seq=self._seq, rss_bytes=rss(), mlx_active_bytes=mlx_active()))
        if self.trace is not None and (trace := self.trace()) is not None:
            self.send(trace)

    def next_frame(self, block: bool) -> object | None:
        """The next frame; when ``block``, wait for one, beating while idle."""
        while True:
            try:
                return self.inbox.get(timeout=self._interval) if block else self.inbox.get_nowait()
            except queue.Empty:
                self.beat()
                if not block:
                    return None

    def wait_frame(self, seconds: float) -> object | None:
        """The next frame if one comes within ``seconds`` (beating meanwhile), else ``None``."""
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
