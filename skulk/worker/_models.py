"""This node's model duties: the Hub downloads the State gives it, and spreading Hub models
onto it from their holders, so every node that completes a model becomes a holder.

:class:`ModelDuties` watches the applied State (like the :class:`~skulk.worker.Reconciler`):

* **Downloads.** For every :class:`~skulk.wire.cluster.Download` of this node in status
  ``downloading`` it runs :func:`skulk.hub.pull` in a worker thread (resumable, verified,
  within the store's budget), with its progress on the :class:`~skulk.telemetry.TransferBoard`
  (source ``hub``). Done, it commits the model's card (:class:`~skulk.wire.cluster.HubSource`,
  the stored manifest's hash, this node its holder) with ``RegisterModel``; a terminal failure
  (a :class:`~skulk.hub.HubError`, :class:`~skulk.store.StoreFull`, a model that is not one)
  commits ``DownloadFailed`` with its typed reason, and the leader re-places the download. A
  download the State no longer gives this node is cancelled (its bytes stay in staging, for a
  resume).
* **Spreading.** A card of a Hub model this node does not hold is fetched whole from its
  holders (``fetch_whole``, over the cluster's links: the Hub is never asked again), then this
  node commits itself as a holder. So fan-out is a tree, not a star: the up nodes lacking the
  model are ordered by id, and the k-th starts once the model has more than k holders, asking
  holder ``k mod holders`` first (each holder serves about one fetch per wave), or after
  :data:`WAVE_GRACE_S` seconds whatever the count (a node that cannot take the model never
  holds the others back). A failed spread is retried after a back-off (doubling from
  :data:`RETRY_INITIAL_S` to :data:`RETRY_MAX_S`), shown in the log and the board meanwhile.

It also samples the store for the node's readings (:meth:`ModelDuties.store_reading`),
in a worker thread every :data:`STORE_SAMPLE_S` seconds, so a telemetry sample never touches
the disk; a model the State lists this node as a holder of and its store no longer has
(evicted within the budget, removed with ``DELETE /v1/store/{model}``) is released
(``ReleaseModel``), so no peer asks this node for it.

**A model gone from the store stays gone.** What the store lost that way (by manifest hash) is
*declined*: it is not spread back onto this node — else a removal would be undone by the next
wave, and an eviction would thrash. It comes back only when this node needs it after all (an
instance placed here fetches it, or the leader has it download a pull here), which ends the
decline. The declined hashes are kept in ``declined`` (a JSON file) across restarts.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Protocol

import attrs
import trio

from skulk.cluster import State
from skulk.hub import DownloadProgress, HubError, HubRef
from skulk.hub import pull as hub_pull
from skulk.models import (
    DEMO_MODEL_ID,
    ManifestInvalid,
    card_from_directory,
    model_card,
    resolve_model,
)
from skulk.store import ModelStore, StoredModel, StoreError
from skulk.telemetry import TransferBoard
from skulk.wire.cluster import (
    ClusterCommand,
    ClusterResult,
    Download,
    DownloadFailed,
    HubSource,
    ImportedSource,
    ModelCard,
    RegisterModel,
    Rejected,
    ReleaseModel,
)
from skulk.wire.telemetry import MAX_STORED, StoredModelReading, StoreReading

log = logging.getLogger("skulk.worker")

#: Seconds a node lacking a model waits for its wave before it fetches anyway.
WAVE_GRACE_S = 30.0
RETRY_INITIAL_S = 5.0
RETRY_MAX_S = 300.0
#: Seconds between two samples of the store for the node's readings.
STORE_SAMPLE_S = 2.0
#: How often the duties look at the State when it does not change (back-offs, the wave grace).
TICK_S = 1.0
_MAX_DETAIL = 300

#: ``progress(done, total, file, file_done, file_total)`` of a whole-model fetch.
SpreadProgress = Callable[[int, int, str, int, int], None]
#: Fetch every file of ``card`` from ``holders`` (in that order of preference) into the store.
FetchWhole = Callable[[ModelCard, Sequence[str], SpreadProgress], Awaitable[StoredModel]]


class ModelControl(Protocol):
    """What the duties need of the cluster (:class:`skulk.control.ClusterControl` is one)."""

    @property
    def state(self) -> State: ...

    @property
    def applied(self) -> int: ...

    async def wait_change(self, seen: int) -> None: ...

    async def submit(self, command: ClusterCommand) -> ClusterResult: ...


@attrs.frozen
class HubAccess:
    """How this node calls the Hub: ``token`` (``HF_TOKEN``), ``offline`` (``None``: as
    ``HF_HUB_OFFLINE`` says)."""

    token: str | None = None
    offline: bool | None = None


class ModelDuties:
    """See the module doc. ``clock_ms`` is the wall clock the commands are stamped with;
    ``pull`` is :func:`skulk.hub.pull` (tests pass their own)."""

    def __init__(
        self,
        node_id: str,
        control: ModelControl,
        store: ModelStore,
        board: TransferBoard,
        fetch_whole: FetchWhole,
        clock_ms: Callable[[], int],
        *,
        hub: HubAccess = HubAccess(),
        pull: Callable[..., StoredModel] = hub_pull,
        wave_grace: float = WAVE_GRACE_S,
        declined: Path | None = None,
    ) -> None:
        self.node_id = node_id
        self._control = control
        self.store = store
        self.board = board
        self._fetch_whole = fetch_whole
        self._clock_ms = clock_ms
        self._hub = hub
        self._pull = pull
        self._wave_grace = wave_grace
        self._tasks: dict[tuple[str, str], trio.CancelScope] = {}
        self._lacking_since: dict[str, float] = {}
        self._retry: dict[str, tuple[float, float]] = {}  # model → (not before, next delay)
        self._store_reading: StoreReading | None = None
        #: Spreads that failed, by model: the last error (shown by tests and logs).
        self.spread_failures: dict[str, str] = {}
        self._declined_file = declined
        #: Manifest hashes gone from this node's store on purpose: not spread back here.
        self.declined: set[str] = _read_declined(declined)

    # ---- what the node publishes ----

    def store_reading(self) -> StoreReading | None:
        """The store as last sampled (``None`` before the first sample)."""
        return self._store_reading

    def in_use(self) -> set[str]:
        """Manifest hashes eviction must spare: models any instance uses, and those coming in."""
        state = self._control.state
        used = {i.model for i in state.instances}
        keep = {c.manifest_sha256 for c in state.models if c.id in used and c.manifest_sha256}
        for kind, model in list(self._tasks):
            card = state.model(model)
            if kind == "peers" and card is not None and card.manifest_sha256:
                keep.add(card.manifest_sha256)
        return keep

    # ---- running ----

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sample_store)
            task_status.started()
            while True:
                seen = self._control.applied
                self._reconcile(self._control.state, nursery)
                with trio.move_on_after(TICK_S):
                    await self._control.wait_change(seen)

    def _reconcile(self, state: State, nursery: trio.Nursery) -> None:
        mine = {
            d.model: d
            for d in state.downloads
            if d.node == self.node_id and d.status == "downloading"
        }
        spreads = self._spreads(state)
        wanted = {card.id for card, _ in spreads}
        for key, scope in list(self._tasks.items()):
            kind, model = key
            if (kind == "hub" and model not in mine) or (kind == "peers" and model not in wanted):
                scope.cancel()
                del self._tasks[key]
        for model, download in mine.items():
            if ("hub", model) not in self._tasks:
                self._start(nursery, ("hub", model), partial(self._download, download))
        for card, holders in spreads:
            if ("peers", card.id) not in self._tasks:
                self._start(nursery, ("peers", card.id), partial(self._spread, card, holders))

    def _start(
        self, nursery: trio.Nursery, key: tuple[str, str], work: Callable[[], Awaitable[None]]
    ) -> None:
        scope = trio.CancelScope()
        self._tasks[key] = scope

        async def task() -> None:
            try:
                with scope:
                    await work()
            finally:
                if self._tasks.get(key) is scope:
                    del self._tasks[key]

        nursery.start_soon(task)

    def _spreads(self, state: State) -> list[tuple[ModelCard, list[str]]]:
        """The Hub models this node should fetch now, each with its holders in the order to
        ask them (the wave rule of the module doc)."""
        me = state.node(self.node_id)
        if me is None or me.status != "up":
            return []
        now = trio.current_time()
        out: list[tuple[ModelCard, list[str]]] = []
        for card in state.models:
            if not isinstance(card.source, HubSource) or card.manifest_sha256 is None:
                continue
            if self.node_id in card.holders or not card.holders:
                self._lacking_since.pop(card.id, None)
                continue
            if card.manifest_sha256 in self.declined:
                continue
            since = self._lacking_since.setdefault(card.id, now)
            not_before, _ = self._retry.get(card.id, (0.0, 0.0))
            if now < not_before:
                continue
            lacking = sorted(
                n.id for n in state.nodes if n.status == "up" and n.id not in card.holders
            )
            k = lacking.index(self.node_id)
            holders = list(card.holders)
            if k >= len(holders) and now - since < self._wave_grace:
                continue
            first = k % len(holders)
            out.append((card, holders[first:] + holders[:first]))
        return out

    # ---- a download from the Hub ----

    async def _download(self, download: Download) -> None:
        model = download.model
        self.board.start(model, "hub", download.total_bytes)
        stop = threading.Event()
        token = trio.lowlevel.current_trio_token()

        def progress(p: DownloadProgress) -> None:
            update = partial(self.board.update, model, p.done, p.total, p.file)
            try:
                trio.from_thread.run_sync(update, p.file_done, p.file_total, trio_token=token)
            except trio.RunFinishedError:
                pass

        def work() -> ModelCard:
            stored = self._pull(
                HubRef(download.repo, download.commit),
                self.store,
                token=self._hub.token,
                offline=self._hub.offline,
                in_use=self.in_use,
                progress=progress,
                cancel_check=stop.is_set,
            )
            return card_from_directory(
                model,
                stored.directory,
                HubSource(download.repo, download.commit),
                manifest_sha256=stored.sha256,
                holders=(self.node_id,),
            )

        try:
            try:
                card = await trio.to_thread.run_sync(work, abandon_on_cancel=True)
            except trio.Cancelled:
                stop.set()  # the thread stops at its next chunk; its bytes stay in staging
                raise
            except (HubError, StoreError, ManifestInvalid, ValueError, OSError) as exc:
                reason, detail = failure_of(exc)
                log.warning("download of %s failed (%s): %s", model, reason, detail)
                failed = DownloadFailed(model, self.node_id, reason, detail, self._clock_ms())
                await self._commit(failed)
                return
        finally:
            self.board.finish(model)
        log.info("downloaded %s from the Hub (%s)", model, card.manifest_sha256)
        await self._accept(card)

    # ---- a spread from the holders ----

    async def _spread(self, card: ModelCard, holders: list[str]) -> None:
        self.board.start(card.id, "peers", card.weight_bytes)

        def progress(done: int, total: int, file: str, file_done: int, file_total: int) -> None:
            self.board.update(card.id, done, total, file, file_done, file_total)

        try:
            try:
                await trio.to_thread.run_sync(self._make_room, card.weight_bytes)
                stored = await self._fetch_whole(card, holders, progress)
            except Exception as exc:  # any failure: shown, and tried again later
                _, delay = self._retry.get(card.id, (0.0, RETRY_INITIAL_S / 2))
                delay = min(RETRY_MAX_S, max(RETRY_INITIAL_S, delay * 2))
                self._retry[card.id] = (trio.current_time() + delay, delay)
                self.spread_failures[card.id] = f"{type(exc).__name__}: {exc}"
                log.warning("fetching %s from %s failed (again in %.0f s): %s",
                            card.id, ", ".join(holders), delay, exc)  # fmt: skip
                return
        finally:
            self.board.finish(card.id)
        self._retry.pop(card.id, None)
        self.spread_failures.pop(card.id, None)
        if stored.sha256 != card.manifest_sha256:  # fetch_whole verifies; never trust blindly
            log.error("fetched %s but stored %s, not its manifest", card.id, stored.sha256)
            return
        log.info("holding %s (fetched from the cluster)", card.id)
        await self._accept(card)

    async def hold(self, card: ModelCard) -> None:
        """This node completed ``card``'s model in its store (a shard's fetch took every
        file): commit it as one more holder."""
        await self._accept(card)

    async def _accept(self, card: ModelCard) -> None:
        """This node holds ``card``'s model now: no longer declined; commit it a holder."""
        if card.manifest_sha256 in self.declined:
            self.declined.discard(card.manifest_sha256)
            await self._save_declined()
        await self._commit(RegisterModel(attrs.evolve(card, holders=(self.node_id,))))

    async def _decline(self, shas: Sequence[str]) -> None:
        if set(shas) - self.declined:
            self.declined.update(shas)
            await self._save_declined()

    async def _save_declined(self) -> None:
        if self._declined_file is not None:
            await trio.to_thread.run_sync(_write_declined, self._declined_file, self.declined)

    def _make_room(self, nbytes: int) -> None:
        self.store.ensure_room(nbytes, self.in_use())

    # ---- common ----

    async def _commit(self, command: ClusterCommand) -> None:
        """Commit ``command``, trying again every second while the cluster cannot commit."""
        while True:
            try:
                result = await self._control.submit(command)
            except Exception as exc:  # ControlUnavailable, a lost leader: try again
                log.debug("cannot commit %s yet: %s", type(command).__name__, exc)
                await trio.sleep(1.0)
                continue
            if isinstance(result, Rejected):
                log.warning("%s refused: %s", type(command).__name__, result.detail)
            return

    async def _sample_store(self) -> None:
        """Sample the store for the readings, and release what this node no longer holds."""
        while True:
            try:
                self._store_reading = await trio.to_thread.run_sync(store_reading, self.store)
                gone = await trio.to_thread.run_sync(self._not_held, self._control.state)
            except OSError as exc:
                log.warning("cannot read the model store: %s", exc)
                gone = []
            state = self._control.state
            cards = [card for model in gone if (card := state.model(model)) is not None]
            await self._decline([c.manifest_sha256 for c in cards if c.manifest_sha256])
            for model in gone:  # evicted, removed or lost: peers must not ask this node
                log.info("no longer holding %s (not fetched back unless needed here)", model)
                await self._commit(ReleaseModel(model, self.node_id))
            await trio.sleep(STORE_SAMPLE_S)

    def _not_held(self, state: State) -> list[str]:
        """Models the State says this node holds that its store does not (blocking)."""
        return [
            card.id
            for card in state.models
            if self.node_id in card.holders
            and isinstance(card.source, HubSource | ImportedSource)
            and card.manifest_sha256 is not None
            and self.store.lookup(card.manifest_sha256) is None
        ]


def _read_declined(path: Path | None) -> set[str]:
    """The declined hashes kept in ``path`` (none when it is missing or unreadable)."""
    if path is None:
        return set()
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        return set()
    except (OSError, ValueError) as exc:
        log.warning("ignoring %s: %s", path, exc)
        return set()
    return {h for h in found if isinstance(h, str)} if isinstance(found, list) else set()


def _write_declined(path: Path, declined: set[str]) -> None:
    partial_path = path.with_name(path.name + ".partial")
    partial_path.write_text(json.dumps(sorted(declined)))
    partial_path.replace(path)  # whole or not at all


def store_reading(store: ModelStore) -> StoreReading:
    """The store now, for the node's readings (blocking: a statvfs and the index)."""
    stats = store.statistics()
    models = tuple(
        StoredModelReading(m.sha256, m.names, m.size, m.last_used)
        for m in store.models()[:MAX_STORED]
    )
    return StoreReading(stats.used_bytes, stats.budget_bytes, stats.available_bytes, models)


def failure_of(exc: BaseException) -> tuple[str, str]:
    """A failed download's typed reason and its detail (cut to 300 characters)."""
    if isinstance(exc, HubError | StoreError):
        reason = exc.reason
    elif isinstance(exc, ManifestInvalid | ValueError):
        reason = "bad_model"
    else:
        reason = "io_error"
    return reason, str(exc)[:_MAX_DETAIL]


def local_card(name_or_path: str, home: Path, node_id: str, store: ModelStore) -> ModelCard:
    """The card of the model ``name_or_path`` resolves to on this node (blocking; slow the
    first time). The demo model is generated (every node makes its own). A model directory is
    imported into ``store`` by content (room made within the budget first: a model larger than
    it is :class:`~skulk.store.StoreFull`); its card names it by manifest hash
    (:class:`~skulk.wire.cluster.ImportedSource`, this node its holder), so peers fetch it from
    this node's store whatever path they would have. Raises
    :class:`~skulk.models.ModelNotFound`, ``ValueError`` for a directory that is not a model."""
    model_id, path = resolve_model(name_or_path, home)
    if model_id == DEMO_MODEL_ID:
        return model_card(name_or_path, home)
    size = sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    if store.lookup(model_id) is None:
        store.ensure_room(size)
    try:
        stored = store.import_directory(path, model_id, manifest_cache=home)
    except ManifestInvalid as exc:
        raise ValueError(f"{path}: {exc}") from None
    return card_from_directory(
        model_id,
        stored.directory,
        ImportedSource(str(path)),
        manifest_sha256=stored.sha256,
        holders=(node_id,),
    )
