"""The node's end of the socket to its runner process: whole frames in, whole frames out.

Frames from the runner are read with a sans-IO :class:`~skulk.wire.FrameReader`; a frame the
protocol does not allow is a :class:`ProtocolError`. A frame to the runner is sent whole or not
at all (a frame cut off by a cancellation would leave the stream mid-frame), and a request
that cannot be encoded is refused before anything is sent (:func:`encode_request`).
"""

from __future__ import annotations

import fcntl
import socket
import sys
import termios
from collections.abc import AsyncIterator

import trio

from skulk.engine.protocol import FROM_RUNNER, TO_RUNNER
from skulk.runner._errors import ProtocolError, RequestRejected, RunnerCrashed
from skulk.wire import FrameReader, FrameTooLarge, WireError
from skulk.wire.runner import Embed, FromRunner, Generate, Tokenize, ToRunner


class RunnerLink:
    """The socket to one runner process, once :meth:`attach` gave it one. Sends are serialised
    (one lock) and shielded; reading is :meth:`frames`, by one reader."""

    def __init__(self) -> None:
        self._stream: trio.SocketStream | None = None
        self._send_lock = trio.Lock()

    def attach(self, sock: socket.socket) -> None:
        """Use ``sock`` (the node's end of the runner's socketpair) from now on."""
        self._stream = trio.SocketStream(trio.socket.from_stdlib_socket(sock))

    async def frames(self) -> AsyncIterator[FromRunner]:
        """The runner's frames as they arrive; ends when the runner closes its end.

        Raises :class:`ProtocolError` for bytes that are not a frame the runner may send."""
        assert self._stream is not None
        reader = FrameReader(FROM_RUNNER)
        while True:
            try:
                data = await self._stream.receive_some(1 << 16)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                data = b""
            if not data:
                return
            try:
                batch = reader.feed(data)
            except WireError as exc:
                raise ProtocolError(f"bad frame from runner: {exc}") from exc
            for frame in batch:
                yield frame

    async def send(self, frame: ToRunner) -> None:
        await self.send_bytes(TO_RUNNER.pack(frame))

    async def send_bytes(self, data: bytes) -> None:
        """Send one packed frame, whole. Shielded: a frame cut off by a cancellation would leave
        the stream mid-frame and the runner would read garbage, failing every request. The wait
        is bounded all the same: a runner that stops reading stops beating too, the watchdog
        fails it, and closing its socket ends this send with :class:`RunnerCrashed`."""
        assert self._stream is not None
        with trio.CancelScope(shield=True):
            async with self._send_lock:
                try:
                    await self._stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
                    raise RunnerCrashed(f"runner socket closed: {exc}") from exc

    def unread(self) -> int:
        """How many bytes from the runner wait in the socket, not read yet (0 when unknown)."""
        if self._stream is None:
            return 0
        try:
            raw = fcntl.ioctl(self._stream.socket.fileno(), termios.FIONREAD, b"\0" * 4)
        except OSError:
            return 0
        return int.from_bytes(raw, sys.byteorder)

    async def aclose(self) -> None:
        if self._stream is not None:
            await self._stream.aclose()


def encode_request(frame: Generate | Tokenize | Embed) -> bytes:
    """``frame`` packed for the runner, or :class:`RequestRejected` saying why it cannot be."""
    try:
        return TO_RUNNER.pack(frame)
    except FrameTooLarge as exc:
        raise RequestRejected(
            "prompt_too_long",
            f"the request encodes to {exc.size} bytes; the runner link carries at most "
            f"{exc.limit} bytes per request",
        ) from None
    except WireError as exc:
        # The codec's message names the field; keep it printable whatever the field held.
        detail = str(exc).encode("utf-8", "backslashreplace").decode("utf-8")
        raise RequestRejected(
            "invalid_request", f"the request cannot be encoded: {detail}"
        ) from None
