"""One fetch of a model's pieces into one fetch directory (see :mod:`skulk.transfer._fetch` for
what is fetched and where; this module is how).

The manifest (kept in the directory, or asked of a holder) must hash to the card's
``manifest_sha256``; each piece's bytes must hash to what the manifest says; a piece's data is
fsynced before the record lists it. The pieces to fetch are cut into batches (pieces of one
file, at most ``policy.batch_bytes``, or one piece if it is larger). Batches run concurrently:
``policy.streams_per_holder`` per holder at once (the holder's own limit per peer is 2 by
default), each batch task starting with a different holder, so one holder's link carries
several streams and several holders send different ranges in parallel. A holder that fails a
batch transiently (a lost link, a timeout, busy) is tried again after the others, a round of
failures is followed by an exponential backoff, ``policy.retry_rounds`` rounds in a row
without progress give up (:class:`NoHolderReachable`); a holder that refuses the model or sends
bytes that fail their hash is not asked again by this fetch, and the batch goes to another.
The caller can cancel at any time: what verified so far is recorded first (shielded, bounded),
so a fetch resumes where it stopped, after a lost link, a cancellation or a restart.

Receiving stays on the Trio thread; hashing and writing run on worker threads, several chunks
per thread hop (whatever arrived meanwhile), one hop per stream at a time.
"""

from __future__ import annotations

import logging
import shutil
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import trio

from skulk.models import ManifestInvalid, decode_manifest, manifest_sha256
from skulk.store import StoredModel
from skulk.wire.transfer import ByteRange, Manifest

from ._client import RangeStream, WeightClient
from ._errors import DiskFull, ManifestMismatch, NoHolderReachable, PeerFailure
from ._protocol import MAX_RANGES, positive
from ._store import (
    FULL_ERRNOS,
    BatchWriter,
    CorruptPiece,
    PeerStore,
    Piece,
    TooMuchData,
    pieces_of,
)

log = logging.getLogger("skulk.transfer")

Progress = Callable[[int, int], None]
"""``progress(done_bytes, total_bytes)``: bytes of the wanted pieces on disk (verified, plus
those of pieces in flight) out of all wanted; never decreases, ends at the total."""
FileProgress = Callable[[int, int, str, int, int], None]
"""``progress(done, total, file, file_done, file_total)``: as :data:`Progress`, and the file
whose bytes just landed with its own figures (of its wanted pieces)."""
Select = Callable[[Manifest], list[Piece]]
"""The pieces a fetch wants, in manifest order."""

#: Chunks handed to the writer in one worker-thread hop, at most.
_CHUNKS_PER_HOP = 16


@attrs.frozen
class FetchPolicy:
    """How a fetch asks: batch size, concurrent streams per holder, and the retries of
    holders that fail transiently."""

    batch_bytes: int = 64 * 1024 * 1024
    max_pieces: int = 1024
    streams_per_holder: int = 1
    """Batches asked of one holder at once (its ``WeightServer`` allows 2 per peer by
    default; more are refused ``overloaded``). One: a second stream over the same link
    measured slower on a 2-core machine, where each end is CPU-bound already."""
    retry_rounds: int = 6
    """Rounds (every holder failed once) in a row without progress before giving up."""
    initial_backoff: float = attrs.field(default=0.5, validator=positive)
    max_backoff: float = attrs.field(default=10.0, validator=positive)

    def __attrs_post_init__(self) -> None:
        if self.batch_bytes < 1 or not 1 <= self.max_pieces <= MAX_RANGES:
            raise ValueError(f"batch_bytes >= 1 and max_pieces in 1..{MAX_RANGES}")
        if self.retry_rounds < 0 or self.streams_per_holder < 1:
            raise ValueError("retry_rounds must be >= 0 and streams_per_holder >= 1")

    def backoff(self, round_: int) -> float:
        return float(min(self.max_backoff, self.initial_backoff * 2 ** max(0, round_ - 1)))


class FetchRun:
    """One fetch of the pieces ``select`` wants into ``directory`` (see the module doc).
    After :meth:`run`: ``manifest_body`` is the manifest, ``complete`` whether the directory
    now holds every piece of every file (the whole model, verified); ``stored`` is set by
    the caller once the model is in the node's store."""

    def __init__(
        self,
        client: WeightClient,
        model: str,
        expected: str,
        directory: Path,
        holders: Sequence[str],
        select: Select,
        policy: FetchPolicy,
        progress: Progress | None = None,
        file_progress: FileProgress | None = None,
    ) -> None:
        self._client = client
        self._model = model
        self._sha = expected
        self._select = select
        self._store = PeerStore(directory)
        self._holders = list(dict.fromkeys(holders))
        self._policy = policy
        self._progress = progress
        self._file_progress = file_progress
        self._errors: dict[str, str] = {}
        self._lasting: set[str] = set()  # holders not to ask again
        self._slots: dict[str, trio.Semaphore] = {}
        self._record_lock = trio.Lock()
        self._verified: set[tuple[str, int, int]] = set()
        self._active: set[BatchWriter] = set()
        self._done = self._total = 0
        self._file_done: dict[str, int] = {}
        self._file_total: dict[str, int] = {}
        self._reported = -1
        self.manifest_body = b""
        self.complete = False
        self.stored: StoredModel | None = None

    @property
    def directory(self) -> Path:
        return self._store.directory

    async def run(self) -> None:
        manifest = await self._manifest()
        want = self._select(manifest)
        self._verified = await trio.to_thread.run_sync(self._store.open, manifest, self._sha)
        todo = [p for p in want if p.key not in self._verified]
        for p in want:
            self._file_total[p.file] = self._file_total.get(p.file, 0) + p.size
            if p.key in self._verified:
                self._file_done[p.file] = self._file_done.get(p.file, 0) + p.size
        self._total = sum(p.size for p in want)
        self._done = self._total - sum(p.size for p in todo)
        if todo:
            await self._check_space(self._total - self._done)
        self._report(todo[0].file if todo else (want[-1].file if want else ""))
        await self._fetch_all(_batches(todo, self._policy))
        assert self._done == self._total
        every = {p.key for entry in manifest.files for p in pieces_of(entry)}
        self.complete = every <= self._verified

    # ---- the manifest ----

    async def _manifest(self) -> Manifest:
        body = await trio.to_thread.run_sync(self._store.stored_manifest, self._sha)
        if body is None:
            body = await self._fetch_manifest()
            await trio.to_thread.run_sync(self._store.reset, body)
        self.manifest_body = body
        try:
            return decode_manifest(body)
        except ManifestInvalid as exc:  # hashes to the card's, yet invalid: a bad card
            raise ManifestMismatch(self._model, self._sha, str(exc)) from None

    async def _fetch_manifest(self) -> bytes:
        mismatched: dict[str, str] = {}
        rounds = 0
        while True:
            candidates = self._candidates()
            for peer in candidates:
                try:
                    body = await self._client.manifest(peer, self._model, self._sha)
                except PeerFailure as exc:
                    self._failed(exc)
                    if exc.reason == "manifest_mismatch":
                        mismatched[peer] = str(exc)
                    continue
                got = manifest_sha256(body)
                if got == self._sha:
                    return body
                why = f"node {peer} sent a manifest hashing to {got[:16]}…"
                mismatched[peer] = why
                self._failed(PeerFailure(peer, why, lasting=True))
            if mismatched and all(h in mismatched or h in self._lasting for h in self._holders):
                raise ManifestMismatch(self._model, self._sha, "; ".join(mismatched.values()))
            try:
                rounds = await self._next_round(rounds, bool(candidates))
            except NoHolderReachable as exc:
                if mismatched:  # the holders that answered have other files: say so
                    why = "; ".join(mismatched.values())
                    raise ManifestMismatch(self._model, self._sha, why) from exc
                raise

    # ---- pieces ----

    async def _fetch_all(self, batches: list[list[Piece]]) -> None:
        """Run the batches, ``streams_per_holder`` times the holders at once; the first failure that
        ends a batch (no holder could send it, the disk) stops them all and is raised."""
        if not batches:
            return
        queue = deque(batches)
        # Twice the streams: while one batch of a holder is fsynced and recorded, the next
        # one streams.
        streams = self._policy.streams_per_holder * max(1, len(self._holders))
        width = min(len(batches), 2 * streams)
        failures: list[Exception] = []

        async def worker(index: int) -> None:
            try:
                while queue:
                    await self._fetch_batch(queue.popleft(), index)
            except Exception as exc:
                failures.append(exc)
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            for index in range(width):
                nursery.start_soon(worker, index)
        if failures:
            raise failures[0]

    async def _fetch_batch(self, batch: list[Piece], index: int) -> None:
        rounds = 0
        while True:
            candidates = self._candidates()
            if candidates:  # each task starts with another holder: parallel ranges
                at = index % len(candidates)
                candidates = candidates[at:] + candidates[:at]
            for peer in candidates:
                if peer in self._lasting:  # another task found it out meanwhile
                    continue
                remaining = [p for p in batch if p.key not in self._verified]
                if not remaining:
                    return
                try:
                    await self._from(peer, remaining)
                except PeerFailure:
                    pass  # noted (and the holder set aside if for good) by _from
                if len([p for p in batch if p.key not in self._verified]) < len(remaining):
                    rounds = 0  # progress: the retry budget starts over
            if all(p.key in self._verified for p in batch):
                return
            rounds = await self._next_round(rounds, bool(candidates))

    def _slot(self, peer: str) -> trio.Semaphore:
        slot = self._slots.get(peer)
        if slot is None:
            slot = self._slots[peer] = trio.Semaphore(self._policy.streams_per_holder)
        return slot

    def _candidates(self) -> list[str]:
        """Holders to ask this round, linked ones first."""
        usable = [h for h in self._holders if h not in self._lasting]
        return sorted(usable, key=lambda h: not self._client.linked(h))

    def _failed(self, exc: PeerFailure) -> None:
        self._errors[exc.peer] = str(exc)
        if exc.lasting:
            self._lasting.add(exc.peer)
        log.info("transfer: model %s from node %s: %s", self._model, exc.peer, exc)

    async def _next_round(self, rounds: int, tried_any: bool) -> int:
        """Back off before the next round, or give up."""
        if not tried_any or rounds >= self._policy.retry_rounds:
            raise NoHolderReachable(self._model, self._errors)
        rounds += 1
        await trio.sleep(self._policy.backoff(rounds))
        return rounds

    async def _from(self, peer: str, pieces: list[Piece]) -> None:
        """Fetch ``pieces`` (one file, in order) from ``peer``; record what verified, whatever
        happens. Raises :class:`PeerFailure` (noted already), :class:`DiskFull`."""
        if not self._client.linked(peer):
            failure = PeerFailure(peer, "no link to it", lasting=False)
            self._failed(failure)
            raise failure
        try:
            writer = await trio.to_thread.run_sync(BatchWriter, self._store.directory, pieces)
        except OSError as exc:
            raise self._disk_error(exc) from None
        self._active.add(writer)
        ranges = merged(pieces)
        if not ranges:  # only empty pieces (an empty file, zero-size tensors): nothing to ask
            try:
                await trio.to_thread.run_sync(writer.feed, b"")
            finally:
                await self._settle(writer)
            return
        try:
            # The holder's slot is held while its bytes come, not while they are settled:
            # the next batch streams meanwhile. A failure is noted before the slot is given
            # up, so no other batch asks a holder that just failed for good.
            async with self._slot(peer):
                if peer in self._lasting:  # it failed for good while this batch waited
                    raise PeerFailure(peer, self._errors.get(peer, ""), lasting=True)
                try:
                    await self._stream(peer, pieces, ranges, writer)
                except PeerFailure as exc:
                    self._failed(exc)
                    raise
        finally:
            await self._settle(writer)

    async def _stream(
        self, peer: str, pieces: list[Piece], ranges: list[ByteRange], writer: BatchWriter
    ) -> None:
        async with self._client.open_ranges(
            peer, self._model, self._sha, pieces[0].file, ranges
        ) as stream:
            failure = await self._pump(stream, writer)
            if failure is None and not writer.complete:
                failure = PeerFailure(peer, "its stream ended before every byte", lasting=True)
        match failure:
            case None:
                pass
            case CorruptPiece():
                self._client.pieces_corrupt += 1
                why = f"sent bytes that fail their hash: {failure}"
                raise PeerFailure(peer, why, lasting=True)
            case TooMuchData():
                raise PeerFailure(peer, f"sent too much: {failure}", lasting=True)
            case OSError():
                raise self._disk_error(failure)
            case _:
                raise failure

    async def _pump(self, stream: RangeStream, writer: BatchWriter) -> Exception | None:
        """Receive into ``writer``: chunks are received (and decoded) on the Trio thread while
        those received before are hashed and written on a worker thread, as many per hop as
        arrived meanwhile. Returns what stopped it early (the holder's :class:`PeerFailure`,
        or the writer's :class:`CorruptPiece`, :class:`TooMuchData`, ``OSError``), ``None``
        at the stream's end."""
        failures: list[Exception] = []
        chunks_in, chunks_out = trio.open_memory_channel[memoryview](_CHUNKS_PER_HOP)

        async def write_all() -> None:
            try:
                async for data in chunks_out:
                    chunks = [data]
                    while len(chunks) < _CHUNKS_PER_HOP:
                        try:
                            chunks.append(chunks_out.receive_nowait())
                        except (trio.WouldBlock, trio.EndOfChannel):
                            break
                    try:
                        await trio.to_thread.run_sync(writer.feed_all, chunks)
                    finally:
                        self._report(writer.file)
            except (CorruptPiece, TooMuchData, OSError) as exc:
                failures.append(exc)
                nursery.cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(write_all)
            try:
                async with chunks_in:
                    while True:
                        try:
                            data = await stream.receive()
                        except trio.EndOfChannel:
                            break
                        await chunks_in.send(data)
            except PeerFailure as exc:
                failures.append(exc)
                nursery.cancel_scope.cancel()
        return failures[0] if failures else None

    async def _settle(self, writer: BatchWriter) -> None:
        """fsync, then record, what verified (shielded: a cancelled fetch keeps its
        progress; bounded by the disk). Records are written one at a time."""
        with trio.CancelScope(shield=True):
            try:
                if not writer.verified:
                    await trio.to_thread.run_sync(writer.abort)
                    return
                await trio.to_thread.run_sync(writer.finish)  # fsync (and rename a whole file)
                async with self._record_lock:
                    new = {p.key for p in writer.verified} - self._verified
                    keep = self._verified | new
                    await trio.to_thread.run_sync(self._store.record, self._sha, keep)
                    self._verified = keep
            except OSError as exc:
                raise self._disk_error(exc) from None
            finally:
                self._active.discard(writer)
            landed = sum(p.size for p in writer.verified if p.key in new)
            self._done += landed
            self._file_done[writer.file] = self._file_done.get(writer.file, 0) + landed
            self._client.pieces_verified += len(new)

    def _report(self, file: str) -> None:
        in_flight = sum(w.landed for w in self._active)
        done = min(self._total, self._done + in_flight)
        if done <= self._reported:
            return
        self._reported = done
        if self._progress is not None:
            self._progress(done, self._total)
        if self._file_progress is not None:
            flying = sum(w.landed for w in self._active if w.file == file)
            total = self._file_total.get(file, 0)
            file_done = min(total, self._file_done.get(file, 0) + flying)
            self._file_progress(done, self._total, file, file_done, total)

    @property
    def missing(self) -> int:
        """Bytes still wanted (0 before the manifest is known)."""
        return self._total - self._done

    def _disk_error(self, exc: OSError) -> Exception:
        if exc.errno in FULL_ERRNOS:
            return DiskFull(self._model, str(self._store.directory), self.missing, -1)
        return exc

    async def _check_space(self, needed_bytes: int) -> None:
        usage = await trio.to_thread.run_sync(shutil.disk_usage, self._store.directory)
        if needed_bytes > usage.free:
            raise DiskFull(self._model, str(self._store.directory), needed_bytes, usage.free)


def merged(pieces: list[Piece]) -> list[ByteRange]:
    """The pieces' ranges with adjacent ones joined (they are sorted and disjoint); empty
    pieces (zero-size tensors) need no bytes."""
    out: list[ByteRange] = []
    for p in pieces:
        if p.size == 0:
            continue
        if out and out[-1].end == p.start:
            out[-1] = ByteRange(out[-1].start, p.end)
        else:
            out.append(ByteRange(p.start, p.end))
    return out


def _batches(pieces: list[Piece], policy: FetchPolicy) -> list[list[Piece]]:
    """Consecutive pieces of one file, up to ``batch_bytes`` / ``max_pieces`` each; a whole
    file is a batch of its own."""
    out: list[list[Piece]] = []
    size = 0
    for p in pieces:
        last = out[-1] if out else None
        if (
            last is None
            or last[0].file != p.file
            or p.whole
            or last[0].whole
            or size + p.size > policy.batch_bytes
            or len(last) >= policy.max_pieces
        ):
            out.append([p])
            size = p.size
        else:
            last.append(p)
            size += p.size
    return out
