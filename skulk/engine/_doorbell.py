"""Wake-ups between neighbouring ranks of a sharded instance: a rank waiting for its left
neighbour sleeps in the kernel instead of spinning a core.

**Why.** mlx's ring backend busy-polls: for as long as a receive is pending, its socket thread
calls a non-blocking ``recv()`` in a loop (``SocketThread::worker`` in mlx's
``distributed/ring/ring.cpp``), so a rank waiting in ``mx.distributed.recv`` — for rank 0's
next message, for the previous stage's hidden state, for the last stage's answer — keeps a
whole core busy (measured: 2.00 CPU s in 2.00 s), which on a shared machine slows whatever
runs beside it, its own neighbour rank included.

**How.** A :class:`Doorbell` is one plain, blocking TCP connection along each edge of the ring
(rank ``r`` to rank ``r + 1`` mod the world, the direction every message goes). The sender
rings (:meth:`Doorbell.ring`: one byte) just before it sends a message on the ring; the
receiver waits for that byte (:meth:`Doorbell.wait`, blocked in the kernel) before it posts
the mlx receive, which then finds its data arriving. What counts as one message is the
caller's rule, the same on both ends (:mod:`skulk.engine._ring`: a control message, its
header and body together; :mod:`skulk.engine._shard`: one hidden state); one byte per
message in the order the messages go, so each edge's rings and waits pair up as its sends and
receives do. The wait has no deadline of its own: it runs inside the caller's collective
guard (:mod:`skulk.engine._watchdog`), as the mlx receive it precedes does. A neighbour that
died closes the connection: the wait raises :class:`DoorbellError` at once.

**Where.** The connection reuses the ring's own address, so no other port needs opening: once
``mx.distributed.init`` has formed the ring it has closed its listening socket, so each rank
listens again on ``hosts[rank]`` (``SO_REUSEADDR``), connects to its right neighbour's
(retrying while that one is not listening yet) and greets it with :data:`GREETING` and its
rank; it accepts from its left the first connection that greets as its left neighbour.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import time

import attrs

#: What a rank sends first on its connection to its right neighbour, then its rank (``>I``).
GREETING = b"SKULK-DOORBELL/1"
_HELLO = struct.Struct(f">{len(GREETING)}sI")
_BELL = b"\x01"
#: Pause between connection attempts while the right neighbour is not listening yet.
_RETRY = 0.02


class DoorbellError(Exception):
    """The doorbell connection failed: a neighbour closed it (it died or left; the message
    says ``connection to a peer was lost``, as mlx's own does), or it could not be formed in
    time."""


@attrs.frozen
class DoorbellStatistics:
    """Rings sent to the right, waits completed on the left, and whether a wait is blocked now."""

    rings: int
    waits: int
    waiting: bool


class Doorbell:
    """One rank's two doorbell connections: to its right neighbour (:meth:`ring`) and from its
    left one (:meth:`wait`). See the module doc. In a world of two both neighbours are the same
    rank, over two connections."""

    def __init__(self, right: socket.socket, left: socket.socket) -> None:
        for sock in (right, left):
            sock.settimeout(None)
            with contextlib.suppress(OSError):  # a socketpair (tests) has no TCP options
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._right, self._left = right, left
        self._rings = self._waits = 0
        self._waiting = False

    def ring(self) -> None:
        """Tell the right neighbour a message is coming (call just before sending it)."""
        try:
            self._right.sendall(_BELL)
        except OSError as exc:
            raise DoorbellError(f"connection to a peer was lost (doorbell, right): {exc}") from exc
        self._rings += 1

    def wait(self) -> None:
        """Block until the left neighbour rings (its message is on the way); raises
        :class:`DoorbellError` if it closed the connection."""
        self._waiting = True
        try:
            got = self._left.recv(1)
        except OSError as exc:
            raise DoorbellError(f"connection to a peer was lost (doorbell, left): {exc}") from exc
        finally:
            self._waiting = False
        if got != _BELL:
            raise DoorbellError("connection to a peer was lost (doorbell, left): closed")
        self._waits += 1

    def statistics(self) -> DoorbellStatistics:
        return DoorbellStatistics(self._rings, self._waits, self._waiting)

    def close(self) -> None:
        for sock in (self._right, self._left):
            with contextlib.suppress(OSError):
                sock.close()


def _split(host: str) -> tuple[str, int]:
    address, _, port = host.rpartition(":")
    return address.strip("[]"), int(port)


def open_doorbell(hosts: tuple[str, ...], rank: int, seconds: float) -> Doorbell:
    """Form this rank's doorbell connections (see the module doc) within ``seconds``; call on
    every rank once the mlx ring is formed. Raises :class:`DoorbellError`."""
    world = len(hosts)
    deadline = time.monotonic() + seconds
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    right: socket.socket | None = None
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(_split(hosts[rank]))
        listener.listen(world + 4)
        right = _connect(_split(hosts[(rank + 1) % world]), rank, deadline)
        left = _accept(listener, (rank - 1) % world, deadline)
    except OSError as exc:
        if right is not None:
            right.close()
        raise DoorbellError(f"rank {rank} could not form its doorbell: {exc}") from exc
    except DoorbellError:
        if right is not None:
            right.close()
        raise
    finally:
        listener.close()
    return Doorbell(right, left)


def _left_time(deadline: float, what: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise DoorbellError(f"doorbell: timed out {what}")
    return left


def _connect(address: tuple[str, int], rank: int, deadline: float) -> socket.socket:
    """Connect to the right neighbour's doorbell and greet it, retrying until it listens."""
    while True:
        try:
            sock = socket.create_connection(
                address, timeout=_left_time(deadline, f"connecting to {address}")
            )
        except (ConnectionRefusedError, ConnectionResetError):
            time.sleep(min(_RETRY, max(0.0, deadline - time.monotonic())))
            continue
        try:
            sock.sendall(_HELLO.pack(GREETING, rank))
        except OSError:
            sock.close()
            raise
        return sock


def _accept(listener: socket.socket, expected: int, deadline: float) -> socket.socket:
    """The first connection that greets as rank ``expected``; any other is closed."""
    while True:
        listener.settimeout(_left_time(deadline, f"waiting for rank {expected}"))
        try:
            sock, _ = listener.accept()
        except TimeoutError as exc:
            raise DoorbellError(f"doorbell: rank {expected} never connected") from exc
        try:
            sock.settimeout(_left_time(deadline, f"waiting for rank {expected}'s greeting"))
            hello = _recv_exactly(sock, _HELLO.size)
        except (OSError, DoorbellError):
            sock.close()
            continue
        if hello is not None and _HELLO.unpack(hello) == (GREETING, expected):
            return sock
        sock.close()


def _recv_exactly(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            return None
        data += chunk
    return data
