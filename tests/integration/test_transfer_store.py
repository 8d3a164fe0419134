"""Weights between model stores over real loopback links: a holder serves from its store by
manifest hash, a fetch uses the store when it holds the model and puts a model it completes
into it, :func:`fetch_whole` spreads a whole model, batches come from several holders at once.

The cards here are Hub cards (no path anywhere): the model is only in the holders' stores."""

from __future__ import annotations

import threading
from pathlib import Path

import attrs
import pytest
import trio

from skulk.models import ensure_demo_model, local_manifest
from skulk.models._card import card_from_directory
from skulk.models._generated import write_generated_model
from skulk.models._manifest import LocalManifest
from skulk.store import ModelStore
from skulk.transfer import WeightServer, fetch_model, fetch_whole
from skulk.transfer._fetch import STAGING_PREFIX
from skulk.transfer._run import FetchPolicy
from skulk.wire.cluster import HubSource, ModelCard
from tests.integration.test_transfer import (
    FIRST,
    LAST,
    SHAPE,
    SINGLE,
    WITHIN,
    CorruptServer,
    assert_identical,
    cluster,
    size,
    wanted,
)

POLICY = FetchPolicy(batch_bytes=128 * 1024, initial_backoff=0.05, max_backoff=0.5)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("transfer-store")
    demo = ensure_demo_model(root / "demo-home")
    return write_generated_model(root / "gen", SHAPE, demo, files=3, seed=11)


@pytest.fixture(scope="module")
def manifest(model: Path) -> LocalManifest:
    return local_manifest(model)


@pytest.fixture(scope="module")
def card(model: Path, manifest: LocalManifest) -> ModelCard:
    """A Hub model held by node-a (the State's view)."""
    return card_from_directory(
        "org/gen",
        model,
        HubSource("org/gen", "a" * 40),
        manifest_sha256=manifest.sha256,
        holders=("node-a",),
    )


def stores(tmp_path: Path, *names: str) -> dict[str, ModelStore]:
    return {n: ModelStore(tmp_path / "stores" / n, reserve_bytes=0) for n in names}


def serving_from(store: ModelStore, base: type[WeightServer] = WeightServer) -> type[WeightServer]:
    """A ``WeightServer`` class whose instances serve from ``store``."""

    class Served(base):  # type: ignore[valid-type,misc]
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, store=store, **kwargs)

    return Served


async def test_a_whole_model_goes_from_one_store_to_another_and_is_held_there(
    tmp_path: Path, model: Path, manifest: LocalManifest, card: ModelCard
) -> None:
    s = stores(tmp_path, "node-a", "node-b", "node-c")
    await trio.to_thread.run_sync(s["node-b"].import_directory, model, "org/gen")
    # node-b holds the model in its store but is not (yet) a holder in the State: the store
    # vouches for it; node-a lists as a holder, but has nothing to serve it from.
    servers = {n: serving_from(s[n]) for n in ("node-a", "node-b")}
    async with cluster(
        tmp_path, {"org/gen": card}, holders=("node-a", "node-b"), servers=servers
    ) as nodes:
        c, b = nodes["node-c"], nodes["node-b"]
        seen: list[tuple[int, int, str, int, int]] = []
        with trio.fail_after(WITHIN):
            stored = await fetch_whole(
                c.client,
                card,
                c.home,
                s["node-c"],
                holders=["node-a", "node-b"],
                progress=lambda *a: seen.append(a),
                policy=POLICY,
            )
        total = sum(f.size for f in manifest.manifest.files)
        assert stored.sha256 == manifest.sha256 and "org/gen" in stored.names
        assert_identical(stored.directory, manifest)
        assert s["node-c"].lookup("org/gen") == stored
        assert c.client.bytes_received == b.server.bytes_sent == total
        assert nodes["node-a"].server.statistics().refused >= 1  # not_holder: nothing in store
        # progress: monotone to the total, with per-file figures within each file's size
        dones = [d for d, *_ in seen]
        assert (
            dones == sorted(dones) and dones[-1] == total and all(t == total for _, t, *_ in seen)
        )
        sizes = {f.name: f.size for f in manifest.manifest.files}
        assert all(ft == sizes[f] and 0 <= fd <= ft for *_, f, fd, ft in seen)
        # the staging is gone; the stored files are the fetched ones, linked, not copied
        staging = s["node-c"].root / "staging" / (STAGING_PREFIX + manifest.sha256)
        assert not staging.exists()
        for f in manifest.manifest.files:
            assert (stored.directory / f.name).stat().st_nlink >= 2
        assert s["node-c"].verify(manifest.sha256).ok
        # Held now: a second call moves no byte.
        before = c.client.bytes_received
        with trio.fail_after(WITHIN):
            assert await fetch_whole(c.client, card, c.home, s["node-c"], policy=POLICY) == stored
        assert c.client.bytes_received == before


async def test_a_store_that_holds_the_model_is_used_without_a_transfer(
    tmp_path: Path, model: Path, manifest: LocalManifest, card: ModelCard
) -> None:
    s = stores(tmp_path, "node-c")
    held = await trio.to_thread.run_sync(s["node-c"].import_directory, model, "elsewhere")
    async with cluster(tmp_path, {"org/gen": card}) as nodes:
        c = nodes["node-c"]
        completed: list[ModelCard] = []
        with trio.fail_after(WITHIN):
            out = await fetch_model(
                c.client, card, LAST, c.home, store=s["node-c"], on_complete=completed.append
            )
            assert out == held.directory
            again = await fetch_whole(c.client, card, c.home, s["node-c"])
            assert (again.sha256, again.directory) == (held.sha256, held.directory)
        assert c.client.bytes_received == 0 and not completed
        assert s["node-c"].lookup(manifest.sha256).last_used >= held.last_used  # a use


async def test_shards_that_cover_the_model_put_it_into_the_store(
    tmp_path: Path, model: Path, manifest: LocalManifest, card: ModelCard
) -> None:
    s = stores(tmp_path, "node-a", "node-c")
    await trio.to_thread.run_sync(s["node-a"].import_directory, model, "org/gen")
    servers = {"node-a": serving_from(s["node-a"])}
    async with cluster(tmp_path, {"org/gen": card}, servers=servers) as nodes:
        c = nodes["node-c"]
        completed: list[ModelCard] = []

        async def fetch(shard: object) -> Path:
            with trio.fail_after(WITHIN):
                return await fetch_model(
                    c.client,
                    card,
                    shard,  # type: ignore[arg-type]
                    c.home,
                    store=s["node-c"],
                    on_complete=completed.append,
                    policy=POLICY,
                )

        staging = s["node-c"].root / "staging" / (STAGING_PREFIX + manifest.sha256)
        assert await fetch(LAST) == staging  # a part of the model: not in the store yet
        assert not completed and s["node-c"].lookup(manifest.sha256) is None
        out = await fetch(FIRST)  # the rest: complete, verified, in the store
        stored = s["node-c"].lookup(manifest.sha256)
        assert stored is not None and out == stored.directory and "org/gen" in stored.names
        assert completed == [card] and not staging.exists()
        assert c.client.bytes_received == size(wanted(manifest, SINGLE))
        assert_identical(out, manifest)
        # From now on the store serves: nothing moves.
        assert await fetch(SINGLE) == out
        assert c.client.bytes_received == size(wanted(manifest, SINGLE)) and completed == [card]


class Gate:
    """Opens once ``parties`` different servers have come to it."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.seen: set[int] = set()
        self.lock = threading.Lock()
        self.open = threading.Event()

    def wait(self, who: object) -> None:
        with self.lock:
            self.seen.add(id(who))
            if len(self.seen) >= self.parties:
                self.open.set()
        self.open.wait(timeout=WITHIN / 2)


class GatedServer(WeightServer):
    """Sends no tensor byte until every gated server has been asked for some: a fetch that
    asks one holder at a time waits here until the gate gives up."""

    gate: Gate

    def read_range(self, path: Path, start: int, end: int) -> bytes:
        if path.name.endswith(".safetensors"):
            self.gate.wait(self)
        return super().read_range(path, start, end)


async def test_batches_come_from_several_holders_at_once(
    tmp_path: Path, model: Path, manifest: LocalManifest, card: ModelCard
) -> None:
    s = stores(tmp_path, "node-a", "node-b", "node-c")
    for n in ("node-a", "node-b"):
        await trio.to_thread.run_sync(s[n].import_directory, model, "org/gen")
    gate = Gate(2)
    servers = {}
    for n in ("node-a", "node-b"):
        servers[n] = type(f"Gated-{n}", (serving_from(s[n], GatedServer),), {"gate": gate})
    both = attrs.evolve(card, holders=("node-a", "node-b"))
    async with cluster(
        tmp_path, {"org/gen": both}, holders=("node-a", "node-b"), servers=servers
    ) as nodes:
        c, a, b = nodes["node-c"], nodes["node-a"], nodes["node-b"]
        with trio.fail_after(WITHIN):
            stored = await fetch_whole(c.client, both, c.home, s["node-c"], policy=POLICY)
        assert gate.open.is_set()  # both were asked at once
        total = sum(f.size for f in manifest.manifest.files)
        assert a.server.bytes_sent > 0 and b.server.bytes_sent > 0
        assert a.server.bytes_sent + b.server.bytes_sent == c.client.bytes_received == total
        assert_identical(stored.directory, manifest)


async def test_a_corrupt_and_an_unreachable_holder_among_several(
    tmp_path: Path, model: Path, manifest: LocalManifest, card: ModelCard
) -> None:
    s = stores(tmp_path, "node-a", "node-b", "node-c")
    for n in ("node-a", "node-b"):
        await trio.to_thread.run_sync(s[n].import_directory, model, "org/gen")
    servers = {
        "node-a": serving_from(s["node-a"]),
        "node-b": serving_from(s["node-b"], CorruptServer),
    }
    held = attrs.evolve(card, holders=("node-a", "node-b", "node-gone"))
    async with cluster(
        tmp_path, {"org/gen": held}, holders=("node-a", "node-b"), servers=servers
    ) as nodes:
        c, a, b = nodes["node-c"], nodes["node-a"], nodes["node-b"]
        with trio.fail_after(WITHIN):
            stored = await fetch_whole(
                c.client,
                held,
                c.home,
                s["node-c"],
                holders=["node-b", "node-gone", "node-a"],
                policy=POLICY,
            )
        assert c.client.pieces_corrupt >= 1 and b.server.bytes_sent > 0
        assert_identical(stored.directory, manifest)
        assert s["node-c"].verify(manifest.sha256).ok  # no corrupt byte was stored
        assert a.server.bytes_sent > 0


async def test_a_whole_model_fetch_cut_midway_resumes_where_it_stopped(
    tmp_path: Path, model: Path, manifest: LocalManifest, card: ModelCard
) -> None:
    s = stores(tmp_path, "node-a", "node-c")
    await trio.to_thread.run_sync(s["node-a"].import_directory, model, "org/gen")
    total = sum(f.size for f in manifest.manifest.files)
    largest = max(p.size for p in wanted(manifest, SINGLE))
    async with cluster(
        tmp_path, {"org/gen": card}, servers={"node-a": serving_from(s["node-a"])}
    ) as nodes:
        c = nodes["node-c"]
        with trio.CancelScope() as scope:

            def cut(done: int, of: int, *_: object) -> None:
                if done > of // 2:
                    scope.cancel()  # the node stops mid-fetch

            await fetch_whole(c.client, card, c.home, s["node-c"], progress=cut, policy=POLICY)
        assert scope.cancelled_caught and s["node-c"].lookup(manifest.sha256) is None
        first = c.client.bytes_received
        assert 0 < first < total
        # A restart: the store opened again, a new fetch picks up the staging's record.
        again = ModelStore(s["node-c"].root, reserve_bytes=0)
        seen: list[int] = []
        with trio.fail_after(WITHIN):
            stored = await fetch_whole(
                c.client, card, c.home, again, progress=lambda d, *_: seen.append(d), policy=POLICY
            )
        second = c.client.bytes_received - first
        assert seen[0] >= first - largest  # it started from what was recorded
        assert second < total and first + second <= total + largest
        assert_identical(stored.directory, manifest)
        assert again.verify(manifest.sha256).ok
