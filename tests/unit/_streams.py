"""Test doubles for data streams (a :class:`~skulk.federation.DataReceiver` stand-in), shared
by the tests of the stream claims and of the routing caller."""

from __future__ import annotations

import trio


class FakeReceiver:
    """A DataReceiver stand-in: delivers ``chunks``, then waits forever, or ends (``ends``),
    or raises ``fails`` (a lost link: ``PeerUnreachable``)."""

    def __init__(
        self, *chunks: bytes, ends: bool = False, fails: BaseException | None = None
    ) -> None:
        self.chunks = list(chunks)
        self.ends = ends
        self.fails = fails
        self.closed = False

    async def receive(self) -> bytes:
        await trio.lowlevel.checkpoint()
        if self.chunks:
            return self.chunks.pop(0)
        if self.fails is not None:
            raise self.fails
        if self.ends:
            raise trio.EndOfChannel
        await trio.sleep_forever()
        raise AssertionError

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
        self.closed = True
