"""Length-prefixed framing for byte streams, as a sans-IO reader.

On a byte stream (pipe, socketpair, TCP) each frame is a 4-byte big-endian unsigned body length
followed by exactly that many bytes of CBOR (:meth:`Codec.pack` builds one). WebSocket messages
need no prefix: one message is one body (:meth:`Codec.encode` / :meth:`Codec.decode`).
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Generic, TypeVar

from ._errors import FrameTooLarge, ReaderPoisoned, TruncatedFrame, WireError

if TYPE_CHECKING:
    from ._codec import Codec

F = TypeVar("F")

LENGTH_PREFIX = struct.Struct(">I")
LENGTH_PREFIX_SIZE = LENGTH_PREFIX.size
MAX_PREFIXABLE = 2**32 - 1


class FrameReader(Generic[F]):
    """Turns a byte stream into frames, without doing any I/O.

    Feed it whatever the transport delivered, in any chunking; it returns the frames completed so
    far and buffers the rest::

        reader = FrameReader(codec)
        while data := await stream.receive_some(65536):
            for frame in reader.feed(data):
                ...
        reader.feed_eof()  # raises TruncatedFrame if the stream stopped inside a frame

    Contract:

    * A length prefix over ``codec.max_frame_size`` raises :class:`FrameTooLarge` as soon as its
      4 bytes arrive, before any of the body is buffered, so a peer cannot make us hold more than
      one frame's worth (plus one chunk) of memory.
    * Any error (:class:`FrameTooLarge`, :class:`MalformedFrame`, :class:`SchemaError`, …) is
      raised from the :meth:`feed` call whose data completed the bad frame; frames that call
      had already completed are dropped with it. The reader is then *poisoned*: a stream cannot
      be resynchronised after a bad frame, so every later :meth:`feed` / :meth:`feed_eof`
      raises :class:`ReaderPoisoned` (its ``__cause__`` is the original error). Close the link.
    * Work is linear in the bytes fed: each byte is copied at most twice (into the buffer when a
      frame spans chunks, and into its body), however many frames a chunk holds.
    """

    def __init__(self, codec: Codec[F]) -> None:
        self._codec = codec
        self._limit = codec.max_frame_size
        self._buffer = bytearray()
        self._error: WireError | None = None

    @property
    def buffered(self) -> int:
        """Bytes held for a frame that is not complete yet."""
        return len(self._buffer)

    @property
    def error(self) -> WireError | None:
        """The error that poisoned this reader, if any."""
        return self._error

    def feed(self, data: bytes | bytearray | memoryview) -> list[F]:
        """Add ``data`` from the stream; return the frames it completed, in order."""
        self._check_usable()
        frames: list[F] = []
        buffer = self._buffer
        with memoryview(data) as raw, raw.cast("B") as incoming:
            if not incoming:
                return frames
            try:
                if buffer:
                    buffer += incoming
                    with memoryview(buffer) as pending:
                        consumed = self._parse(pending, frames)
                    del buffer[:consumed]  # O(1) amortised: bytearray drops its head lazily
                else:
                    # Common case: nothing pending, so parse the caller's bytes in place and
                    # keep only an incomplete tail.
                    consumed = self._parse(incoming, frames)
                    buffer += incoming[consumed:]
            except WireError as exc:
                self._error = exc
                self._buffer = bytearray()
                raise
        return frames

    def feed_eof(self) -> None:
        """The stream ended. Raises :class:`TruncatedFrame` if it ended inside a frame."""
        self._check_usable()
        if self._buffer:
            exc = TruncatedFrame(f"stream ended inside a frame ({len(self._buffer)} bytes pending)")
            self._error = exc
            self._buffer = bytearray()
            raise exc

    def _check_usable(self) -> None:
        if self._error is not None:
            raise ReaderPoisoned(self._error) from self._error

    def _parse(self, view: memoryview, frames: list[F]) -> int:
        """Decode the complete frames at the start of ``view`` (a byte view) into ``frames``;
        return how many bytes they took."""
        end = len(view)
        pos = 0
        decode = self._codec.decode
        limit = self._limit
        unpack_from = LENGTH_PREFIX.unpack_from
        while end - pos >= LENGTH_PREFIX_SIZE:
            (size,) = unpack_from(view, pos)
            if size > limit:
                raise FrameTooLarge(size, limit)
            start = pos + LENGTH_PREFIX_SIZE
            stop = start + size
            if stop > end:
                break
            frames.append(decode(bytes(view[start:stop])))
            pos = stop
        return pos
