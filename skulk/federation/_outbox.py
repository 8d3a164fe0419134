"""A link's outgoing queues and the priority its sender task drains them in.

Control frames always go before data chunks, so a saturated data topic delays a control frame
by at most the one chunk being sent. A stream's abort (``DataAbort``) goes in the data queue,
after the chunks of that stream already queued (it is their end), and is never refused for
want of room (one per stream at most). Within control: the latest pong (RTT accuracy), pending
credit grants and stream stops (coalesced per stream, so they never wait for room and never
pile up), then raft/rpc/telemetry frames in FIFO order, then the latest ping. Everything is
bounded: ``control`` and ``data`` by their capacities, credits and stops by the number of
streams, pong and ping by one slot each.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import trio

from skulk.wire import Codec
from skulk.wire.link import DataAbort, DataCredit, DataStop, LinkFrame, Ping, Pong


class OutboxClosed(Exception):
    """The outbox was closed (the link is closing); nothing more will be sent."""


class Outbox:
    """Bounded outgoing queues of encoded frames; one sender task takes from :meth:`get`."""

    def __init__(self, codec: Codec[LinkFrame], *, control: int, data: int) -> None:
        self._codec = codec
        self._control_capacity = control
        self._data_capacity = data
        self._control: deque[bytes] = deque()
        self._data: deque[bytes] = deque()
        self._pong: Pong | None = None
        self._ping: Ping | None = None
        self._credits: dict[int, int] = {}
        self._stops: dict[int, None] = {}
        self.control_in = 0
        """Frames ever put on the control queue (raft, rpc, telemetry)."""
        self.control_out = 0
        """Of those, how many :meth:`get` has handed to the sender (FIFO: the oldest)."""
        self._work = trio.lowlevel.ParkingLot()
        self._control_room = trio.lowlevel.ParkingLot()
        self.data_room = trio.lowlevel.ParkingLot()
        self._closed = False

    @property
    def control_queued(self) -> int:
        return len(self._control) + len(self._credits) + len(self._stops)

    @property
    def data_queued(self) -> int:
        return len(self._data)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Wake every waiter; they (and later callers) get :class:`OutboxClosed`."""
        self._closed = True
        self._control.clear()
        self._data.clear()
        self._work.unpark_all()
        self._control_room.unpark_all()
        self.data_room.unpark_all()

    def _check(self) -> None:
        if self._closed:
            raise OutboxClosed

    # ---- control ----

    def put_control_nowait(self, frame: bytes) -> bool:
        """Queue an encoded control frame; ``False`` if the queue is full."""
        self._check()
        if len(self._control) >= self._control_capacity:
            return False
        self._control.append(frame)
        self.control_in += 1
        self._work.unpark_all()
        return True

    async def put_control(self, frame: bytes) -> None:
        """Queue an encoded control frame, waiting for room (cancellable: then nothing queued)."""
        while True:
            if self.put_control_nowait(frame):
                return
            await self._control_room.park()

    def set_pong(self, pong: Pong) -> None:
        self._check()
        self._pong = pong
        self._work.unpark_all()

    def set_ping(self, ping: Ping) -> None:
        self._check()
        self._ping = ping
        self._work.unpark_all()

    def grant_credit(self, stream_id: int, limit: int) -> None:
        self._check()
        self._credits[stream_id] = max(limit, self._credits.get(stream_id, limit))
        self._work.unpark_all()

    def stop_stream(self, stream_id: int) -> None:
        self._check()
        self._credits.pop(stream_id, None)
        self._stops[stream_id] = None
        self._work.unpark_all()

    # ---- data ----

    def data_has_room(self) -> bool:
        self._check()
        return len(self._data) < self._data_capacity

    def put_data_nowait(self, frame: bytes) -> None:
        """Queue an encoded data chunk; the caller checked :meth:`data_has_room`."""
        self._check()
        self._data.append(frame)
        self._work.unpark_all()

    def abort_stream(self, stream_id: int, reason: str) -> None:
        """Queue ``DataAbort`` for an outgoing stream, after its chunks already queued (room
        or not: the caller sends one per stream at most)."""
        self._check()
        self._data.append(self._codec.encode(DataAbort(stream_id=stream_id, reason=reason)))
        self._work.unpark_all()

    # ---- the sender's side ----

    def _next(self) -> bytes | None:
        encode: Callable[[LinkFrame], bytes] = self._codec.encode
        if self._pong is not None:
            pong, self._pong = self._pong, None
            return encode(pong)
        if self._credits:
            stream_id = next(iter(self._credits))
            return encode(DataCredit(stream_id=stream_id, limit=self._credits.pop(stream_id)))
        if self._stops:
            stream_id = next(iter(self._stops))
            del self._stops[stream_id]
            return encode(DataStop(stream_id=stream_id))
        if self._control:
            frame = self._control.popleft()
            self.control_out += 1
            self._control_room.unpark_all()
            return frame
        if self._ping is not None:
            ping, self._ping = self._ping, None
            return encode(ping)
        if self._data:
            frame = self._data.popleft()
            self.data_room.unpark_all()
            return frame
        return None

    async def get(self) -> bytes:
        """The next frame to send, highest priority first; waits while there is none."""
        while True:
            self._check()
            frame = self._next()
            if frame is not None:
                return frame
            await self._work.park()
