"""The holder's end of a weight transfer: serve manifests and byte ranges of local models.

:meth:`WeightServer.handle_rpc` answers ``transfer.manifest`` and ``transfer.ranges`` from the
calling peer (:func:`~skulk.federation.rpc_peer`). It serves a model only if the card in this
node's State has a manifest and the request names that manifest, and then either the node's
model store (:class:`~skulk.store.ModelStore`) holds that manifest hash (served from the
store's directory, whatever the card's source, even before the State lists this node: the
store vouches for complete, verified files; the store's manifest is read, never recomputed),
or the card lists this node among its holders, has a local path
(:class:`~skulk.wire.cluster.PathSource`), and the files there still hash to the manifest;
only files the manifest names; only ranges inside the file.
Everything else is a typed refusal (rpc error reasons, listed in
:mod:`skulk.wire.transfer`). An accepted range request is streamed back on a data stream
from :meth:`run`'s nursery: a reader task reads chunks on a worker thread (never on the Trio
thread) a few ahead of the sender, which waits for the fetcher's credit (bounded by
``timeouts.send``; a stream given up unfinished is aborted, so the link's stream slot is freed
with the server's own). Chunks are raw data items (``TRANSFER_DATA_TAG`` and the bytes, read
straight into the item), never CBOR. At most ``max_per_peer`` streams per peer and
``max_streams`` in all; more are refused ``overloaded`` (the fetcher retries).

The manifest of a model directory is computed once (on a worker thread; from the on-disk cache
that :func:`~skulk.models.model_card` filled, so usually without hashing) and kept; a served
file whose size or mtime changed drops it, so the next request recomputes it and is refused
``manifest_mismatch`` if the files no longer match the card.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

import attrs
import trio

from skulk.federation import (
    DataSender,
    Link,
    LinkBusy,
    LinkError,
    Mesh,
    PeerUnreachable,
    RpcFailed,
    StreamStopped,
    rpc_peer,
)
from skulk.models import (
    FileStamp,
    LocalManifest,
    ManifestInvalid,
    decode_manifest,
    local_manifest,
    manifest_sha256,
    stamps_of,
)
from skulk.store import MANIFEST_NAME, ModelStore
from skulk.wire import WireError
from skulk.wire.cluster import ModelCard, PathSource
from skulk.wire.transfer import (
    TRANSFER_DATA_TAG,
    ManifestPart,
    ManifestRequest,
    RangeRequest,
    RangesAccepted,
    TransferEnd,
    TransferFailed,
    TransferHeader,
)

from ._protocol import (
    CHUNK_SIZE,
    ITEM_CODEC,
    MANIFEST_METHOD,
    MANIFEST_PART_SIZE,
    MAX_RANGES,
    RANGES_METHOD,
    REPLY_CODEC,
    REQUEST_CODEC,
    TransferTimeouts,
    cancel_when_closed,
)

#: How often a request for a model this node's State does not know yet looks again.
CARD_POLL_S = 0.05
#: How long such a request waits for the State to catch up before it is refused.
CARD_WAIT_S = 2.0

log = logging.getLogger("skulk.transfer")


@attrs.frozen
class WeightServerStatistics:
    """A snapshot of a :class:`WeightServer`."""

    #: range streams being sent now, and accepted since the start
    serving: int
    served: int
    #: requests refused (any reason), and streams given up (the fetcher stopped or stalled,
    #: the link was lost, a read failed)
    refused: int
    abandoned: int
    #: file bytes sent
    bytes_sent: int


#: Chunks read ahead of the sender (each on a worker thread).
_READ_AHEAD = 2


def _stored_manifest(directory: Path, _home: Path) -> LocalManifest:
    """A store model directory's manifest, as the store kept it (its files were verified when
    they went in: nothing is hashed here), with the files' stamps now."""
    body = (directory / MANIFEST_NAME).read_bytes()
    manifest = decode_manifest(body)
    stamps = stamps_of(directory, [f.name for f in manifest.files])
    return LocalManifest(manifest, body, manifest_sha256(body), stamps)


@attrs.frozen
class _Chunk:
    """A chunk read for a stream: its data item (the tag, then the bytes) and how many file
    bytes."""

    encoded: bytearray
    size: int


class _Refuse(Exception):
    """A stream cannot go on: sent as ``TransferFailed(reason, message)``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class WeightServer:
    """Serves the weights of the models this node holds (see the module doc).

    ``models(model_id)`` is the model's card in this node's State (``None``: unknown).
    ``home`` is the data dir (where manifests are cached); ``store`` the node's model store
    (models it holds are served from it). Wiring: :meth:`run` in the node's
    nursery; :meth:`handle_rpc` answers the two :data:`TRANSFER_METHODS` in the mesh's rpc
    handler. ``prepare_wait`` bounds how long a request waits for a manifest being computed
    before it is refused ``preparing`` (default: half ``timeouts.call``).

    :meth:`read_range` reads file bytes on a worker thread; a test may override it.
    """

    def __init__(
        self,
        mesh: Mesh,
        models: Callable[[str], ModelCard | None],
        home: Path,
        *,
        max_per_peer: int = 2,
        max_streams: int = 8,
        chunk_size: int = CHUNK_SIZE,
        timeouts: TransferTimeouts = TransferTimeouts(),  # noqa: B008 - frozen
        prepare_wait: float | None = None,
        read_threads: int = 4,
        store: ModelStore | None = None,
    ) -> None:
        if min(max_per_peer, max_streams, chunk_size, read_threads) < 1:
            raise ValueError("max_per_peer, max_streams, chunk_size, read_threads must be >= 1")
        self._mesh = mesh
        self._models = models
        self._home = home
        self._store = store
        self._max_per_peer = max_per_peer
        self._max_streams = max_streams
        self._chunk = chunk_size
        self._t = timeouts
        self._prepare_wait = prepare_wait if prepare_wait is not None else timeouts.call / 2
        self._limiter = trio.CapacityLimiter(read_threads)
        self._nursery: trio.Nursery | None = None
        self._manifests: dict[Path, LocalManifest] = {}
        self._preparing: dict[Path, trio.Event] = {}
        self._prepare_errors: dict[Path, str] = {}
        self._per_peer: dict[str, int] = {}
        self.serving = self.served = self.refused = self.abandoned = self.bytes_sent = 0

    def statistics(self) -> WeightServerStatistics:
        return WeightServerStatistics(
            serving=self.serving,
            served=self.served,
            refused=self.refused,
            abandoned=self.abandoned,
            bytes_sent=self.bytes_sent,
        )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Own the streams being sent (and manifests being computed) until cancelled."""
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        finally:
            self._nursery = None

    def read_range(self, path: Path, start: int, end: int) -> bytes:
        """Bytes ``[start, end)`` of ``path`` (blocking: runs on a worker thread)."""
        fd = os.open(path, os.O_RDONLY)
        try:
            data = os.pread(fd, end - start, start)
        finally:
            os.close(fd)
        if len(data) != end - start:
            raise OSError(f"{path.name} is shorter than the manifest says")
        return data

    def _read_chunk(self, path: Path, start: int, end: int) -> _Chunk:
        """:meth:`read_range` as a data item: the file bytes read straight into the item's
        buffer, after its tag (worker thread)."""
        item = bytearray(1 + end - start)
        item[0] = TRANSFER_DATA_TAG
        with memoryview(item) as view:
            view[1:] = self.read_range(path, start, end)
        return _Chunk(item, end - start)

    # ---- rpc ----

    async def handle_rpc(self, method: str, body: bytes) -> bytes:
        """Answer ``transfer.manifest`` / ``transfer.ranges`` (raises ``RpcFailed`` with the
        reasons listed in :mod:`skulk.wire.transfer`). Only calls over a mesh link."""
        try:
            return await self._answer(method, body)
        except RpcFailed:
            self.refused += 1
            raise

    async def _answer(self, method: str, body: bytes) -> bytes:
        peer = rpc_peer()
        if peer is None:
            raise RpcFailed("bad_request", "transfers are answered only over a mesh link")
        try:
            request = REQUEST_CODEC.decode(body)
        except WireError as exc:
            raise RpcFailed("bad_request", str(exc)[:200]) from None
        if method == MANIFEST_METHOD and isinstance(request, ManifestRequest):
            return await self._manifest(request)
        if method == RANGES_METHOD and isinstance(request, RangeRequest):
            return await self._ranges(peer, request)
        raise RpcFailed("bad_request", f"{method[:64]!r} does not take {type(request).__name__}")

    async def _manifest(self, request: ManifestRequest) -> bytes:
        _, local = await self._holding(request.model, request.manifest_sha256)
        total = len(local.body)
        if not 0 <= request.offset <= total:
            raise RpcFailed("bad_request", f"offset {request.offset} is outside 0..{total}")
        part = local.body[request.offset : request.offset + MANIFEST_PART_SIZE]
        return REPLY_CODEC.encode(ManifestPart(total, part))

    async def _ranges(self, peer: str, request: RangeRequest) -> bytes:
        directory, local = await self._holding(request.model, request.manifest_sha256)
        entry = next((f for f in local.manifest.files if f.name == request.file), None)
        stamp = local.stamp(request.file)
        if entry is None or stamp is None:
            raise RpcFailed("unknown_file", f"model {request.model} has no file {request.file!r}")
        ranges = request.ranges
        if not 1 <= len(ranges) <= MAX_RANGES:
            raise RpcFailed("bad_range", f"{len(ranges)} ranges: 1..{MAX_RANGES} allowed")
        at = 0
        for r in ranges:
            if not at <= r.start < r.end <= entry.size:
                raise RpcFailed(
                    "bad_range",
                    f"[{r.start}, {r.end}) is empty, out of order or outside "
                    f"{request.file} ({entry.size} bytes)",
                )
            at = r.end
        nursery = self._nursery
        if nursery is None:
            raise RpcFailed("not_serving", "this node does not serve weights now")
        if self.serving >= self._max_streams or self._per_peer.get(peer, 0) >= self._max_per_peer:
            raise RpcFailed("overloaded", "too many weight streams at once; ask again later")
        link = self._mesh.link(peer)
        if link is None:
            raise RpcFailed("no_link", f"no link back to {peer}")
        try:
            sender = link.open_stream()
        except LinkBusy:
            raise RpcFailed("overloaded", "no data stream free on the link") from None
        except LinkError as exc:
            raise RpcFailed("no_link", str(exc)[:200]) from None
        self.serving += 1
        self.served += 1
        self._per_peer[peer] = self._per_peer.get(peer, 0) + 1
        length = sum(r.end - r.start for r in ranges)
        nursery.start_soon(self._serve, peer, link, sender, request, directory, stamp)
        return REPLY_CODEC.encode(RangesAccepted(request.request_id, length))

    async def _card_soon(self, model: str) -> ModelCard | None:
        """``model``'s card once this node's State has it, within :data:`CARD_WAIT_S`: a peer
        that learned of a card first (the leader applies a commit before its followers) asks
        a holder a moment before the holder has applied it."""
        with trio.move_on_after(CARD_WAIT_S):
            while (card := self._models(model)) is None:  # noqa: ASYNC110 - the State has no event here
                await trio.sleep(CARD_POLL_S)
            return card
        return None

    async def _holding(self, model: str, sha: str) -> tuple[Path, LocalManifest]:
        """This node's directory and manifest of ``model`` at manifest ``sha``, or a refusal."""
        card = self._models(model)
        if card is None:
            card = await self._card_soon(model)
        if card is None:
            raise RpcFailed("unknown_model", f"no model {model[:128]!r} in this node's State")
        if card.manifest_sha256 is None:
            raise RpcFailed("no_manifest", f"model {model} has no manifest to fetch it by")
        if sha != card.manifest_sha256:
            raise RpcFailed(
                "manifest_mismatch",
                f"model {model}'s card here names manifest {card.manifest_sha256[:16]}…",
            )
        stored = await self._stored(sha)
        if stored is not None:
            return stored, await self._manifest_of(stored, from_store=True)
        if self._mesh.node_id not in card.holders:
            raise RpcFailed("not_holder", f"node {self._mesh.node_id} does not hold {model}")
        source = card.source
        if not isinstance(source, PathSource):
            raise RpcFailed("not_holder", f"node {self._mesh.node_id} does not hold {model}")
        directory = Path(source.path)
        local = await self._manifest_of(directory)
        if local.sha256 != sha:
            raise RpcFailed(
                "manifest_mismatch",
                f"model {model}'s files on node {self._mesh.node_id} changed "
                f"(manifest {local.sha256[:16]}…)",
            )
        return directory, local

    async def _stored(self, sha: str) -> Path | None:
        """The store's directory of the model with manifest ``sha``, if the store holds it."""
        store = self._store
        if store is None:
            return None
        stored = await trio.to_thread.run_sync(store.lookup, sha, limiter=self._limiter)
        return None if stored is None else stored.directory

    async def _manifest_of(self, directory: Path, *, from_store: bool = False) -> LocalManifest:
        known = self._manifests.get(directory)
        if known is not None:
            return known
        nursery = self._nursery
        if nursery is None:
            raise RpcFailed("not_serving", "this node does not serve weights now")
        event = self._preparing.get(directory)
        if event is None:
            event = self._preparing[directory] = trio.Event()
            self._prepare_errors.pop(directory, None)
            nursery.start_soon(self._prepare, directory, event, from_store)
        with trio.move_on_after(self._prepare_wait):
            await event.wait()
        known = self._manifests.get(directory)
        if known is not None:
            return known
        if (error := self._prepare_errors.get(directory)) is not None:
            raise RpcFailed("not_holder", f"this node cannot read the model's files: {error}")
        raise RpcFailed("preparing", "hashing the model's files; ask again later")

    async def _prepare(self, directory: Path, event: trio.Event, from_store: bool) -> None:
        describe = _stored_manifest if from_store else local_manifest
        try:
            local = await trio.to_thread.run_sync(
                describe, directory, self._home, limiter=self._limiter
            )
            self._manifests[directory] = local
        except (OSError, ManifestInvalid) as exc:
            self._prepare_errors[directory] = str(exc)[:300]
            log.warning("transfer: cannot describe %s: %s", directory, exc)
        finally:
            self._preparing.pop(directory, None)
            event.set()

    # ---- streams ----

    async def _serve(
        self,
        peer: str,
        link: Link,
        sender: DataSender,
        request: RangeRequest,
        directory: Path,
        stamp: FileStamp,
    ) -> None:
        """Send one accepted request's bytes; never raises but cancellation."""
        failure: TransferFailed | None = None
        try:
            outcome = await self._stream(link, sender, request, directory, stamp)
            if outcome is not None:
                self.abandoned += 1
                if isinstance(outcome, _Refuse):
                    failure = TransferFailed(outcome.reason, outcome.message)
                log.debug("transfer to %s given up: %r", peer, outcome)
        except Exception as exc:  # a bug: it fails this stream, never run() and its peers
            log.exception("serving weights to %s failed", peer)
            failure = TransferFailed("internal_error", f"{type(exc).__name__} on the holder")
            self.abandoned += 1
        except BaseException:
            failure = TransferFailed("stopping", f"node {self._mesh.node_id} is stopping")
            raise
        finally:
            self.serving -= 1
            self._per_peer[peer] -= 1
            if not self._per_peer[peer]:
                del self._per_peer[peer]
            if not sender.ended and link.closed is None:
                if failure is not None:
                    with trio.move_on_after(1.0, shield=True):
                        with contextlib.suppress(LinkError, RuntimeError):
                            await sender.send(ITEM_CODEC.encode(failure), end=True)
                # Not ended yet (no credit for the failure, or the fetcher stalled past
                # timeouts.send): abort it, so its slot on the link is freed now.
                sender.abort(failure.reason if failure is not None else "abandoned")

    async def _stream(
        self,
        link: Link,
        sender: DataSender,
        request: RangeRequest,
        directory: Path,
        stamp: FileStamp,
    ) -> Exception | None:
        """Header, bytes, end; ``None`` when all was sent, else why it stopped: a
        :class:`_Refuse` (to tell the fetcher), or the fetcher gone (stopped, stalled, lost)."""
        try:
            await self._send(sender, ITEM_CODEC.encode(TransferHeader(request.request_id)))
            try:
                (now,) = await trio.to_thread.run_sync(stamps_of, directory, (request.file,))
            except OSError as exc:
                raise _Refuse("read_failed", f"{request.file}: {exc}"[:300]) from None
            if now != stamp:
                self._manifests.pop(directory, None)  # recomputed (and refused) next time
                raise _Refuse("model_changed", f"{request.file} changed since it was described")
        except (_Refuse, StreamStopped, PeerUnreachable, trio.TooSlowError) as exc:
            return exc
        outcome: Exception | None = None
        chunks_in, chunks_out = trio.open_memory_channel[_Chunk | _Refuse](_READ_AHEAD)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_when_closed, link, nursery.cancel_scope)
            nursery.start_soon(self._read_all, directory / request.file, request, chunks_in)
            try:
                async for item in chunks_out:
                    if isinstance(item, _Refuse):
                        raise item
                    await self._send(sender, item.encoded)
                    self.bytes_sent += item.size
                await self._send(sender, ITEM_CODEC.encode(TransferEnd()), end=True)
            except (_Refuse, StreamStopped, PeerUnreachable, trio.TooSlowError) as exc:
                outcome = exc
            nursery.cancel_scope.cancel()
        if outcome is None and link.closed is not None and not sender.ended:
            outcome = PeerUnreachable(link.closed)  # the watcher cancelled the stream
        return outcome

    async def _read_all(
        self, path: Path, request: RangeRequest, out: trio.MemorySendChannel[_Chunk | _Refuse]
    ) -> None:
        """Read the ranges chunk by chunk into ``out`` (a few chunks ahead of the sender), each
        made its data item on the worker thread that read it; a read failure is the last
        item."""
        async with out:
            for r in request.ranges:
                for at in range(r.start, r.end, self._chunk):
                    end = min(r.end, at + self._chunk)
                    try:
                        data = await trio.to_thread.run_sync(
                            self._read_chunk, path, at, end, limiter=self._limiter
                        )
                    except OSError as exc:
                        await out.send(_Refuse("read_failed", f"{path.name}: {exc}"[:300]))
                        return
                    await out.send(data)

    async def _send(
        self, sender: DataSender, body: bytes | bytearray, *, end: bool = False
    ) -> None:
        with trio.fail_after(self._t.send):
            await sender.send(body, end=end)
