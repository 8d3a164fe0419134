"""What both ends of a weight transfer share: the rpc methods, the codecs, the limits, the
deadlines, and telling a transfer stream from other streams by its first chunk."""

from __future__ import annotations

import math

import attrs
import trio

from skulk.federation import DataReceiver, Link, PeerUnreachable
from skulk.wire import Codec, MalformedFrame, WireError
from skulk.wire.transfer import (
    TRANSFER_DATA_TAG,
    TransferHeader,
    TransferItem,
    TransferReply,
    TransferRequest,
)

MANIFEST_METHOD = "transfer.manifest"
"""rpc: a :class:`~skulk.wire.transfer.ManifestRequest`, answered by a ``ManifestPart``."""
RANGES_METHOD = "transfer.ranges"
"""rpc: a :class:`~skulk.wire.transfer.RangeRequest`, answered by ``RangesAccepted`` (its
bytes follow on a data stream)."""
TRANSFER_METHODS = (MANIFEST_METHOD, RANGES_METHOD)

#: Bytes of file data per stream chunk (a binary data frame carries it with 19 bytes of
#: framing; the link's frames are at most 4 MiB). Per-chunk costs (a worker-thread hop to read it, a
#: WebSocket message each way, a hop to hash and write it) dominate small chunks: on loopback
#: 1 MiB chunks fetched at ~1.8x the rate of 256 KiB ones (``python -m skulk.bench
#: transfer``). A token stream on the same link waits behind at most a few chunks in flight.
CHUNK_SIZE = 1024 * 1024
#: Bytes of manifest per ``ManifestPart``.
MANIFEST_PART_SIZE = 1024 * 1024
#: The most ranges one request may name.
MAX_RANGES = 4096

REQUEST_CODEC: Codec[TransferRequest] = Codec(TransferRequest)
REPLY_CODEC: Codec[TransferReply] = Codec(TransferReply)
ITEM_CODEC: Codec[TransferItem] = Codec(TransferItem)


def decode_item(chunk: bytes) -> TransferItem | memoryview:
    """A transfer stream chunk: a data item's file bytes as a view into ``chunk`` (no copy),
    any other item decoded by ``ITEM_CODEC``. Raises ``WireError`` (an empty data item, or a
    chunk that is neither a data item nor a valid CBOR item)."""
    if chunk and chunk[0] == TRANSFER_DATA_TAG:
        if len(chunk) == 1:
            raise MalformedFrame("a transfer data item with no bytes")
        return memoryview(chunk)[1:]
    return ITEM_CODEC.decode(chunk)


def positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    """An attrs validator: a finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be finite and > 0, not {value!r}")


@attrs.frozen
class TransferTimeouts:
    """Deadlines of a transfer, in seconds.

    * ``call``: an rpc's answer (a holder still hashing its files answers ``preparing``
      before this);
    * ``header``: the answer stream's first chunk after the range request was accepted;
    * ``idle``: the fetching side waits at most this for the next chunk, then gives the
      holder up (a lost link is noticed sooner: the link's liveness timeout);
    * ``send``: the holder waits at most this for the fetcher's credit for one chunk, then
      gives the stream up (a stalled fetcher cannot hold a serving slot for longer).
    """

    call: float = attrs.field(default=10.0, validator=positive)
    header: float = attrs.field(default=10.0, validator=positive)
    idle: float = attrs.field(default=30.0, validator=positive)
    send: float = attrs.field(default=30.0, validator=positive)


async def is_transfer_stream(receiver: DataReceiver, timeout: float = 10.0) -> bool:  # noqa: ASYNC109
    """Whether ``receiver``'s first chunk is a transfer stream's header (waits at most
    ``timeout`` seconds for it; takes nothing from the stream). For a node's stream handler
    that hands transfer streams to :meth:`WeightClient.handle_stream` and others elsewhere."""
    with trio.move_on_after(timeout):
        try:
            first = await receiver.peek()
        except (trio.EndOfChannel, PeerUnreachable):
            return False
        try:
            return isinstance(ITEM_CODEC.decode(first), TransferHeader)
        except WireError:
            return False
    return False


async def cancel_when_closed(link: Link, scope: trio.CancelScope) -> None:
    """Cancel ``scope`` once ``link`` closes (a transfer on it cannot go on)."""
    await link.wait_closed()
    scope.cancel()
