"""A Hub model into this node's store: :func:`pull` joins :func:`~skulk.hub.check`, the
store's room, :func:`~skulk.hub.download` and the store's commit.

In order, and before any weight byte moves: the plan (typed :class:`HubError` for a repo that
does not exist, is gated, or holds no model mlx-lm loads); a model the store already holds
under the plan's pinned name (``org/repo@<commit>``) is only touched; a complete snapshot in the
local Hub cache is imported (copied by content, no download); otherwise the bytes the store
lacks are checked against its budget and the disk (:class:`~skulk.store.StoreFull`, reason
``disk_full``, with nothing evicted when no room can be made, and no byte downloaded), then the
files are downloaded into ``staging/<commit>`` (resumable: a cut pull picks up where it
stopped) and committed, checked against the hashes the download verified. A disk that fills
during the download makes the store check its room again (``disk_full`` when it cannot make
more), then the download resumes once; a disk still full is ``disk_full`` too. The staging
directory is kept for the next attempt.

Blocking: run it in a worker thread.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from skulk.hub._calls import DEFAULT_POLICY, HubPolicy
from skulk.hub._download import download
from skulk.hub._plan import HubPlan, check
from skulk.hub._progress import ProgressCallback
from skulk.hub._ref import HubRef, parse_hub_ref
from skulk.store import MANIFEST_NAME, ModelStore, StoredModel, StoreFull

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


def pull_names(plan: HubPlan) -> tuple[str, ...]:
    """The store names of a pulled model: pinned to its commit, the repo alone, and the
    revision asked for (``org/repo@main``) when one was."""
    names = [plan.name, plan.ref.repo]
    if plan.ref.revision is not None:
        names.append(f"{plan.ref.repo}@{plan.ref.revision}")
    return tuple(dict.fromkeys(names))


def pull(
    ref: HubRef | str,
    store: ModelStore,
    *,
    token: str | None = None,
    offline: bool | None = None,
    in_use: Callable[[], set[str]] = set,
    progress: ProgressCallback | None = None,
    policy: HubPolicy = DEFAULT_POLICY,
    cancel_check: Callable[[], bool] | None = None,
) -> StoredModel:
    """The stored model ``ref`` names, pulled into ``store`` when it is not there yet (see the
    module doc). ``in_use``: the manifest hashes eviction must spare. ``cancel_check``: polled
    as bytes arrive; when it answers true the download stops with
    :class:`~skulk.hub.DownloadCancelled` (what arrived stays in staging, for the next pull to
    resume). Raises :class:`~skulk.hub.HubError` subclasses and
    :class:`~skulk.store.StoreFull`."""
    if isinstance(ref, str):
        ref = parse_hub_ref(ref)
    plan = check(ref, token, offline=offline, policy=policy)
    names = pull_names(plan)
    held = store.lookup(plan.name)
    if held is not None:
        return _named(store, held, names)  # committed again: the names, and a use
    if plan.cached_snapshot is not None:
        store.ensure_room(plan.total_bytes, in_use())
        model = store.import_directory(plan.cached_snapshot, plan.name)
        return _named(store, model, names)
    missing = sum(f.size for f in plan.files if not (f.sha256 and store.has_blob(f.sha256)))
    key = plan.commit
    for retry in (False, True):
        store.ensure_room(missing, in_use())  # StoreFull, nothing evicted, when it cannot fit
        try:
            hashes = download(
                plan,
                store.staging(key),
                progress,
                cancel_check,
                token=token,
                policy=policy,
            )
        except OSError as exc:
            if exc.errno not in _FULL_ERRNOS:
                raise
            if retry:  # room was made on the store's books, yet the disk is full
                limit = "the disk filled during the download: files outside the store took it"
                raise StoreFull(missing, store.available_bytes(), 0, limit=limit) from exc
            continue  # the store evicts what it can, then the download resumes from staging
        break
    return store.commit_staging(key, names, expected=hashes)


def _named(store: ModelStore, model: StoredModel, names: tuple[str, ...]) -> StoredModel:
    body = (model.directory / MANIFEST_NAME).read_bytes()
    return store.commit(body, names)
