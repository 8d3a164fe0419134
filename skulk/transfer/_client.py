"""The fetching end of the transfer protocol: ask a holder, read its answer stream.

:meth:`WeightClient.manifest` reads a model's manifest from a holder part by part.
:meth:`WeightClient.open_ranges` registers a request id, calls ``transfer.ranges`` and waits
for the stream that :meth:`WeightClient.handle_stream` (the node's stream handler, for streams
:func:`is_transfer_stream` recognises) hands over once its header names the request; the
:class:`RangeStream` then yields the bytes, each wait bounded by ``timeouts.idle``. The
receiver belongs to the request from the hand-over on: the handler waits until the request
closes it (as the routing caller does).

Every failure is a :class:`~skulk.transfer._errors.PeerFailure` naming the holder, marked
``lasting`` when asking that holder again cannot help (it refused the model, or broke the
protocol) and not when it may (a lost link, a timeout, a busy holder).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import trio

from skulk.federation import (
    DataReceiver,
    Link,
    LinkBusy,
    LinkError,
    Mesh,
    PeerUnreachable,
    RpcFailed,
    StreamClaim,
    StreamClaims,
)
from skulk.models import MAX_MANIFEST_BYTES
from skulk.wire import FrameTooLarge, WireError
from skulk.wire.transfer import (
    ByteRange,
    ManifestPart,
    ManifestRequest,
    RangeRequest,
    RangesAccepted,
    TransferEnd,
    TransferFailed,
    TransferHeader,
    TransferReply,
)

from ._errors import PeerFailure
from ._protocol import (
    ITEM_CODEC,
    MANIFEST_METHOD,
    RANGES_METHOD,
    REPLY_CODEC,
    REQUEST_CODEC,
    TransferTimeouts,
    decode_item,
)

#: Refusals that asking the same holder again cannot change (for this model and manifest).
LASTING_REFUSALS = frozenset(
    {
        "bad_request",
        "unknown_model",
        "not_holder",
        "no_manifest",
        "manifest_mismatch",
        "unknown_file",
        "bad_range",
        "no_handler",
        "handler_failed",
    }
)


@attrs.frozen
class TransferStatistics:
    """A snapshot of a :class:`WeightClient`."""

    #: fetches running now (one per model at a time), and range requests waiting or reading
    fetching: int
    waiting: int
    #: file bytes received, pieces verified and recorded, pieces that failed their hash
    bytes_received: int
    pieces_verified: int
    pieces_corrupt: int
    #: incoming streams closed for want of a header naming an awaited request
    streams_refused: int


class RangeStream:
    """The bytes of one accepted range request (see :meth:`WeightClient.open_ranges`)."""

    def __init__(self, client: WeightClient, peer: str, receiver: DataReceiver) -> None:
        self._client = client
        self.peer = peer
        self._receiver = receiver

    async def receive(self) -> memoryview:
        """The next bytes (a view into the chunk, not a copy); ``trio.EndOfChannel`` once
        every requested byte came. :class:`PeerFailure` otherwise."""
        idle = self._client.timeouts.idle
        with trio.move_on_after(idle):
            try:
                chunk = await self._receiver.receive()
            except trio.EndOfChannel:
                raise self._fail("its stream ended without an end", lasting=True) from None
            except PeerUnreachable as exc:
                raise self._fail(str(exc), lasting=False) from None
            try:
                item = decode_item(chunk)
            except WireError as exc:
                raise self._fail(f"a malformed chunk: {exc}", lasting=True) from None
            match item:
                case memoryview():
                    self._client.bytes_received += len(item)
                    return item
                case TransferEnd():
                    raise trio.EndOfChannel
                case TransferFailed(reason=reason, message=message):
                    lasting = reason != "stopping"
                    raise PeerFailure(
                        self.peer, f"{reason}: {message}", lasting=lasting, reason=reason
                    )
                case TransferHeader():
                    raise self._fail("a second header on its stream", lasting=True)
        raise self._fail(f"nothing on its stream for {idle:g} s", lasting=False)

    def _fail(self, why: str, *, lasting: bool) -> PeerFailure:
        return PeerFailure(self.peer, why, lasting=lasting)


class WeightClient:
    """Asks holders for manifests and byte ranges over ``mesh`` (see the module doc), and
    keeps the per-node counters and the per-model fetch locks of
    :func:`~skulk.transfer.fetch_model`. Wiring: :meth:`handle_stream` gets the transfer
    streams of the node's stream handler."""

    def __init__(self, mesh: Mesh, *, timeouts: TransferTimeouts = TransferTimeouts()) -> None:  # noqa: B008
        self._mesh = mesh
        self.timeouts = timeouts
        self._claims = StreamClaims(
            ITEM_CODEC.decode, TransferHeader, header_timeout=timeouts.header
        )
        self._locks: dict[Path, trio.Lock] = {}
        self.fetching = 0
        self.bytes_received = self.pieces_verified = self.pieces_corrupt = 0

    @property
    def node_id(self) -> str:
        return self._mesh.node_id

    def linked(self, peer: str) -> bool:
        return self._mesh.link(peer) is not None

    def statistics(self) -> TransferStatistics:
        return TransferStatistics(
            fetching=self.fetching,
            waiting=self._claims.waiting,
            bytes_received=self.bytes_received,
            pieces_verified=self.pieces_verified,
            pieces_corrupt=self.pieces_corrupt,
            streams_refused=self._claims.streams_refused,
        )

    def lock(self, store: Path) -> trio.Lock:
        """The lock serialising fetches into one store directory."""
        return self._locks.setdefault(store, trio.Lock())

    # ---- incoming streams ----

    async def handle_stream(self, peer: str, receiver: DataReceiver) -> None:
        """Hand a transfer stream to the request waiting for it and return once that request
        is done with it. A stream whose first chunk is not the header of a request this node
        asked ``peer`` (and still waits for), or brings none within ``timeouts.header``, is
        closed at once (which stops it on the holder); see
        :class:`~skulk.federation.StreamClaims`."""
        await self._claims.handle_stream(peer, receiver)

    # ---- requests ----

    async def manifest(self, peer: str, model: str, sha256: str) -> bytes:
        """The manifest bytes of ``model`` from ``peer`` (unchecked: the caller hashes them)."""
        body = bytearray()
        total: int | None = None
        while total is None or len(body) < total:
            reply = await self._call(
                peer,
                MANIFEST_METHOD,
                REQUEST_CODEC.encode(ManifestRequest(model, sha256, len(body))),
            )
            if not isinstance(reply, ManifestPart):
                raise PeerFailure(peer, "answered a manifest request wrongly", lasting=True)
            if total is None:
                total = reply.total
                if not 0 < total <= MAX_MANIFEST_BYTES:
                    raise PeerFailure(peer, f"a manifest of {total} bytes", lasting=True)
            if reply.total != total or not reply.body or len(body) + len(reply.body) > total:
                raise PeerFailure(peer, "manifest parts that do not add up", lasting=True)
            body += reply.body
        return bytes(body)

    @asynccontextmanager
    async def open_ranges(
        self, peer: str, model: str, sha256: str, file: str, ranges: Sequence[ByteRange]
    ) -> AsyncIterator[RangeStream]:
        """Ask ``peer`` for ``ranges`` of ``file``; the stream of their bytes. Leaving the
        block closes the stream (which stops it on the holder if it has not ended)."""
        request_id = uuid.uuid4().hex
        link = self._mesh.link(peer)
        if link is None:
            raise PeerFailure(peer, "no link to it", lasting=False)
        length = sum(r.end - r.start for r in ranges)
        body = REQUEST_CODEC.encode(RangeRequest(request_id, model, sha256, file, tuple(ranges)))
        async with self._claims.expect(request_id, peer) as claim:
            reply = await self._call(peer, RANGES_METHOD, body, link)
            if reply != RangesAccepted(request_id, length):
                raise PeerFailure(peer, "answered a range request wrongly", lasting=True)
            receiver = await self._answer_stream(link, peer, claim)
            yield RangeStream(self, peer, receiver)

    async def _answer_stream(self, link: Link, peer: str, claim: StreamClaim) -> DataReceiver:
        receiver = await claim.wait(link, self.timeouts.header)
        if receiver is not None:
            return receiver
        if link.closed is not None:
            raise PeerFailure(peer, str(PeerUnreachable(link.closed)), lasting=False)
        raise PeerFailure(
            peer, f"its stream did not open within {self.timeouts.header:g} s", lasting=False
        )

    async def _call(
        self, peer: str, method: str, body: bytes, link: Link | None = None
    ) -> TransferReply:
        link = link if link is not None else self._mesh.link(peer)
        if link is None:
            raise PeerFailure(peer, "no link to it", lasting=False)
        try:
            answer = await link.call(method, body, self.timeouts.call)
        except RpcFailed as exc:
            lasting = exc.reason in LASTING_REFUSALS
            raise PeerFailure(peer, str(exc), lasting=lasting, reason=exc.reason) from None
        except FrameTooLarge as exc:
            raise PeerFailure(peer, f"a request too large to send: {exc}", lasting=True) from None
        except (LinkBusy, LinkError) as exc:  # PeerUnreachable, RpcTimeout, busy
            raise PeerFailure(peer, str(exc), lasting=False) from None
        try:
            return REPLY_CODEC.decode(answer)
        except WireError as exc:
            raise PeerFailure(peer, f"a malformed answer: {exc}", lasting=True) from None
