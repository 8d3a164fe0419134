"""Fetch the weights a shard needs from the nodes holding its model.

:func:`fetch_model` returns the directory a runner loads the shard from:

* the demo model: generated here (no transfer);
* a model in a local directory, on a node the card lists as a holder, whose files hash to the
  card's manifest: that directory (another node seeing the same path fetches all the same);
* otherwise the store ``<home>/models/.peer/<model>/`` (:mod:`skulk.transfer._store`), into
  which the pieces the shard needs and does not have yet are fetched: every small file
  (config, tokenizer, index) and safetensors header, and the tensors
  :func:`~skulk.models.needed_tensors` names for the shard. A later shard of the same model
  fetches only what is still missing.

Order of checks: the manifest (kept in the store, or asked of a holder) must hash to the card's
``manifest_sha256``; each piece's bytes must hash to what the manifest says; a piece's data is
fsynced before the record lists it. Requests are batches of pieces of one file (at most
``policy.batch_bytes``, or one piece if it is larger), asked of one holder at a time: a holder
that fails transiently (a lost link, a timeout, busy) is tried again after the others, a round
of failures is followed by an exponential backoff, ``policy.retry_rounds`` rounds in a row
without progress give up (:class:`NoHolderReachable`); a holder that refuses the model or sends
bytes that fail their hash is not asked again by this fetch. The caller can cancel at any time:
what verified so far is recorded first (shielded, bounded), so a fetch resumes where it
stopped, after a lost link, a cancellation or a restart of the node.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import trio

from skulk.models import (
    LocalManifest,
    ManifestInvalid,
    ShardSlice,
    decode_manifest,
    ensure_demo_model,
    local_manifest,
    manifest_sha256,
    needed_tensors,
)
from skulk.wire.cluster import DemoSource, ModelCard
from skulk.wire.transfer import ByteRange, Manifest

from ._client import RangeStream, WeightClient
from ._errors import DiskFull, ManifestMismatch, NoHolderReachable, NoManifest, PeerFailure
from ._protocol import MAX_RANGES, positive
from ._store import (
    FULL_ERRNOS,
    BatchWriter,
    CorruptPiece,
    PeerStore,
    Piece,
    TooMuchData,
    pieces_of,
    store_directory,
)

log = logging.getLogger("skulk.transfer")

Progress = Callable[[int, int], None]
"""``progress(done_bytes, total_bytes)``: bytes of the shard's pieces on disk (verified, plus
those of the piece in flight) out of all it needs; never decreases, ends at the total."""


@attrs.frozen
class FetchPolicy:
    """How a fetch asks: batch size, and the retries of holders that fail transiently."""

    batch_bytes: int = 64 * 1024 * 1024
    max_pieces: int = 1024
    retry_rounds: int = 6
    """Rounds (every holder failed once) in a row without progress before giving up."""
    initial_backoff: float = attrs.field(default=0.5, validator=positive)
    max_backoff: float = attrs.field(default=10.0, validator=positive)

    def __attrs_post_init__(self) -> None:
        if self.batch_bytes < 1 or not 1 <= self.max_pieces <= MAX_RANGES:
            raise ValueError(f"batch_bytes >= 1 and max_pieces in 1..{MAX_RANGES}")
        if self.retry_rounds < 0:
            raise ValueError("retry_rounds must be >= 0")

    def backoff(self, round_: int) -> float:
        return float(min(self.max_backoff, self.initial_backoff * 2 ** max(0, round_ - 1)))


async def fetch_model(
    client: WeightClient,
    card: ModelCard,
    shard: ShardSlice,
    home: Path,
    *,
    holders: Sequence[str] | None = None,
    progress: Progress | None = None,
    policy: FetchPolicy = FetchPolicy(),
) -> Path:
    """The directory the runner of ``shard`` loads ``card``'s model from, after fetching what
    it lacks (see the module doc). ``holders``: the nodes to ask, in order (default: the
    card's holders but this node). ``progress(done, total)`` is called first with what the
    store already holds, then as bytes land, last with ``(total, total)``; not at all when
    the model is used where it is (a local directory, the demo model).

    Raises :class:`NoHolderReachable`, :class:`ManifestMismatch`, :class:`NoManifest`,
    :class:`DiskFull` (all :class:`FetchError`\\ s); ``OSError`` for other file-system
    failures under ``home``."""
    source = card.source
    if isinstance(source, DemoSource):
        return await trio.to_thread.run_sync(ensure_demo_model, home, source.seed)
    local = Path(source.path)
    expected = card.manifest_sha256
    if expected is None:
        if await trio.to_thread.run_sync(_is_model_dir, local):
            return local
        raise NoManifest(
            card.id, f"model {card.id} is not on this node ({local}) and has no manifest"
        )
    # The card's path is used in place only on a node the State lists as a holder: another
    # node may see a directory at that path (a shared file system, nodes on one machine), but
    # only the holders vouched for it; everyone else fetches (and verifies) its share.
    if client.node_id in card.holders and await _have_locally(local, expected, home):
        return local
    if holders is None:
        holders = card.holders
    holders = [h for h in holders if h != client.node_id]
    store = store_directory(home, card.id)
    async with client.lock(store):
        run = _Fetch(client, card, expected, shard, store, holders, progress, policy)
        client.fetching += 1
        try:
            await run.run()
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:  # the store's layout, manifest or record
                raise DiskFull(card.id, str(store), run.missing, -1) from exc
            raise
        finally:
            client.fetching -= 1
    return store


async def _have_locally(path: Path, expected: str, home: Path) -> bool:
    """Whether ``path`` holds the model with manifest ``expected`` (hashes it the first time:
    the manifest cache makes later checks cheap)."""
    try:
        local = await trio.to_thread.run_sync(_manifest_if_model, path, home)
    except (OSError, ManifestInvalid) as exc:
        log.warning("transfer: cannot check %s against its manifest: %s", path, exc)
        return False
    return local is not None and local.sha256 == expected


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file()


def _manifest_if_model(path: Path, home: Path) -> LocalManifest | None:
    return local_manifest(path, home) if _is_model_dir(path) else None


class _Fetch:
    """One fetch of one shard's pieces into one store (see the module doc)."""

    def __init__(
        self,
        client: WeightClient,
        card: ModelCard,
        expected: str,
        shard: ShardSlice,
        directory: Path,
        holders: Sequence[str],
        progress: Progress | None,
        policy: FetchPolicy,
    ) -> None:
        self._client = client
        self._card = card
        self._sha = expected
        self._shard = shard
        self._store = PeerStore(directory)
        self._holders = list(dict.fromkeys(holders))
        self._progress = progress
        self._policy = policy
        self._errors: dict[str, str] = {}
        self._lasting: set[str] = set()  # holders not to ask again
        self._verified: set[tuple[str, int, int]] = set()
        self._done = self._total = 0
        self._reported = -1

    async def run(self) -> None:
        manifest = await self._manifest()
        want = self._wanted(manifest)
        self._verified = await trio.to_thread.run_sync(self._store.open, manifest, self._sha)
        todo = [p for p in want if p.key not in self._verified]
        self._total = sum(p.size for p in want)
        self._done = self._total - sum(p.size for p in todo)
        if todo:
            await self._check_space(self._total - self._done)
        self._report(0)
        for batch in _batches(todo, self._policy):
            await self._fetch_batch(batch)
        assert self._done == self._total

    def _wanted(self, manifest: Manifest) -> list[Piece]:
        """Every small file and safetensors header; the tensors the shard needs."""
        names = [t.name for entry in manifest.files for t in entry.tensors]
        keep = set(needed_tensors(names, self._shard))
        want: list[Piece] = []
        for entry in manifest.files:
            pieces = pieces_of(entry)
            if entry.header_length is None:
                want += pieces
                continue
            want.append(pieces[0])
            tensors = zip(pieces[1:], entry.tensors, strict=True)
            want += [p for p, t in tensors if t.name in keep]
        return want

    # ---- the manifest ----

    async def _manifest(self) -> Manifest:
        body = await trio.to_thread.run_sync(self._store.stored_manifest, self._sha)
        if body is None:
            body = await self._fetch_manifest()
            await trio.to_thread.run_sync(self._store.reset, body)
        try:
            return decode_manifest(body)
        except ManifestInvalid as exc:  # hashes to the card's, yet invalid: a bad card
            raise ManifestMismatch(self._card.id, self._sha, str(exc)) from None

    async def _fetch_manifest(self) -> bytes:
        mismatched: dict[str, str] = {}
        rounds = 0
        while True:
            candidates = self._candidates()
            for peer in candidates:
                try:
                    body = await self._client.manifest(peer, self._card.id, self._sha)
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
                raise ManifestMismatch(self._card.id, self._sha, "; ".join(mismatched.values()))
            try:
                rounds = await self._next_round(rounds, bool(candidates))
            except NoHolderReachable as exc:
                if mismatched:  # the holders that answered have other files: say so
                    why = "; ".join(mismatched.values())
                    raise ManifestMismatch(self._card.id, self._sha, why) from exc
                raise

    # ---- pieces ----

    async def _fetch_batch(self, batch: list[Piece]) -> None:
        rounds = 0
        while True:
            candidates = self._candidates()
            for peer in candidates:
                remaining = [p for p in batch if p.key not in self._verified]
                if not remaining:
                    return
                before = len(self._verified)
                try:
                    await self._from(peer, remaining)
                except PeerFailure as exc:
                    self._failed(exc)
                if len(self._verified) > before:
                    rounds = 0  # progress: the retry budget starts over
            if all(p.key in self._verified for p in batch):
                return
            rounds = await self._next_round(rounds, bool(candidates))

    def _candidates(self) -> list[str]:
        """Holders to ask this round, linked ones first."""
        usable = [h for h in self._holders if h not in self._lasting]
        return sorted(usable, key=lambda h: not self._client.linked(h))

    def _failed(self, exc: PeerFailure) -> None:
        self._errors[exc.peer] = str(exc)
        if exc.lasting:
            self._lasting.add(exc.peer)
        log.info("transfer: model %s from node %s: %s", self._card.id, exc.peer, exc)

    async def _next_round(self, rounds: int, tried_any: bool) -> int:
        """Back off before the next round, or give up."""
        if not tried_any or rounds >= self._policy.retry_rounds:
            raise NoHolderReachable(self._card.id, self._errors)
        rounds += 1
        await trio.sleep(self._policy.backoff(rounds))
        return rounds

    async def _from(self, peer: str, pieces: list[Piece]) -> None:
        """Fetch ``pieces`` (one file, in order) from ``peer``; record what verified, whatever
        happens. Raises :class:`PeerFailure`, :class:`DiskFull`."""
        if not self._client.linked(peer):
            raise PeerFailure(peer, "no link to it", lasting=False)
        try:
            writer = await trio.to_thread.run_sync(BatchWriter, self._store.directory, pieces)
        except OSError as exc:
            raise self._disk_error(exc) from None
        ranges = _merged(pieces)
        if not ranges:  # only empty pieces (an empty file, zero-size tensors): nothing to ask
            try:
                await trio.to_thread.run_sync(writer.feed, b"")
            finally:
                await self._settle(writer)
            return
        try:
            async with self._client.open_ranges(
                peer, self._card.id, self._sha, pieces[0].file, ranges
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
        finally:
            await self._settle(writer)

    async def _pump(self, stream: RangeStream, writer: BatchWriter) -> Exception | None:
        """Receive into ``writer``: the next chunk is received (and decoded) on the Trio thread
        while the last one is hashed and written on a worker thread. Returns what stopped it
        early (the holder's :class:`PeerFailure`, or the writer's :class:`CorruptPiece`,
        :class:`TooMuchData`, ``OSError``), ``None`` at the stream's end."""
        failures: list[Exception] = []
        chunks_in, chunks_out = trio.open_memory_channel[memoryview](2)

        async def write_all() -> None:
            try:
                async for data in chunks_out:
                    try:
                        await trio.to_thread.run_sync(writer.feed, data)
                    finally:
                        self._landed(writer)
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
        progress; bounded by the disk)."""
        with trio.CancelScope(shield=True):
            try:
                if not writer.verified:
                    await trio.to_thread.run_sync(writer.abort)
                    return
                await trio.to_thread.run_sync(writer.finish)  # fsync (and rename a whole file)
                new = {p.key for p in writer.verified} - self._verified
                await trio.to_thread.run_sync(self._store.record, self._sha, self._verified | new)
            except OSError as exc:
                raise self._disk_error(exc) from None
            self._verified |= new
            self._done += sum(p.size for p in writer.verified if p.key in new)
            self._client.pieces_verified += len(new)

    def _landed(self, writer: BatchWriter) -> None:
        fresh = sum(p.size for p in writer.verified if p.key not in self._verified)
        self._report(fresh + writer.partial)

    def _report(self, in_flight: int) -> None:
        done = min(self._total, self._done + in_flight)
        if self._progress is not None and done > self._reported:
            self._reported = done
            self._progress(done, self._total)

    @property
    def missing(self) -> int:
        """Bytes the shard still needs (0 before the manifest is known)."""
        return self._total - self._done

    def _disk_error(self, exc: OSError) -> Exception:
        if exc.errno in FULL_ERRNOS:
            return DiskFull(self._card.id, str(self._store.directory), self.missing, -1)
        return exc

    async def _check_space(self, needed_bytes: int) -> None:
        usage = await trio.to_thread.run_sync(shutil.disk_usage, self._store.directory)
        if needed_bytes > usage.free:
            raise DiskFull(self._card.id, str(self._store.directory), needed_bytes, usage.free)


def _merged(pieces: list[Piece]) -> list[ByteRange]:
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
