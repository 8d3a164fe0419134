"""Fetch a model's weights from the nodes holding it: the pieces one shard needs
(:func:`fetch_model`), or the whole model into the node's model store (:func:`fetch_whole`).

:func:`fetch_model` returns the directory a runner loads the shard from:

* the demo model: generated here (no transfer);
* a model whose manifest hash the node's store (:class:`~skulk.store.ModelStore`) holds: the
  store's directory (no transfer);
* a model in a local directory (:class:`~skulk.wire.cluster.PathSource`), on a node the card
  lists as a holder, whose files hash to the card's manifest: that directory (another node
  seeing the same path fetches all the same);
* otherwise a fetch directory, into which the pieces the shard needs and does not have yet
  are fetched: every small file (config, tokenizer, index) and safetensors header, and the
  tensors :func:`~skulk.models.needed_tensors` names for the shard. A later shard of the same
  model fetches only what is still missing. The fetch directory is the store's staging
  ``peer-<manifest sha256>`` when the node has a store (the same file system: a complete
  model goes into the store by hard links, nothing copied), else
  ``<home>/models/.peer/<model>/`` (:mod:`skulk.transfer._store`).

When a fetch leaves every piece of every file verified in the fetch directory (the shards
fetched so far cover the model), the model goes into the store (:meth:`ModelStore.
adopt_verified`), the fetch directory is discarded, the store's directory is returned and
``on_complete(card)`` tells the caller (which registers the node as a holder).

:func:`fetch_whole` fetches every piece, into the store's staging, and returns the stored
model: how a model spreads over the cluster (each node that completes it becomes a holder).

How pieces are fetched (batches, several at once from several holders, verification, retries,
resumption) is :mod:`skulk.transfer._run`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import trio

from skulk.models import (
    LocalManifest,
    ManifestInvalid,
    ShardSlice,
    ensure_demo_model,
    local_manifest,
    needed_tensors,
)
from skulk.store import ModelStore, StoredModel
from skulk.wire.cluster import DemoSource, ModelCard, PathSource
from skulk.wire.transfer import Manifest

from ._client import WeightClient
from ._errors import DiskFull, NoManifest
from ._run import FetchPolicy, FetchRun, FileProgress, Progress, Select
from ._store import FULL_ERRNOS, Piece, pieces_of, store_directory

log = logging.getLogger("skulk.transfer")

#: The prefix of the store staging directories fetches from peers use (then the manifest hash).
STAGING_PREFIX = "peer-"


async def fetch_model(
    client: WeightClient,
    card: ModelCard,
    shard: ShardSlice,
    home: Path,
    *,
    holders: Sequence[str] | None = None,
    progress: Progress | None = None,
    policy: FetchPolicy = FetchPolicy(),  # noqa: B008 - frozen
    store: ModelStore | None = None,
    on_complete: Callable[[ModelCard], None] | None = None,
) -> Path:
    """The directory the runner of ``shard`` loads ``card``'s model from, after fetching what
    it lacks (see the module doc). ``holders``: the nodes to ask, in order (default: the
    card's holders but this node). ``progress(done, total)`` is called first with what the
    fetch directory already holds, then as bytes land, last with ``(total, total)``; not at
    all when the model is used where it is (the store, a local directory, the demo model).
    ``on_complete(card)`` is called once this fetch put the whole model into ``store``.

    Raises :class:`NoHolderReachable`, :class:`ManifestMismatch`, :class:`NoManifest`,
    :class:`DiskFull` (all :class:`FetchError`\\ s); ``OSError`` for other file-system
    failures under ``home`` or the store."""
    source = card.source
    if isinstance(source, DemoSource):
        return await trio.to_thread.run_sync(ensure_demo_model, home, source.seed)
    expected = card.manifest_sha256
    local = Path(source.path) if isinstance(source, PathSource) else None
    if expected is None:
        if local is not None and await trio.to_thread.run_sync(_is_model_dir, local):
            return local
        where = f" ({local})" if local is not None else ""
        raise NoManifest(card.id, f"model {card.id} is not on this node{where} and has no manifest")
    if store is not None and (stored := await _stored(store, expected, touch=True)):
        return stored.directory
    # The card's path is used in place only on a node the State lists as a holder: another
    # node may see a directory at that path (a shared file system, nodes on one machine), but
    # only the holders vouched for it; everyone else fetches (and verifies) its share.
    if local is not None and client.node_id in card.holders:
        if await _have_locally(local, expected, home):
            return local
    run = await _fetch(
        client, card, expected, home, store, holders, policy, _shard_pieces(shard), progress, None
    )
    if run.stored is None:
        return run.directory
    if on_complete is not None:
        on_complete(card)
    return run.stored.directory


async def fetch_whole(
    client: WeightClient,
    card: ModelCard,
    home: Path,
    store: ModelStore,
    *,
    holders: Sequence[str] | None = None,
    progress: FileProgress | None = None,
    policy: FetchPolicy = FetchPolicy(),  # noqa: B008 - frozen
) -> StoredModel:
    """Every file of ``card``'s model from its holders into ``store``; the stored model (at
    once, moving no byte, when the store holds it already). ``holders``: the nodes to ask, in
    order (default: the card's holders but this node); with several, batches come from all of
    them at once. ``progress(done, total, file, file_done, file_total)`` as bytes land. Resumes
    what an earlier fetch of the same manifest left in the store's staging (a shard's
    :func:`fetch_model` included). Making room in the store is the caller's part
    (:meth:`ModelStore.ensure_room`). Raises as :func:`fetch_model` does."""
    expected = card.manifest_sha256
    if expected is None:
        raise NoManifest(card.id, f"model {card.id} has no manifest to fetch it by")
    if stored := await _stored(store, expected, touch=False):
        return stored
    run = await _fetch(
        client, card, expected, home, store, holders, policy, _everything, None, progress
    )
    assert run.stored is not None, "a whole-model fetch ends with the model in the store"
    return run.stored


async def _fetch(
    client: WeightClient,
    card: ModelCard,
    expected: str,
    home: Path,
    store: ModelStore | None,
    holders: Sequence[str] | None,
    policy: FetchPolicy,
    select: Select,
    progress: Progress | None,
    file_progress: FileProgress | None,
) -> FetchRun:
    """Run one fetch into the model's fetch directory (one at a time per directory); a model
    it completes goes into ``store`` (``run.stored``: the stored model, also when another
    fetch stored it meanwhile)."""
    if holders is None:
        holders = card.holders
    holders = [h for h in holders if h != client.node_id]
    if store is not None:
        key = STAGING_PREFIX + expected
        directory = await trio.to_thread.run_sync(store.staging, key)
    else:
        directory = store_directory(home, card.id)
    async with client.lock(directory):
        run = FetchRun(
            client, card.id, expected, directory, holders, select, policy, progress, file_progress
        )
        if store is not None:  # a fetch that held the lock before may have stored it
            run.stored = await _stored(store, expected, touch=False)
            if run.stored is not None:
                return run
        client.fetching += 1
        try:
            await run.run()
        except OSError as exc:
            if exc.errno in FULL_ERRNOS:  # the directory's layout, manifest or record
                raise DiskFull(card.id, str(directory), run.missing, -1) from exc
            raise
        finally:
            client.fetching -= 1
        if run.complete and store is not None:
            run.stored = await _adopt(store, card.id, run)
    return run


async def _adopt(store: ModelStore, model: str, run: FetchRun) -> StoredModel:
    """The model ``run`` completed, into the store by hard links; its staging goes."""

    def adopt() -> StoredModel:
        try:
            stored = store.adopt_verified(run.directory, run.manifest_body, (model,))
        except ValueError:  # an id the store takes for no name (a bare sha256): unnamed
            stored = store.adopt_verified(run.directory, run.manifest_body, ())
        store.discard_staging(run.directory.name)
        return stored

    try:
        stored = await trio.to_thread.run_sync(adopt)
    except OSError as exc:
        if exc.errno in FULL_ERRNOS:
            raise DiskFull(model, str(store.root), 0, -1) from exc
        raise
    log.info("transfer: model %s complete, in the store as %s", model, stored.sha256[:16])
    return stored


async def _stored(store: ModelStore, sha: str, *, touch: bool) -> StoredModel | None:
    def find() -> StoredModel | None:
        stored = store.lookup(sha)
        return store.touch(sha) if stored is not None and touch else stored

    return await trio.to_thread.run_sync(find)


def _shard_pieces(shard: ShardSlice) -> Select:
    """Every small file and safetensors header; the tensors the shard needs."""

    def select(manifest: Manifest) -> list[Piece]:
        names = [t.name for entry in manifest.files for t in entry.tensors]
        keep = set(needed_tensors(names, shard))
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

    return select


def _everything(manifest: Manifest) -> list[Piece]:
    return [p for entry in manifest.files for p in pieces_of(entry)]


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
