"""A node's model duties against a State it is handed: it runs the Hub downloads the State
gives it (and only those), commits the card or the typed failure, spreads Hub models from
their holders in waves, and imports model directories into its store by content."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from skulk.cluster import State
from skulk.cluster._state import Node
from skulk.hub import DownloadCancelled, DownloadProgress, HubRef, HubUnreachable
from skulk.models import ModelShape, ensure_demo_model, local_manifest, write_generated_model
from skulk.store import ModelStore, StoredModel, StoreFull
from skulk.telemetry import TransferBoard
from skulk.wire.cluster import (
    Applied,
    ClusterCommand,
    ClusterResult,
    Download,
    DownloadFailed,
    HubSource,
    ImportedSource,
    ModelCard,
    RegisterModel,
    ReleaseModel,
)
from skulk.worker import ModelDuties, SpreadProgress, failure_of, local_card, store_reading

COMMIT = "c" * 40


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("duties")
    demo = ensure_demo_model(root / "demo-home")
    return write_generated_model(root / "tiny", ModelShape(layers=2), demo, files=1, seed=5)


class FakeControl:
    """The applied State, changed by the test; commands are recorded and applied."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.applied = 0
        self.commands: list[ClusterCommand] = []
        self._changed = trio.Event()
        self._submitted = trio.Event()

    def set(self, state: State) -> None:
        self.state = state
        self.applied += 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_change(self, seen: int) -> None:
        while self.applied == seen:
            await self._changed.wait()

    async def submit(self, command: ClusterCommand) -> ClusterResult:
        self.commands.append(command)
        self._submitted.set()
        return Applied()

    async def wait_commands(self, n: int = 1) -> None:
        """Wait until ``n`` commands were submitted."""
        while len(self.commands) < n:
            self._submitted = trio.Event()
            await self._submitted.wait()


def nodes(*ids: str) -> tuple[Node, ...]:
    return tuple(Node(i, "", "", "up", 0) for i in sorted(ids))


def download(node: str = "me", model: str = "org/tiny") -> Download:
    return Download(model, "org/tiny", COMMIT, node, 1000, "downloading", 0)


def duties(
    control: FakeControl,
    store: ModelStore,
    *,
    pull: Any = None,
    fetch: Any = None,
    node: str = "me",
    wave_grace: float = 30.0,
) -> ModelDuties:
    async def no_fetch(card: ModelCard, holders: Sequence[str], p: SpreadProgress) -> StoredModel:
        raise AssertionError("no spread expected")

    def no_pull(*args: object, **kwargs: object) -> StoredModel:
        raise AssertionError("no pull expected")

    return ModelDuties(
        node,
        control,
        store,
        TransferBoard(),
        fetch or no_fetch,
        lambda: 1234,
        pull=pull or no_pull,
        wave_grace=wave_grace,
    )


async def test_a_download_given_to_this_node_is_pulled_and_its_card_committed(
    tmp_path: Path, model_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    control = FakeControl(State(nodes=nodes("me", "other"), downloads=(download(),)))
    seen: dict[str, Any] = {}

    def pull(ref: HubRef, into: ModelStore, **kwargs: Any) -> StoredModel:
        seen["ref"], seen["store"] = ref, into
        kwargs["progress"](DownloadProgress("org/tiny", "model.safetensors", 5, 10, 5, 10, 1, 5))
        return into.import_directory(model_dir, "org/tiny@" + COMMIT)

    worker = duties(control, store, pull=pull)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await control.wait_commands()
        nursery.cancel_scope.cancel()
    assert seen["ref"] == HubRef("org/tiny", COMMIT) and seen["store"] is store
    (command,) = control.commands
    assert isinstance(command, RegisterModel)
    card = command.card
    assert card.id == "org/tiny" and card.source == HubSource("org/tiny", COMMIT)
    assert card.holders == ("me",)
    assert card.manifest_sha256 == local_manifest(model_dir).sha256
    assert worker.board.snapshot() == ()  # the transfer is over


async def test_a_failed_download_is_committed_with_its_typed_reason(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    control = FakeControl(State(nodes=nodes("me"), downloads=(download(),)))

    def pull(ref: HubRef, into: ModelStore, **kwargs: Any) -> StoredModel:
        raise HubUnreachable("org/tiny", "http://hub", 4, "connection refused")

    worker = duties(control, store, pull=pull)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await control.wait_commands()
        nursery.cancel_scope.cancel()
    (command,) = control.commands
    assert isinstance(command, DownloadFailed)
    assert (command.model, command.node, command.reason, command.at) == (
        "org/tiny", "me", "hub_unreachable", 1234,
    )  # fmt: skip


async def test_downloads_of_other_nodes_are_not_run_and_a_withdrawn_one_is_cancelled(
    tmp_path: Path,
) -> None:
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    control = FakeControl(State(nodes=nodes("me", "other"), downloads=(download("other"),)))
    started, stopped = threading.Event(), threading.Event()

    def pull(ref: HubRef, into: ModelStore, **kwargs: Any) -> StoredModel:
        started.set()
        while not kwargs["cancel_check"]():
            threading.Event().wait(0.01)
        stopped.set()
        raise DownloadCancelled("org/tiny")

    worker = duties(control, store, pull=pull)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(0.3)
        assert not started.is_set()  # another node's download
        control.set(State(nodes=nodes("me", "other"), downloads=(download("me"),)))
        assert await trio.to_thread.run_sync(started.wait, 10)
        assert [t.model for t in worker.board.snapshot()] == ["org/tiny"]
        control.set(State(nodes=nodes("me", "other")))  # re-placed elsewhere
        assert await trio.to_thread.run_sync(stopped.wait, 10)
        nursery.cancel_scope.cancel()
    assert control.commands == []  # a cancelled download is no failure
    assert worker.board.snapshot() == ()


def hub_card(model_dir: Path, holders: tuple[str, ...]) -> ModelCard:
    from skulk.models import card_from_directory

    sha = local_manifest(model_dir).sha256
    return card_from_directory(
        "org/tiny", model_dir, HubSource("org/tiny", COMMIT), manifest_sha256=sha, holders=holders
    )


async def test_spreading_goes_in_waves_from_the_holders(
    tmp_path: Path, model_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    card = hub_card(model_dir, ("a",))
    state = State(nodes=nodes("a", "b", "c", "d"), models=(card,))
    asked: dict[str, list[str]] = {}

    def fetcher(node: str, store: ModelStore) -> Any:
        async def fetch(c: ModelCard, holders: Sequence[str], p: SpreadProgress) -> StoredModel:
            asked[node] = list(holders)
            p(1, 2, "model.safetensors", 1, 2)
            return await trio.to_thread.run_sync(store.import_directory, model_dir, c.id)

        return fetch

    controls = {n: FakeControl(state) for n in "bcd"}
    workers = {
        n: duties(controls[n], ModelStore(tmp_path / n, reserve_bytes=0), node=n, wave_grace=1e9)
        for n in "bcd"
    }
    for n, w in workers.items():
        w._fetch_whole = fetcher(n, w.store)
    async with trio.open_nursery() as nursery:
        for w in workers.values():
            await nursery.start(w.run)
        await controls["b"].wait_commands()
        # b is first in the wave; c and d wait for more holders (or the grace).
        assert list(asked) == ["b"] and asked["b"] == ["a"]
        (command,) = controls["b"].commands
        assert isinstance(command, RegisterModel) and command.card.holders == ("b",)
        assert attrs.evolve(command.card, holders=card.holders) == card  # holders merge
        two = State(nodes=state.nodes, models=(attrs.evolve(card, holders=("a", "b")),))
        for n in "cd":
            controls[n].set(two)
        await controls["c"].wait_commands()
        await controls["d"].wait_commands()
        # The second wave: two fetches, one from each holder.
        assert asked["c"] == ["a", "b"] and asked["d"] == ["b", "a"]
        nursery.cancel_scope.cancel()


async def test_a_node_left_out_of_the_waves_fetches_after_the_grace_and_retries_failures(
    tmp_path: Path, model_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    card = hub_card(model_dir, ("a",))
    control = FakeControl(State(nodes=nodes("a", "b", "c"), models=(card,)))
    tries: list[float] = []
    store = ModelStore(tmp_path / "c", reserve_bytes=0)

    async def fetch(c: ModelCard, holders: Sequence[str], p: SpreadProgress) -> StoredModel:
        tries.append(trio.current_time())
        if len(tries) < 3:
            raise ConnectionError("holder went away")
        return await trio.to_thread.run_sync(store.import_directory, model_dir, c.id)

    worker = duties(control, store, fetch=fetch, node="c", wave_grace=20)
    async with trio.open_nursery() as nursery:
        start = trio.current_time()
        await nursery.start(worker.run)
        await control.wait_commands()
        nursery.cancel_scope.cancel()
    assert tries[0] - start >= 20  # b's wave first: c waited for the grace
    assert tries[1] - tries[0] >= 5 and tries[2] - tries[1] >= 10  # backing off, doubling
    assert worker.spread_failures == {}


def test_a_model_directory_is_imported_by_content_and_named_by_its_manifest(
    tmp_path: Path, model_dir: Path
) -> None:
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    card = local_card(str(model_dir), tmp_path / "home", "me", store)
    assert card.id == model_dir.name
    assert card.source == ImportedSource(str(model_dir))
    assert card.holders == ("me",)
    stored = store.lookup(card.id)
    assert stored is not None and stored.sha256 == card.manifest_sha256
    assert stored.directory != model_dir  # the store's copy: peers fetch it by hash
    reading = store_reading(store)
    assert [m.sha256 for m in reading.models] == [card.manifest_sha256]
    assert reading.used_bytes == stored.size
    small = ModelStore(tmp_path / "small", budget_bytes=1000, reserve_bytes=0)
    with pytest.raises(StoreFull):
        local_card(str(model_dir), tmp_path / "home", "me", small)
    assert failure_of(StoreFull(10, 1, 0, limit="budget"))[0] == "disk_full"


async def test_a_model_gone_from_the_store_is_released(
    tmp_path: Path, model_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    card = local_card(str(model_dir), tmp_path / "home", "me", store)
    control = FakeControl(State(nodes=nodes("me"), models=(card,)))
    worker = duties(control, store)
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.sleep(10)
        assert control.commands == []  # held: nothing to say
        await trio.to_thread.run_sync(store.remove, card.id)
        await control.wait_commands()
        nursery.cancel_scope.cancel()
    assert control.commands == [ReleaseModel(card.id, "me")]


async def test_a_removed_model_is_not_spread_back_until_this_node_needs_it(
    tmp_path: Path, model_dir: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Removed from the store while a peer still holds it: released, and declined — the waves
    do not fetch it back (also after a restart, the decline is kept on disk) — until this node
    holds it again because it needs it (an instance's fetch), which ends the decline."""
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    declined = tmp_path / "declined-models.json"
    held = hub_card(model_dir, ("a", "me"))
    await trio.to_thread.run_sync(store.import_directory, model_dir, held.id)
    control = FakeControl(State(nodes=nodes("a", "me"), models=(held,)))
    fetched: list[str] = []

    async def fetch(c: ModelCard, holders: Sequence[str], p: SpreadProgress) -> StoredModel:
        fetched.append(c.id)
        return await trio.to_thread.run_sync(store.import_directory, model_dir, c.id)

    worker = duties(control, store, fetch=fetch, wave_grace=0)
    worker._declined_file = declined
    async with trio.open_nursery() as nursery:
        await nursery.start(worker.run)
        await trio.to_thread.run_sync(store.remove, held.id)
        await control.wait_commands()
        assert control.commands == [ReleaseModel(held.id, "me")]
        control.set(State(nodes=control.state.nodes, models=(hub_card(model_dir, ("a",)),)))
        await trio.sleep(120)  # many waves and store samples
        assert fetched == [] and len(control.commands) == 1
        nursery.cancel_scope.cancel()
    assert worker.declined == {held.manifest_sha256}
    restarted = ModelDuties(
        "me", control, store, TransferBoard(), fetch, lambda: 1, wave_grace=0, declined=declined
    )
    assert restarted.declined == {held.manifest_sha256}
    async with trio.open_nursery() as nursery:
        await nursery.start(restarted.run)
        await trio.sleep(60)
        assert fetched == []
        await restarted.hold(hub_card(model_dir, ("me",)))  # an instance here fetched it
        nursery.cancel_scope.cancel()
    assert restarted.declined == set()
    assert isinstance(control.commands[-1], RegisterModel)
    assert ModelDuties("me", control, store, TransferBoard(), fetch, lambda: 1,
                       declined=declined).declined == set()  # fmt: skip
