"""Weights from peers over real loopback links: in-process meshes, each node a
:class:`WeightServer` and a :class:`WeightClient`, fetching a generated multi-file model.

The fetching node's card names a directory that does not exist on it (``/nonexistent/…``):
the model is only on the holders, as it would be on another machine."""

from __future__ import annotations

import errno
import hashlib
import random
import shutil
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import mlx.core as mx
import pytest
import trio

import skulk.transfer._run as run_module
import skulk.transfer._store as store_module
from skulk.actors import RestartPolicy
from skulk.federation import DataReceiver, LinkConfig, Mesh, RpcFailed
from skulk.models import encode_manifest, ensure_demo_model, local_manifest
from skulk.models._card import card_from_directory
from skulk.models._generated import ModelShape, write_generated_model
from skulk.models._manifest import LocalManifest
from skulk.models._shards import ShardSlice, needed_tensors
from skulk.transfer import (
    TRANSFER_METHODS,
    DiskFull,
    NoHolderReachable,
    WeightClient,
    WeightServer,
    fetch_model,
    is_transfer_stream,
    store_directory,
)
from skulk.transfer._errors import ManifestMismatch, NoManifest, PeerFailure
from skulk.transfer._fetch import FetchPolicy
from skulk.transfer._protocol import (
    MANIFEST_METHOD,
    MAX_RANGES,
    RANGES_METHOD,
    REPLY_CODEC,
    REQUEST_CODEC,
    TransferTimeouts,
)
from skulk.transfer._store import RECORD_NAME, Piece, pieces_of
from skulk.wire.cluster import DemoSource, ModelCard, PathSource
from skulk.wire.transfer import (
    ByteRange,
    Manifest,
    ManifestPart,
    ManifestRequest,
    RangeRequest,
    RangesAccepted,
)
from tests._doubles import SECRET

CONFIG = LinkConfig(
    handshake_timeout=5.0, heartbeat_interval=0.1, liveness_timeout=3.0, close_timeout=0.5
)
RECONNECT = RestartPolicy(initial_backoff=0.05, max_backoff=0.2, jitter=0.0)
TIMEOUTS = TransferTimeouts(call=10.0, header=10.0, idle=20.0, send=20.0)
POLICY = FetchPolicy(batch_bytes=128 * 1024, initial_backoff=0.05, max_backoff=0.5)
CHUNK = 32 * 1024
WITHIN = 60.0  # a whole fetch, on a loaded 2-core machine
SHAPE = ModelShape(layers=4, hidden_size=128, heads=4, kv_heads=2, intermediate_size=256)
LAST = ShardSlice("pipeline", 2, 4, 4)
FIRST = ShardSlice("pipeline", 0, 2, 4)
SINGLE = ShardSlice("single", 0, 4, 4)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("transfer")
    demo = ensure_demo_model(root / "demo-home")
    return write_generated_model(root / "gen", SHAPE, demo, files=3, seed=7)


@pytest.fixture(scope="module")
def manifest(model: Path) -> LocalManifest:
    return local_manifest(model)


@pytest.fixture(scope="module")
def card(model: Path, manifest: LocalManifest) -> ModelCard:
    """The card in every node's State: held by node-a and node-b."""
    return card_from_directory(
        "gen",
        model,
        PathSource(str(model)),
        manifest_sha256=manifest.sha256,
        holders=("node-a", "node-b"),
    )


@pytest.fixture(scope="module")
def remote(card: ModelCard) -> ModelCard:
    """The same card as the fetching node sees it: its directory is not there."""
    return attrs.evolve(card, source=PathSource("/nonexistent/skulk-test/gen"))


def wanted(manifest: LocalManifest, shard: ShardSlice) -> list[Piece]:
    """What a rank needs, by the rule (independently of the fetcher's own selection)."""
    names = [t.name for entry in manifest.manifest.files for t in entry.tensors]
    keep = set(needed_tensors(names, shard))
    out: list[Piece] = []
    for entry in manifest.manifest.files:
        pieces = pieces_of(entry)
        out += pieces[:1]
        out += [p for p, t in zip(pieces[1:], entry.tensors, strict=True) if t.name in keep]
    return out


def size(pieces: Sequence[Piece]) -> int:
    return sum(p.size for p in pieces)


@attrs.define
class Node:
    name: str
    home: Path
    mesh: Mesh
    server: WeightServer
    client: WeightClient
    other_streams: list[bytes] = attrs.Factory(list)


@asynccontextmanager
async def cluster(
    tmp_path: Path,
    cards: Mapping[str, ModelCard],
    *,
    holders: Sequence[str] = ("node-a",),
    servers: Mapping[str, type[WeightServer]] | None = None,
    max_per_peer: int = 2,
) -> AsyncIterator[dict[str, Node]]:
    """The holders (listening) and ``node-c`` (dialing each of them), all linked."""
    nodes: dict[str, Node] = {}
    async with trio.open_nursery() as nursery:
        urls: list[str] = []
        for name in (*holders, "node-c"):
            node = _node(name, tmp_path, cards, urls if name == "node-c" else [], servers or {})
            node.server = (servers or {}).get(name, WeightServer)(
                node.mesh,
                cards.get,
                node.home,
                chunk_size=CHUNK,
                timeouts=TIMEOUTS,
                max_per_peer=max_per_peer,
            )
            nodes[name] = node
            host, port = await nursery.start(node.mesh.run)
            await nursery.start(node.server.run)
            urls.append(f"ws://{host}:{port}")
        c = nodes["node-c"].mesh
        with trio.fail_after(WITHIN):
            while not all(c.link(h) for h in holders):  # noqa: ASYNC110 - polling, deadline
                await trio.sleep(0.01)
        yield nodes
        nursery.cancel_scope.cancel()


def _node(
    name: str,
    tmp_path: Path,
    cards: Mapping[str, ModelCard],
    join: list[str],
    servers: Mapping[str, type[WeightServer]],
) -> Node:
    holder: list[Node] = []

    async def rpc(method: str, body: bytes) -> bytes:
        if method not in TRANSFER_METHODS:
            raise RpcFailed("no_handler", method)
        return await holder[0].server.handle_rpc(method, body)

    async def streams(peer: str, receiver: DataReceiver) -> None:
        if await is_transfer_stream(receiver, timeout=5.0):
            await holder[0].client.handle_stream(peer, receiver)
        else:
            holder[0].other_streams.append(await receiver.receive())

    mesh = Mesh(
        name,
        SECRET,
        listen=("127.0.0.1", 0),
        join=list(join),
        link_config=CONFIG,
        rpc_handler=rpc,
        stream_handler=streams,
        rng=random.Random(name),
        backoff=RECONNECT,
    )
    node = Node(
        name,
        tmp_path / name,
        mesh,
        server=None,  # type: ignore[arg-type]  # set by cluster()
        client=WeightClient(mesh, timeouts=TIMEOUTS),
    )
    holder.append(node)
    return node


def assert_loads_as_original(
    directory: Path, model: Path, manifest: LocalManifest, *shards: ShardSlice
) -> int:
    """Small files are identical; the tensors the shards need equal the originals (mlx);
    tensors no shard needs were not fetched: holes (zeros). Returns how many holes."""
    holes = 0
    names = [t.name for entry in manifest.manifest.files for t in entry.tensors]
    kept = {n for shard in shards for n in needed_tensors(names, shard)}
    for entry in manifest.manifest.files:
        if entry.header_length is None:
            assert (directory / entry.name).read_bytes() == (model / entry.name).read_bytes()
            continue
        assert (directory / entry.name).stat().st_size == entry.size
        fetched = mx.load(str(directory / entry.name))
        original = mx.load(str(model / entry.name))
        assert sorted(fetched) == sorted(original)
        for t in entry.tensors:
            if t.name in kept:
                assert mx.array_equal(fetched[t.name], original[t.name]).item(), t.name
            else:
                holes += 1
                assert not mx.any(fetched[t.name]).item(), f"{t.name} was fetched"
    return holes


def assert_identical(directory: Path, manifest: LocalManifest) -> None:
    for entry in manifest.manifest.files:
        assert hashlib.sha256((directory / entry.name).read_bytes()).digest() == entry.sha256


def monotone_to(seen: list[tuple[int, int]], total: int) -> None:
    assert seen, "no progress reported"
    assert all(t == total for _, t in seen)
    dones = [d for d, _ in seen]
    assert dones == sorted(dones) and dones[-1] == total


# ---- the happy path ----------------------------------------------------------------------------


async def test_a_pipeline_rank_fetches_exactly_its_tensors_and_they_load(
    tmp_path: Path, model: Path, manifest: LocalManifest, card: ModelCard, remote: ModelCard
) -> None:
    last = wanted(manifest, LAST)
    assert 0 < size(last) < manifest.manifest.files[1].size * 3  # a real subset
    async with cluster(tmp_path, {"gen": card}) as nodes:
        c, a = nodes["node-c"], nodes["node-a"]
        seen: list[tuple[int, int]] = []

        async def fetch(shard: ShardSlice) -> Path:
            with trio.fail_after(WITHIN):
                return await fetch_model(
                    c.client, remote, shard, c.home, progress=lambda d, t: seen.append((d, t))
                )

        out = await fetch(LAST)
        assert out == store_directory(c.home, "gen")
        assert c.client.bytes_received == a.server.bytes_sent == size(last)
        monotone_to(seen, size(last))
        assert assert_loads_as_original(out, model, manifest, LAST) > 0

        # The first rank on the same node: only what the last one did not need.
        first = wanted(manifest, FIRST)
        extra = size([p for p in first if p not in last])
        seen.clear()
        assert await fetch(FIRST) == out
        assert c.client.bytes_received == size(last) + extra
        monotone_to(seen, size(first))
        assert seen[0][0] == size(first) - extra  # started from what was there
        assert_loads_as_original(out, model, manifest, LAST, FIRST)

        # Nothing missing: nothing asked, progress says so once.
        seen.clear()
        before = c.client.bytes_received
        await fetch(FIRST)
        assert c.client.bytes_received == before and seen == [(size(first), size(first))]

        # Every tensor: the files are the originals, byte for byte.
        await fetch(SINGLE)
        assert_identical(out, manifest)
        total = size(wanted(manifest, SINGLE))
        assert c.client.bytes_received == total == a.server.bytes_sent
        assert a.server.statistics().refused == 0 and c.client.statistics().pieces_corrupt == 0


async def test_a_model_this_node_has_is_used_in_place(
    tmp_path: Path, model: Path, card: ModelCard
) -> None:
    async with cluster(tmp_path, {"gen": card}) as nodes:
        c = nodes["node-c"]
        with trio.fail_after(WITHIN):
            # A holder uses its own directory in place.
            held = attrs.evolve(card, holders=tuple(sorted({*card.holders, "node-c"})))
            assert await fetch_model(c.client, held, LAST, c.home) == model
            demo = ModelCard("skulk-demo", DemoSource(0), card.architecture, 1, 2048)
            assert await fetch_model(c.client, demo, SINGLE, c.home) == ensure_demo_model(c.home, 0)
            # The same path on this node, but other files: fetched, not used.
            changed = Path(shutil.copytree(model, tmp_path / "changed"))
            (changed / "tokenizer_config.json").write_text("{}")
            here = attrs.evolve(card, source=PathSource(str(changed)))
            assert c.client.bytes_received == 0
            out = await fetch_model(c.client, here, LAST, c.home)
        assert out == store_directory(c.home, "gen") and c.client.bytes_received > 0
        # The card's own path, seen here (one machine, a shared file system), but this node is
        # no holder: fetched all the same, never trusted in place.
        with trio.fail_after(WITHIN):
            before = c.client.bytes_received
            assert await fetch_model(c.client, card, FIRST, c.home) == store_directory(
                c.home, "gen"
            )
        assert c.client.bytes_received > before
        # Not here, and no manifest to fetch it by.
        with pytest.raises(NoManifest, match="no manifest"):
            gone = PathSource("/nonexistent/skulk-test/gen")
            await fetch_model(
                c.client, attrs.evolve(card, source=gone, manifest_sha256=None), LAST, c.home
            )


# ---- lost links, restarts ----------------------------------------------------------------------


async def test_a_cut_link_resumes_from_the_next_holder(
    tmp_path: Path, manifest: LocalManifest, card: ModelCard, remote: ModelCard
) -> None:
    total = size(wanted(manifest, SINGLE))
    largest = max(p.size for p in wanted(manifest, SINGLE))
    async with cluster(tmp_path, {"gen": card}, holders=("node-b", "node-a")) as nodes:
        c, a, b = nodes["node-c"], nodes["node-a"], nodes["node-b"]
        seen: list[tuple[int, int]] = []

        def progress(done: int, of: int) -> None:
            seen.append((done, of))
            if (
                done > of // 4
                and (link := c.mesh.link("node-b")) is not None
                and not a.server.served
            ):
                link.close()  # mid-transfer, from node-b: node-a takes over

        with trio.fail_after(WITHIN):
            out = await fetch_model(
                c.client,
                remote,
                SINGLE,
                c.home,
                holders=["node-b", "node-a"],
                progress=progress,
                policy=POLICY,
            )
        assert b.server.bytes_sent > 0 and a.server.bytes_sent > 0
        # (what node-b had queued when its link went never arrived)
        assert b.server.bytes_sent + a.server.bytes_sent >= c.client.bytes_received
        # Only the piece in flight when the link went is fetched twice.
        assert total <= c.client.bytes_received <= total + largest
        monotone_to(seen, total)
        assert_identical(out, manifest)


async def test_a_cut_link_to_the_only_holder_is_retried_once_it_is_back(
    tmp_path: Path, manifest: LocalManifest, card: ModelCard, remote: ModelCard
) -> None:
    total = size(wanted(manifest, SINGLE))
    largest = max(p.size for p in wanted(manifest, SINGLE))
    async with cluster(tmp_path, {"gen": card}) as nodes:
        c = nodes["node-c"]
        cuts: list[int] = []

        def progress(done: int, of: int) -> None:
            if done > of // 3 and not cuts and (link := c.mesh.link("node-a")) is not None:
                cuts.append(done)
                link.close()  # the dialer brings it back after its backoff

        with trio.fail_after(WITHIN):
            out = await fetch_model(
                c.client, remote, SINGLE, c.home, progress=progress, policy=POLICY
            )
        assert cuts
        assert total <= c.client.bytes_received <= total + largest
        assert_identical(out, manifest)


async def test_a_restarted_fetch_resumes_from_its_record(
    tmp_path: Path, model: Path, manifest: LocalManifest, card: ModelCard, remote: ModelCard
) -> None:
    total = size(wanted(manifest, SINGLE))
    largest = max(p.size for p in wanted(manifest, SINGLE))
    async with cluster(tmp_path, {"gen": card}) as nodes:
        c = nodes["node-c"]
        with trio.CancelScope() as scope:

            def progress(done: int, of: int) -> None:
                if done > of // 2:
                    scope.cancel()  # the node stops mid-fetch

            await fetch_model(c.client, remote, SINGLE, c.home, progress=progress, policy=POLICY)
        assert scope.cancelled_caught
        first = c.client.bytes_received
        assert 0 < first < total
        store = store_directory(c.home, "gen")
        assert (store / RECORD_NAME).is_file()

        # A restart: a new client; one safetensors file lost meanwhile (its pieces go again).
        (store / "model-00001-of-00003.safetensors").unlink()
        c.client = WeightClient(c.mesh, timeouts=TIMEOUTS)
        seen: list[tuple[int, int]] = []
        with trio.fail_after(WITHIN):
            out = await fetch_model(
                c.client, remote, SINGLE, c.home, progress=lambda d, t: seen.append((d, t))
            )
        lost = size([p for p in wanted(manifest, SINGLE) if p.file.startswith("model-00001")])
        assert c.client.bytes_received < total
        assert first + c.client.bytes_received <= total + largest + lost
        assert seen[0][0] > 0  # it started from what the record holds
        monotone_to(seen, total)
        assert_identical(out, manifest)
        assert_loads_as_original(out, model, manifest, SINGLE)


# ---- holders that lie --------------------------------------------------------------------------


class CorruptServer(WeightServer):
    """Flips a byte of every chunk of tensor data it sends."""

    def read_range(self, path: Path, start: int, end: int) -> bytes:
        data = bytearray(super().read_range(path, start, end))
        if path.name.endswith(".safetensors") and end > 4096:
            data[-1] ^= 0xFF
        return bytes(data)


async def test_bytes_that_fail_their_hash_are_never_recorded_and_fetched_elsewhere(
    tmp_path: Path, manifest: LocalManifest, card: ModelCard, remote: ModelCard
) -> None:
    total = size(wanted(manifest, SINGLE))
    async with cluster(
        tmp_path, {"gen": card}, holders=("node-b", "node-a"), servers={"node-b": CorruptServer}
    ) as nodes:
        c, a, b = nodes["node-c"], nodes["node-a"], nodes["node-b"]
        with trio.fail_after(WITHIN):
            out = await fetch_model(
                c.client, remote, SINGLE, c.home, holders=["node-b", "node-a"], policy=POLICY
            )
        assert_identical(out, manifest)
        # node-b was asked nothing after its first bad piece (each of its answers with
        # tensor data has one; one stream per holder at a time), and node-a sent the rest
        assert c.client.pieces_corrupt == POLICY.streams_per_holder == 1
        assert 0 < b.server.bytes_sent < total and a.server.bytes_sent > 0


async def test_a_corrupting_only_holder_fails_the_fetch_with_the_reason(
    tmp_path: Path, model: Path, manifest: LocalManifest, card: ModelCard, remote: ModelCard
) -> None:
    async with cluster(
        tmp_path, {"gen": card}, holders=("node-b",), servers={"node-b": CorruptServer}
    ) as nodes:
        c = nodes["node-c"]
        with trio.fail_after(WITHIN), pytest.raises(NoHolderReachable) as failed:
            await fetch_model(c.client, remote, SINGLE, c.home, holders=["node-b"], policy=POLICY)
        assert "fail their hash" in str(failed.value) and "node-b" in failed.value.tried
        # Nothing bad was recorded: an honest holder completes it, and the result is right.
        honest = attrs.evolve(card, holders=("node-b",))
        nodes["node-b"].server = WeightServer(nodes["node-b"].mesh, {"gen": honest}.get, tmp_path)
    async with cluster(tmp_path / "again", {"gen": card}) as nodes:
        nodes["node-c"].home = tmp_path / "node-c"  # the same store as before
        c = nodes["node-c"]
        with trio.fail_after(WITHIN):
            out = await fetch_model(c.client, remote, SINGLE, c.home, policy=POLICY)
        assert_identical(out, manifest)


class LyingServer(WeightServer):
    """Sends another manifest than the one asked for, as if it were that one."""

    async def handle_rpc(self, method: str, body: bytes) -> bytes:
        if method == MANIFEST_METHOD:
            other = encode_manifest(Manifest(()))
            return REPLY_CODEC.encode(ManifestPart(len(other), other))
        return await super().handle_rpc(method, body)


async def test_a_manifest_that_does_not_hash_to_the_card_is_refused(
    tmp_path: Path, model: Path, card: ModelCard, remote: ModelCard
) -> None:
    wrong = attrs.evolve(remote, manifest_sha256="0" * 64)
    async with cluster(tmp_path, {"gen": card}) as nodes:  # node-b, a holder, is away
        c = nodes["node-c"]
        with trio.fail_after(WITHIN), pytest.raises(ManifestMismatch, match="manifest"):
            await fetch_model(c.client, wrong, SINGLE, c.home, policy=POLICY)
        assert c.client.bytes_received == 0
    # The holder's files changed since its card was made: it refuses to serve them.
    changed = Path(shutil.copytree(model, tmp_path / "changed"))
    (changed / "config.json").write_text("{}")
    stale = attrs.evolve(card, source=PathSource(str(changed)))
    async with cluster(tmp_path / "stale", {"gen": stale}) as nodes:
        c = nodes["node-c"]
        with trio.fail_after(WITHIN), pytest.raises(ManifestMismatch, match="changed"):
            await fetch_model(c.client, remote, SINGLE, c.home, holders=["node-a"], policy=POLICY)
    # A holder that sends other bytes as the manifest.
    async with cluster(tmp_path / "lying", {"gen": card}, servers={"node-a": LyingServer}) as nodes:
        c = nodes["node-c"]
        with trio.fail_after(WITHIN), pytest.raises(ManifestMismatch, match="hashing to"):
            await fetch_model(c.client, remote, SINGLE, c.home, holders=["node-a"], policy=POLICY)
        assert not store_directory(c.home, "gen").exists()


async def test_a_store_of_another_manifest_starts_over(
    tmp_path: Path, manifest: LocalManifest, card: ModelCard, remote: ModelCard
) -> None:
    async with cluster(tmp_path, {"gen": card}) as nodes:
        c = nodes["node-c"]
        store = store_directory(c.home, "gen")
        store.mkdir(parents=True)
        (store / ".skulk-manifest.cbor").write_bytes(encode_manifest(Manifest(())))
        (store / "config.json").write_text("an older version")
        (store / "stale.safetensors").write_bytes(b"old")
        with trio.fail_after(WITHIN):
            out = await fetch_model(c.client, remote, SINGLE, c.home, policy=POLICY)
        assert not (out / "stale.safetensors").exists()
        assert_identical(out, manifest)


# ---- the server's refusals ---------------------------------------------------------------------


async def test_the_server_refuses_what_it_must_not_serve(
    tmp_path: Path, model: Path, manifest: LocalManifest, card: ModelCard
) -> None:
    sha = manifest.sha256
    entry = next(f for f in manifest.manifest.files if f.name.endswith(".safetensors"))
    cards = {
        "gen": card,
        "not-here": attrs.evolve(card, id="not-here", holders=("node-b",)),
        "demo": ModelCard("demo", DemoSource(0), card.architecture, 1, 1, None, ("node-a",)),
    }
    async with cluster(tmp_path, cards) as nodes:
        c, a = nodes["node-c"], nodes["node-a"]
        link = c.mesh.link("node-a")
        assert link is not None

        async def refused(method: str, request: object) -> str:
            body = request if isinstance(request, bytes) else REQUEST_CODEC.encode(request)  # type: ignore[arg-type]
            with pytest.raises(RpcFailed) as failed:
                await link.call(method, body, timeout=WITHIN)
            return failed.value.reason

        def ranges(file: str, *spans: tuple[int, int], model: str = "gen") -> RangeRequest:
            return RangeRequest("r", model, sha, file, tuple(ByteRange(s, e) for s, e in spans))

        assert await refused(MANIFEST_METHOD, ManifestRequest("nope", sha, 0)) == "unknown_model"
        assert await refused(MANIFEST_METHOD, ManifestRequest("not-here", sha, 0)) == "not_holder"
        assert await refused(MANIFEST_METHOD, ManifestRequest("demo", sha, 0)) == "no_manifest"
        assert await refused(MANIFEST_METHOD, ManifestRequest("gen", "f" * 64, 0)) == (
            "manifest_mismatch"
        )
        assert await refused(MANIFEST_METHOD, ManifestRequest("gen", sha, 10**9)) == "bad_request"
        assert await refused(MANIFEST_METHOD, b"\xa1junk") == "bad_request"
        assert await refused(RANGES_METHOD, ManifestRequest("gen", sha, 0)) == "bad_request"
        for name in ("../gen/config.json", "README.md", ".skulk-fetch.cbor", "/etc/passwd"):
            assert await refused(RANGES_METHOD, ranges(name, (0, 1))) == "unknown_file"
        assert await refused(RANGES_METHOD, ranges("config.json", (0, 1), model="nope")) == (
            "unknown_model"
        )
        n = entry.size
        for spans in (
            (),
            ((0, n + 1),),
            ((n, n + 1),),
            ((10, 5),),
            ((5, 5),),
            ((0, 10), (5, 20)),
            ((10, 20), (0, 5)),
            tuple((i, i + 1) for i in range(MAX_RANGES + 1)),
        ):
            assert await refused(RANGES_METHOD, ranges(entry.name, *spans)) == "bad_range"
        assert a.server.statistics().served == 0

        # Allowed: any ranges inside a file the manifest names.
        answer = await link.call(
            RANGES_METHOD, REQUEST_CODEC.encode(ranges(entry.name, (0, 8), (n - 4, n))), WITHIN
        )
        assert REPLY_CODEC.decode(answer) == RangesAccepted("r", 12)


async def test_a_request_for_a_card_the_holder_has_not_applied_yet_waits_for_it(
    tmp_path: Path, manifest: LocalManifest, card: ModelCard
) -> None:
    """The fetcher's State may have a card a moment before the holder's (the leader applies
    a commit first): the holder waits for its State a little, then serves."""
    cards: dict[str, ModelCard] = {}
    async with cluster(tmp_path, cards) as nodes:
        link = nodes["node-c"].mesh.link("node-a")
        assert link is not None
        entry = next(f for f in manifest.manifest.files if f.name.endswith(".safetensors"))
        request = RangeRequest("r", "gen", manifest.sha256, entry.name, (ByteRange(0, 8),))
        answers: list[bytes] = []

        async def ask() -> None:
            answers.append(await link.call(RANGES_METHOD, REQUEST_CODEC.encode(request), WITHIN))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask)
            await trio.sleep(0.3)
            assert answers == []  # waiting for its State
            cards["gen"] = card  # the holder applies the card
        assert REPLY_CODEC.decode(answers[0]) == RangesAccepted("r", 8)


async def test_the_server_bounds_streams_per_peer(
    tmp_path: Path, manifest: LocalManifest, card: ModelCard
) -> None:
    entry = max(manifest.manifest.files, key=lambda f: f.size)
    everything = [ByteRange(0, entry.size)]
    async with cluster(tmp_path, {"gen": card}, max_per_peer=1) as nodes:
        c, a = nodes["node-c"], nodes["node-a"]
        sha = manifest.sha256
        async with c.client.open_ranges("node-a", "gen", sha, entry.name, everything) as first:
            assert len(await first.receive()) == CHUNK  # and then it stops reading
            with pytest.raises(PeerFailure, match="overloaded") as failed:
                async with c.client.open_ranges("node-a", "gen", sha, entry.name, everything):
                    pass
            assert not failed.value.lasting  # a fetch tries again later
        with trio.fail_after(WITHIN):
            while a.server.serving:  # noqa: ASYNC110 - the stop reaches the holder
                await trio.sleep(0.01)
        async with c.client.open_ranges("node-a", "gen", sha, entry.name, everything) as again:
            got = 0
            with trio.fail_after(WITHIN):
                while True:
                    try:
                        got += len(await again.receive())
                    except trio.EndOfChannel:
                        break
            assert got == entry.size
        assert a.server.statistics().abandoned == 1


class _Impatient(WeightServer):
    """A holder that waits only 0.5 s for a fetcher's credit."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["timeouts"] = attrs.evolve(TIMEOUTS, send=0.5)
        super().__init__(*args, **kwargs)


async def test_a_fetcher_that_grants_no_credit_loses_its_stream_and_frees_the_slot(
    tmp_path: Path, manifest: LocalManifest, card: ModelCard
) -> None:
    """Issue 23: the fetcher stops reading (so grants no credit). The holder gives the stream
    up after its send deadline and aborts it, which frees the link's stream slot as well as
    its own; the fetcher gets what came, then a typed failure. Before, the holder's own slot
    was freed but the link's stayed taken until the link reconnected."""
    entry = max(manifest.manifest.files, key=lambda f: f.size)
    everything = [ByteRange(0, entry.size)]
    servers: dict[str, type[WeightServer]] = {"node-a": _Impatient}
    async with cluster(tmp_path, {"gen": card}, servers=servers) as nodes:
        c, a = nodes["node-c"], nodes["node-a"]
        to_c = a.mesh.link("node-c")
        assert to_c is not None
        sha = manifest.sha256
        async with c.client.open_ranges("node-a", "gen", sha, entry.name, everything) as stalled:
            assert len(await stalled.receive()) == CHUNK  # and then it stops reading
            with trio.fail_after(WITHIN):
                while a.server.serving or to_c.statistics().streams_out:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            got = CHUNK
            with pytest.raises(PeerFailure, match="aborted by its sender: abandoned") as failed:
                while True:
                    got += len(await stalled.receive())
            assert not failed.value.lasting and got < entry.size
        assert a.server.statistics().abandoned == 1


async def test_a_file_changed_under_the_holder_ends_its_stream(
    tmp_path: Path, model: Path, card: ModelCard
) -> None:
    copy = Path(shutil.copytree(model, tmp_path / "copy"))
    local = local_manifest(copy)
    held = attrs.evolve(card, source=PathSource(str(copy)), manifest_sha256=local.sha256)
    entry = next(f for f in local.manifest.files if f.name.endswith(".safetensors"))
    async with cluster(tmp_path, {"gen": held}) as nodes:
        c = nodes["node-c"]
        ranges = [ByteRange(0, entry.size)]
        async with c.client.open_ranges("node-a", "gen", local.sha256, entry.name, ranges) as s:
            assert await s.receive()  # the manifest is known now
        (copy / entry.name).write_bytes((copy / entry.name).read_bytes() + b"x")
        async with c.client.open_ranges("node-a", "gen", local.sha256, entry.name, ranges) as s:
            with pytest.raises(PeerFailure, match="model_changed") as failed:
                while True:
                    await s.receive()
            assert failed.value.lasting
        with pytest.raises(PeerFailure, match="manifest_mismatch"):  # and from now on
            async with c.client.open_ranges("node-a", "gen", local.sha256, entry.name, ranges):
                pass


# ---- the fetcher's own failures ----------------------------------------------------------------


async def test_no_reachable_holder_is_a_typed_failure(
    tmp_path: Path, card: ModelCard, remote: ModelCard
) -> None:
    async with cluster(tmp_path, {"gen": card}) as nodes:
        c = nodes["node-c"]
        policy = attrs.evolve(POLICY, retry_rounds=2)
        with trio.fail_after(WITHIN), pytest.raises(NoHolderReachable) as failed:
            await fetch_model(c.client, remote, SINGLE, c.home, holders=["node-x"], policy=policy)
        assert failed.value.tried == {"node-x": "no link to it"}
        with pytest.raises(NoHolderReachable, match="names no other node"):
            await fetch_model(c.client, remote, SINGLE, c.home, holders=["node-c"])


async def test_a_full_disk_is_a_typed_failure(
    tmp_path: Path, card: ModelCard, remote: ModelCard, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with cluster(tmp_path, {"gen": card}) as nodes:
        c = nodes["node-c"]

        class Usage:
            free = 1000

        monkeypatch.setattr(run_module.shutil, "disk_usage", lambda path: Usage)
        with trio.fail_after(WITHIN), pytest.raises(DiskFull, match="1000 bytes are free"):
            await fetch_model(c.client, remote, SINGLE, c.home, policy=POLICY)
        assert c.client.bytes_received == 0  # checked before asking for any bytes
        monkeypatch.undo()

        def full(fd: int, data: object, offset: int) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(store_module.os, "pwrite", full)
        with trio.fail_after(WITHIN), pytest.raises(DiskFull, match="ENOSPC") as failed:
            await fetch_model(c.client, remote, SINGLE, c.home, policy=POLICY)
        assert failed.value.needed > 0
        monkeypatch.undo()
        record = store_directory(c.home, "gen") / RECORD_NAME
        assert not record.exists()  # nothing verified, nothing recorded


async def test_other_streams_are_not_taken_for_transfers(tmp_path: Path, card: ModelCard) -> None:
    async with cluster(tmp_path, {"gen": card}) as nodes:
        link = nodes["node-a"].mesh.link("node-c")
        assert link is not None
        sender = link.open_stream()
        await sender.send(b"\xa1\x61t\x6bRouteHeader")  # not a transfer header
        with trio.fail_after(WITHIN):
            while not nodes["node-c"].other_streams:  # noqa: ASYNC110
                await trio.sleep(0.01)
        assert nodes["node-c"].client.statistics().streams_refused == 0


async def test_an_empty_file_in_the_model_is_fetched_without_asking_for_bytes(
    tmp_path: Path, model: Path
) -> None:
    """A zero-byte file needs no range at all (a holder refuses an empty range list): it is
    completed and recorded locally, and the rest of the fetch goes on."""
    with_empty = Path(shutil.copytree(model, tmp_path / "with-empty"))
    (with_empty / "generation_config.json").write_bytes(b"")
    local = local_manifest(with_empty)
    assert any(f.name == "generation_config.json" and f.size == 0 for f in local.manifest.files)
    held = card_from_directory(
        "gen", with_empty, PathSource(str(with_empty)),
        manifest_sha256=local.sha256, holders=("node-a", "node-b"),
    )  # fmt: skip
    async with cluster(tmp_path, {"gen": held}) as nodes:
        c = nodes["node-c"]
        away = attrs.evolve(held, source=PathSource("/nonexistent/skulk-test/gen"))
        with trio.fail_after(WITHIN):
            out = await fetch_model(c.client, away, LAST, c.home)
        assert (out / "generation_config.json").read_bytes() == b""
        assert_loads_as_original(out, with_empty, local, LAST)
