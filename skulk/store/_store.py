"""The content-addressed model store: :class:`ModelStore` (see the package doc for the layout).

Every method is blocking file I/O (call it from a worker thread); one store object may be used
from several threads at once (an internal lock orders changes to the index and the layout;
copying and hashing run outside it). It stays one module a little over 500 lines: every
method takes part in the one lock discipline over the index and the layout, which is easier to
check in one place than across files.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import threading
from collections.abc import Callable, Collection, Mapping
from pathlib import Path

import attrs

from skulk.clock import wall
from skulk.models import (
    ManifestInvalid,
    decode_manifest,
    encode_manifest,
    fsync_directory,
    local_manifest,
    manifest_sha256,
    write_atomically,
)
from skulk.store._blobs import READ_ONLY, copy_hashing, hash_file, link_or_copy, same_file
from skulk.store._errors import MissingBlobs, ModelInUse, NotStored, StoreFull
from skulk.store._index import (
    Index,
    IndexEntry,
    check_name,
    find,
    is_sha256_hex,
    plan_eviction,
    with_entry,
    without,
    write_index,
)
from skulk.store._layout import (
    IMPORT_PREFIX,
    INDEX_NAME,
    MANIFEST_NAME,
    blob_sizes,
    recover,
)
from skulk.store._records import Progress, StoredModel, StoreStatistics, VerifyReport
from skulk.wire.transfer import Manifest

#: Free disk space kept aside by default: the store never plans to fill the disk.
DEFAULT_RESERVE_BYTES = 1024 * 1024 * 1024
_STAGING_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


class ModelStore:
    """The model store under ``root`` (created if absent), with at most ``budget_bytes`` of
    blobs (``None``: limited by the disk only) and ``reserve_bytes`` of the disk always left
    free. ``disk_free`` (free bytes of the store's file system) and ``clock`` (wall time) are
    for tests. Opening repairs what a crash left: incomplete model directories and import
    staging are deleted, the index forgets models whose directory is gone and adopts complete
    directories it does not list (without names), and a damaged index is rebuilt from the
    directories."""

    def __init__(
        self,
        root: Path,
        budget_bytes: int | None = None,
        *,
        reserve_bytes: int = DEFAULT_RESERVE_BYTES,
        disk_free: Callable[[], int] | None = None,
        clock: Callable[[], float] = wall,
    ) -> None:
        if budget_bytes is not None and budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, not {budget_bytes}")
        self.root = root
        self.budget_bytes = budget_bytes
        self.reserve_bytes = reserve_bytes
        self._disk_free = disk_free or (lambda: shutil.disk_usage(self.root).free)
        self._clock = clock
        self._lock = threading.RLock()
        self._blobs = root / "blobs"
        self._models = root / "models"
        self._staging = root / "staging"
        recovered = recover(root)
        self._index = recovered.index
        self._manifests = recovered.manifests
        self._loose = recovered.loose  # blobs no stored model uses
        self._pending: set[str] = set()  # blobs added for a commit still to come

    # ---- blobs and staging -------------------------------------------------------------------

    def blob_path(self, sha256: str) -> Path:
        if not is_sha256_hex(sha256):
            raise ValueError(f"not a sha256 (64 lowercase hex digits): {sha256!r}")
        return self._blobs / sha256

    def has_blob(self, sha256: str) -> bool:
        return self.blob_path(sha256).is_file()

    def staging(self, key: str) -> Path:
        """The staging directory ``staging/<key>/`` (created if absent; what a previous attempt
        left there stays, so a download resumes). ``key`` is a plain name."""
        path = self._staging_path(key)
        path.mkdir(exist_ok=True)
        return path

    def discard_staging(self, key: str) -> None:
        """Delete a staging directory: renamed aside first, so a crash never leaves part of
        one under its key (what is aside is deleted when the store is opened)."""
        gone = self._staging / f".gone-{secrets.token_hex(6)}"
        try:
            os.replace(self._staging_path(key), gone)
        except FileNotFoundError:
            return
        shutil.rmtree(gone, ignore_errors=True)

    def _staging_path(self, key: str) -> Path:
        if not _STAGING_KEY.match(key):
            raise ValueError(f"a staging key must be a plain name: {key!r}")
        return self._staging / key

    def add_verified_file(self, path: Path, sha256: str) -> Path:
        """Move ``path`` (whose sha256 the caller checked; on the store's file system, e.g. in
        :meth:`staging`) into the store as the blob ``sha256``, read-only and fsynced, and
        return the blob's path. A blob already there is kept and ``path`` deleted. The blob is
        kept (not pruned, not deleted with a removed model) until a :meth:`commit` uses it."""
        return self._add_blob(path, sha256, keep=False)

    def _add_blob(self, path: Path, sha256: str, *, keep: bool) -> Path:
        """``path`` becomes the blob ``sha256``: renamed, or with ``keep`` hard-linked (copied
        where links are refused) so that ``path`` stays until its directory is discarded."""
        blob = self.blob_path(sha256)
        if not blob.is_file():  # durable before it is a blob (outside the lock: it is slow)
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            os.chmod(path, READ_ONLY)
        with self._lock:
            self._pending.add(sha256)
            if blob.is_file():
                if not keep:
                    path.unlink()
                return blob
            size = path.stat().st_size
            if keep:
                link_or_copy(path, blob)
            else:
                os.replace(path, blob)
            fsync_directory(self._blobs)
            if not self._is_referenced(sha256):
                self._loose[sha256] = size
        return blob

    # ---- models --------------------------------------------------------------------------------

    def commit(self, manifest_body: bytes, names: Collection[str] = ()) -> StoredModel:
        """Make the model described by ``manifest_body`` (canonical manifest bytes) available
        under ``models/<its sha256>/``, every file a hard link to its blob (a copy where the file
        system refuses links), and give it ``names`` (taken from any model that had them). The
        directory appears at once and complete (built aside, then renamed) or not at all.
        Committing a stored model again only adds the names and counts as a use. Raises
        :class:`MissingBlobs` (nothing changed) unless every blob is in the store,
        :class:`~skulk.models.ManifestInvalid` for bytes that are no canonical manifest and
        ``ValueError`` for a bad name."""
        manifest = decode_manifest(manifest_body)
        if encode_manifest(manifest) != manifest_body:  # one content, one identity
            raise ManifestInvalid("manifest bytes are not in canonical form")
        sha = manifest_sha256(manifest_body)
        for name in names:
            check_name(name)
        blobs = {f.sha256.hex(): f.size for f in manifest.files}
        with self._lock:
            old = find(self._index, sha)
            if old is None:
                self._build(sha, manifest, manifest_body)
            entry = IndexEntry(
                sha,
                sum(blobs.values()),
                self._clock(),
                tuple(dict.fromkeys([*(old.names if old else ()), *names])),
            )
            self._save(with_entry(self._index, entry))
            for blob in blobs:
                self._loose.pop(blob, None)
                self._pending.discard(blob)
            return self._stored(entry)

    def import_directory(
        self,
        src: Path,
        name: str,
        progress: Progress | None = None,
        *,
        manifest_cache: Path | None = None,
    ) -> StoredModel:
        """Import the model directory ``src`` by content and name it ``name``: its manifest is
        computed as for any model directory (:func:`~skulk.models.local_manifest`, cached under
        ``manifest_cache`` when given), every file whose blob is missing is copied into staging
        while hashed, checked against the manifest, and moved in; then the model is committed.
        Files are always copied, never linked to ``src``: a link would share ``src``'s inode, so
        a later write there would change a blob and removing the model would free nothing.
        ``progress(done, total)`` counts bytes copied of those to copy. Two copies of one model
        at different paths are one model, stored once. Raises ``ManifestInvalid`` if ``src`` is
        not a model directory or a file changed while it was copied."""
        check_name(name)
        src = src.resolve()
        if not (src / "config.json").is_file():
            raise ManifestInvalid(f"{src} is not a model directory (no config.json)")
        local = local_manifest(src, manifest_cache)
        where = hashlib.sha256(str(src).encode()).hexdigest()[:12]
        key = f"{IMPORT_PREFIX}{where}-{secrets.token_hex(4)}"  # each import its own
        stage = self.staging(key)
        try:
            self._copy_missing(src, stage, local.manifest, progress)
            try:
                return self.commit(local.body, (name,))
            except MissingBlobs:  # a blob went (a model removed) while we copied: once more
                self._copy_missing(src, stage, local.manifest, progress)
                return self.commit(local.body, (name,))
        finally:
            self.discard_staging(key)

    def commit_staging(
        self, key: str, names: Collection[str], expected: Mapping[str, str] | None = None
    ) -> StoredModel:
        """Store the model downloaded into :meth:`staging` ``key`` (e.g. a Hub snapshot) and
        delete the staging directory: its manifest is computed (this hashes every file once),
        every file is checked against ``expected`` (file name → sha256 hex, as the download
        verified them: both must list the same files) and hard-linked into the store (so a
        crash before the end leaves the staging directory whole for a retry), then the model is
        committed under ``names``. Raises ``ManifestInvalid`` naming the file that does not
        match (the staging directory is kept: delete it, or fetch that file again)."""
        stage = self.staging(key)
        if not (stage / "config.json").is_file():
            raise ManifestInvalid(f"staging {key!r} holds no model (no config.json)")
        local = local_manifest(stage)
        hashes = {f.name: f.sha256.hex() for f in local.manifest.files}
        if expected is not None:
            for name in sorted(hashes.keys() | expected.keys()):
                if hashes.get(name) != expected.get(name):
                    raise ManifestInvalid(
                        f"staging {key!r}: file {name!r} is not what the download verified "
                        f"(expected {expected.get(name)}, found {hashes.get(name)})"
                    )
        model = self.adopt_verified(stage, local.body, names)
        self.discard_staging(key)
        return model

    def adopt_verified(
        self, directory: Path, manifest_body: bytes, names: Collection[str]
    ) -> StoredModel:
        """Store the model whose files in ``directory`` (on the store's file system, e.g. a
        :meth:`staging` directory) the caller verified against ``manifest_body`` (canonical
        manifest bytes): nothing is hashed or copied here, each file is hard-linked in as its
        blob (read-only from now on; copied where links are refused), then the model is
        committed under ``names``. ``directory`` stays: discard it once done with it."""
        manifest = decode_manifest(manifest_body)
        for f in manifest.files:
            self._add_blob(directory / f.name, f.sha256.hex(), keep=True)
        return self.commit(manifest_body, names)

    def lookup(self, name_or_hash: str) -> StoredModel | None:
        with self._lock:
            entry = find(self._index, name_or_hash)
            return self._stored(entry) if entry else None

    def models(self) -> list[StoredModel]:
        """Every stored model, most recently used first."""
        with self._lock:
            entries = sorted(self._index.models, key=lambda e: (-e.last_used, e.sha256))
            return [self._stored(e) for e in entries]

    def touch(self, name_or_hash: str) -> StoredModel:
        """Count a use of the model now (for least-recently-used eviction)."""
        with self._lock:
            entry = self._find(name_or_hash)
            entry = attrs.evolve(entry, last_used=self._clock())
            self._save(with_entry(self._index, entry))
            return self._stored(entry)

    def remove(self, name_or_hash: str, in_use: Collection[str] = ()) -> StoredModel:
        """Remove a model: refused with :class:`ModelInUse` when its manifest hash is in
        ``in_use``; blobs no other model uses are deleted. Raises :class:`NotStored`."""
        with self._lock:
            entry = self._find(name_or_hash)
            if entry.sha256 in in_use:
                raise ModelInUse(name_or_hash, entry.sha256)
            stored = self._stored(entry)
            self._drop(entry.sha256)
            return stored

    # ---- space ---------------------------------------------------------------------------------

    def used_bytes(self) -> int:
        """Bytes of all blobs: those of stored models (each once) and loose ones."""
        with self._lock:
            return self._referenced_bytes() + sum(self._loose.values())

    def statistics(self) -> StoreStatistics:
        with self._lock:
            return StoreStatistics(
                len(self._index.models),
                self.used_bytes(),
                sum(self._loose.values()),
                self.budget_bytes,
                self._room()[0],
            )

    def available_bytes(self) -> int:
        """Room now: the smaller of the budget left and the free disk less the reserve."""
        return self._room()[0]

    def ensure_room(self, nbytes: int, in_use: Collection[str] = ()) -> list[StoredModel]:
        """Make room for ``nbytes`` more bytes of blobs, evicting least recently used models
        whose manifest hash is not in ``in_use``, until ``nbytes`` fits both the budget and the
        free disk less the reserve. Returns the evicted models. Raises :class:`StoreFull`, and
        evicts nothing, when even evicting every model not in use would not make room."""
        with self._lock:
            room, limit = self._room()
            if nbytes <= room:
                return []
            blobs_of = {sha: blob_sizes(m) for sha, m in self._manifests.items()}
            plan = plan_eviction(self._index, blobs_of, nbytes - room, in_use, self._pending)
            if not plan.enough:
                raise StoreFull(nbytes, room, plan.reclaimable, limit=limit)
            evicted = [self._stored(self._find(sha)) for sha in plan.victims]
            for sha in plan.victims:
                self._drop(sha)
            return evicted

    def prune(self, keep: Collection[str] = ()) -> int:
        """Delete loose blobs (in no stored model: left by a download that never committed)
        except those in ``keep`` and those added since the store was opened; returns the bytes
        freed. Call it at start-up with the blobs of the downloads that will resume."""
        with self._lock:
            doomed = [b for b in self._loose if b not in keep and b not in self._pending]
            freed = sum(self._loose.pop(b) for b in doomed)
            for blob in doomed:
                with contextlib.suppress(FileNotFoundError):
                    (self._blobs / blob).unlink()
            if doomed:
                fsync_directory(self._blobs)
            return freed

    # ---- verification --------------------------------------------------------------------------

    def verify(self, name_or_hash: str) -> VerifyReport:
        """Hash every file of a stored model again (its blob, and its directory's copy where it
        is not a link). A blob whose bytes do not match is deleted and every model using it is
        dropped from the store (never served again); a bad copy drops only its model."""
        with self._lock:
            entry = self._find(name_or_hash)
            manifest = self._manifests[entry.sha256]
        directory = self._models / entry.sha256
        checked = 0
        bad_blobs: list[tuple[str, str]] = []
        bad_copies: list[tuple[str, str]] = []
        for f in manifest.files:
            blob = f.sha256.hex()
            path = self._blobs / blob
            try:
                good = hash_file(path) == blob
            except FileNotFoundError:
                good = False
            checked += f.size
            if not good:
                bad_blobs.append((f.name, blob))
            elif not same_file(path, directory / f.name):
                checked += f.size
                try:
                    if hash_file(directory / f.name) != blob:
                        bad_copies.append((f.name, blob))
                except FileNotFoundError:
                    bad_copies.append((f.name, blob))
        dropped: list[StoredModel] = []
        with self._lock:
            bad = {b for _, b in bad_blobs}
            users = [
                e.sha256
                for e in self._index.models
                if bad & blob_sizes(self._manifests[e.sha256]).keys()
                or (bad_copies and e.sha256 == entry.sha256)
            ]
            # The bad blobs go first: after a crash here, opening the store drops the models
            # whose blobs are missing, so no bad byte is ever kept under a good name.
            for blob in bad:
                self._pending.discard(blob)
                self._loose.pop(blob, None)
                with contextlib.suppress(FileNotFoundError):
                    (self._blobs / blob).unlink()
            if bad:
                fsync_directory(self._blobs)
            for sha in users:
                dropped.append(self._stored(self._find(sha)))
                self._drop(sha)
        corrupt = tuple(bad_blobs) + tuple(bad_copies)
        return VerifyReport(entry.sha256, checked, corrupt, tuple(dropped))

    # ---- internals -----------------------------------------------------------------------------

    def _find(self, name_or_hash: str) -> IndexEntry:
        entry = find(self._index, name_or_hash)
        if entry is None:
            raise NotStored(name_or_hash)
        return entry

    def _stored(self, entry: IndexEntry) -> StoredModel:
        return StoredModel(
            entry.sha256, self._models / entry.sha256, entry.size, entry.last_used, entry.names
        )

    def _save(self, index: Index) -> None:
        write_index(self.root / INDEX_NAME, index)
        self._index = index

    def _is_referenced(self, blob: str) -> bool:
        return any(blob in blob_sizes(m) for m in self._manifests.values())

    def _referenced_bytes(self) -> int:
        sizes: dict[str, int] = {}
        for manifest in self._manifests.values():
            sizes.update(blob_sizes(manifest))
        return sum(sizes.values())

    def _room(self) -> tuple[int, str]:
        disk = self._disk_free() - self.reserve_bytes
        if self.budget_bytes is None:
            return disk, "free disk less its reserve"
        budget = self.budget_bytes - self.used_bytes()
        if budget <= disk:
            return budget, f"store budget {self.budget_bytes} bytes"
        return disk, "free disk less its reserve"

    def _build(self, sha: str, manifest: Manifest, body: bytes) -> None:
        """Lay out ``models/<sha>/``: aside, then renamed into place (called under the lock)."""
        missing: dict[str, tuple[str, ...]] = {}
        for f in manifest.files:
            blob = f.sha256.hex()
            if not (self._blobs / blob).is_file():
                missing[blob] = (*missing.get(blob, ()), f.name)
        if missing:
            raise MissingBlobs(sha, missing)
        final = self._models / sha
        if final.exists():  # not in the index, so not ours to trust: lay it out again
            shutil.rmtree(final)
        tmp = self._models / f".tmp-{sha[:16]}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            for f in manifest.files:
                link_or_copy(self._blobs / f.sha256.hex(), tmp / f.name)
            write_atomically(tmp / MANIFEST_NAME, body)
            os.replace(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        fsync_directory(self._models)
        self._manifests[sha] = manifest

    def _drop(self, sha: str) -> None:
        """Remove one model (under the lock): its directory vanishes at once (renamed aside),
        then the index forgets it, then blobs nothing else uses (nor a pending commit) go."""
        gone = self._models / f".gone-{sha[:16]}-{secrets.token_hex(4)}"
        with contextlib.suppress(FileNotFoundError):
            os.replace(self._models / sha, gone)
            fsync_directory(self._models)
        self._save(without(self._index, sha))
        manifest = self._manifests.pop(sha)
        shutil.rmtree(gone, ignore_errors=True)
        deleted = False
        for blob, size in blob_sizes(manifest).items():
            if self._is_referenced(blob):
                continue
            if blob in self._pending:
                self._loose[blob] = size
                continue
            with contextlib.suppress(FileNotFoundError):
                (self._blobs / blob).unlink()
                deleted = True
        if deleted:
            fsync_directory(self._blobs)

    def _copy_missing(
        self, src: Path, stage: Path, manifest: Manifest, progress: Progress | None
    ) -> None:
        todo = [f for f in manifest.files if not self.has_blob(f.sha256.hex())]
        total = sum(f.size for f in todo)
        done = 0
        for f in todo:
            expected = f.sha256.hex()

            def report(n: int, base: int = done) -> None:
                if progress is not None:
                    progress(base + n, total)

            got = copy_hashing(src / f.name, stage / f.name, report)
            if got != expected:
                raise ManifestInvalid(f"{src / f.name} changed while it was imported")
            self.add_verified_file(stage / f.name, expected)
            done += f.size
        with self._lock:
            for f in manifest.files:
                if self.has_blob(f.sha256.hex()):
                    self._pending.add(f.sha256.hex())
