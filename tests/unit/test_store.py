"""The content-addressed model store: import by content, dedup, commit of staged files, names,
remove refused in use, least-recently-used eviction within a budget and the disk, verify."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import struct
import threading
from collections.abc import Callable
from pathlib import Path

import attrs
import cbor2
import pytest

import skulk.store._store as store_module
from skulk.models import (
    ManifestInvalid,
    decode_manifest,
    encode_manifest,
    ensure_demo_model,
    local_manifest,
)
from skulk.models._generated import ModelShape, write_generated_model
from skulk.store import (
    MANIFEST_NAME,
    MissingBlobs,
    ModelInUse,
    ModelStore,
    NotStored,
    StoredModel,
    StoreFull,
    StoreStatistics,
)
from skulk.wire.transfer import Manifest

# ---- helpers shared by tests/unit/test_store_*.py ---------------------------------------------


def safetensors(values: bytes) -> bytes:
    """A one-tensor safetensors file holding ``values`` (a multiple of 4 bytes, F32)."""
    header = json.dumps(
        {"w": {"dtype": "F32", "shape": [len(values) // 4], "data_offsets": [0, len(values)]}}
    ).encode()
    return struct.pack("<Q", len(header)) + header + values


def make_model(path: Path, files: dict[str, bytes]) -> Path:
    """A hand-made model directory: ``config.json`` plus ``files``."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_bytes(b'{"model_type": "llama"}')
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


class FakeDisk:
    """A file system of ``capacity`` bytes holding only the store's blobs."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.store: ModelStore | None = None

    def free(self) -> int:
        assert self.store is not None
        return self.capacity - self.store.used_bytes()


def blob_files(root: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in (root / "blobs").iterdir()}


def assert_complete(model: StoredModel) -> None:
    """The model's directory is exactly its manifest: it hashes to its identity."""
    assert local_manifest(model.directory).sha256 == model.sha256
    body = (model.directory / MANIFEST_NAME).read_bytes()
    assert hashlib.sha256(body).hexdigest() == model.sha256


# ---- tests -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store-gen")
    demo = ensure_demo_model(root / "home")
    return write_generated_model(root / "gen", ModelShape(layers=2), demo, files=2, seed=3)


def test_import_lays_out_a_loadable_model_of_hard_links_to_read_only_blobs(
    generated: Path, tmp_path: Path
) -> None:
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    seen: list[tuple[int, int]] = []
    model = store.import_directory(generated, "gen", lambda done, total: seen.append((done, total)))
    assert model.sha256 == local_manifest(generated).sha256
    assert model.directory == tmp_path / "store" / "models" / model.sha256
    assert_complete(model)
    files = sorted(p.name for p in generated.iterdir() if p.suffix in (".json", ".safetensors"))
    assert sorted(p.name for p in model.directory.iterdir()) == sorted([*files, MANIFEST_NAME])
    for name in files:
        served = model.directory / name
        blob = store.blob_path(hashlib.sha256(served.read_bytes()).hexdigest())
        assert os.path.samefile(served, blob)
        assert stat.S_IMODE(blob.stat().st_mode) & 0o222 == 0
    total = sum((generated / n).stat().st_size for n in files)
    assert model.size == total == store.used_bytes() == sum(blob_files(store.root).values())
    assert seen[-1] == (total, total)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert list((store.root / "staging").iterdir()) == []
    assert store.lookup("gen") == store.lookup(model.sha256) == model
    import mlx_lm

    loaded, tokenizer = mlx_lm.load(str(model.directory))
    assert len(loaded.layers) == 2 and tokenizer.encode("hello")


def test_identity_is_content_not_path_and_copies_are_stored_once(tmp_path: Path) -> None:
    files = {"model.safetensors": safetensors(b"\x01" * 64), "tokenizer.json": b"{}"}
    one = make_model(tmp_path / "a" / "one", files)
    two = make_model(tmp_path / "b" / "two", files)
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    first = store.import_directory(one, "one")
    used = store.used_bytes()
    seen: list[tuple[int, int]] = []
    second = store.import_directory(two, "two", lambda d, t: seen.append((d, t)))
    assert first.sha256 == second.sha256
    assert second.names == ("one", "two")
    assert seen == []  # nothing to copy: every blob was in
    assert store.used_bytes() == used == sum(blob_files(store.root).values())
    assert len(blob_files(store.root)) == 3
    assert [m.sha256 for m in store.models()] == [first.sha256]


def test_files_shared_by_two_models_are_one_blob_until_both_go(tmp_path: Path) -> None:
    weights = safetensors(bytes(range(256)) * 4)
    a = make_model(tmp_path / "a", {"model.safetensors": weights, "tokenizer.json": b'{"a":1}'})
    b = make_model(tmp_path / "b", {"model.safetensors": weights, "tokenizer.json": b'{"b":2}'})
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    ma, mb = store.import_directory(a, "a"), store.import_directory(b, "b")
    assert ma.sha256 != mb.sha256
    assert len(blob_files(store.root)) == 4  # config and weights shared
    assert store.used_bytes() == sum(blob_files(store.root).values()) < ma.size + mb.size
    store.remove("a")
    assert store.lookup("a") is None and not ma.directory.exists()
    assert_complete(mb)
    assert len(blob_files(store.root)) == 3
    store.remove(mb.sha256)
    assert blob_files(store.root) == {} and store.used_bytes() == 0
    assert list((store.root / "models").iterdir()) == []


def test_staged_files_committed_by_manifest_and_refused_while_a_blob_is_missing(
    tmp_path: Path,
) -> None:
    src = make_model(tmp_path / "src", {"model.safetensors": safetensors(b"\x02" * 32)})
    local = local_manifest(src)
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    stage = store.staging("download-1")
    first, *rest = local.manifest.files
    shutil.copyfile(src / first.name, stage / first.name)
    store.add_verified_file(stage / first.name, first.sha256.hex())
    with pytest.raises(MissingBlobs) as caught:
        store.commit(local.body, ["org/repo"])
    assert caught.value.reason == "missing_blobs"
    assert set(caught.value.missing) == {f.sha256.hex() for f in rest}
    assert sorted(n for ns in caught.value.missing.values() for n in ns) == [f.name for f in rest]
    assert list((store.root / "models").iterdir()) == []
    assert store.lookup("org/repo") is None
    for f in rest:
        shutil.copyfile(src / f.name, stage / f.name)
        store.add_verified_file(stage / f.name, f.sha256.hex())
    assert list(stage.iterdir()) == []  # moved, not copied
    model = store.commit(local.body, ["org/repo@abc", "org/repo"])
    assert model.names == ("org/repo@abc", "org/repo")
    assert_complete(model)
    with pytest.raises(ManifestInvalid):
        store.commit(b"not a manifest")


def test_commit_refuses_manifests_that_are_not_canonical_or_name_paths(tmp_path: Path) -> None:
    src = make_model(tmp_path / "src", {})
    local = local_manifest(src)
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    (entry,) = local.manifest.files
    stage = store.staging("s")
    (stage / "c").write_bytes((src / "config.json").read_bytes())
    store.add_verified_file(stage / "c", entry.sha256.hex())
    reordered = cbor2.dumps(dict(reversed(list(cbor2.loads(local.body).items()))))
    assert reordered != local.body and decode_manifest(reordered) == local.manifest
    with pytest.raises(ManifestInvalid, match="canonical"):
        store.commit(reordered)
    for bad in ("../config.json", ".hidden", "a/b"):
        body = encode_manifest(Manifest((attrs.evolve(entry, name=bad),)))
        with pytest.raises(ManifestInvalid, match="plain file name"):
            store.commit(body)
    assert list((store.root / "models").iterdir()) == [] and store.models() == []
    assert not (tmp_path / "store" / "config.json").exists()
    assert_complete(store.commit(local.body))


def test_a_name_leads_to_the_latest_model_committed_under_it(tmp_path: Path) -> None:
    v1 = make_model(tmp_path / "v1", {"tokenizer.json": b'{"v":1}'})
    v2 = make_model(tmp_path / "v2", {"tokenizer.json": b'{"v":2}'})
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    m1 = store.import_directory(v1, "org/repo")
    store.commit(local_manifest(v1).body, ["org/repo@v1"])
    m2 = store.import_directory(v2, "org/repo")
    assert store.lookup("org/repo") == store.lookup(m2.sha256)
    again = store.lookup(m1.sha256)
    assert again is not None and again.names == ("org/repo@v1",)
    for bad in ("", " x", "a\nb", "x" * 257, "0" * 64):
        with pytest.raises(ValueError):
            store.import_directory(v1, bad)
    with pytest.raises(ManifestInvalid, match=r"config\.json"):
        store.import_directory(tmp_path, "nothing")


def test_remove_is_refused_for_a_model_in_use_and_unknown_names_are_named(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    model = store.import_directory(make_model(tmp_path / "m", {}), "m")
    with pytest.raises(ModelInUse) as caught:
        store.remove("m", in_use={model.sha256})
    assert caught.value.reason == "model_in_use" and "'m'" in str(caught.value)
    assert_complete(model)
    with pytest.raises(NotStored, match="'nope'"):
        store.remove("nope")
    with pytest.raises(NotStored):
        store.touch("nope")
    assert store.remove("m", in_use={"f" * 64}) == model
    assert store.lookup("m") is None


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        self.now += 1
        return self.now


def three_models(tmp_path: Path, **kwargs: object) -> tuple[ModelStore, list[StoredModel]]:
    """Models ``m0``, ``m1``, ``m2`` of 4 KiB of weights each (plus a shared config), used in
    that order."""
    store = ModelStore(tmp_path / "store", clock=Clock(), **kwargs)  # type: ignore[arg-type]
    models = [
        store.import_directory(
            make_model(tmp_path / f"m{i}", {"model.safetensors": safetensors(bytes([i]) * 4096)}),
            f"m{i}",
        )
        for i in range(3)
    ]
    return store, models


def test_eviction_takes_least_recently_used_first_never_one_in_use(tmp_path: Path) -> None:
    store, (m0, m1, m2) = three_models(tmp_path, reserve_bytes=0)
    used = store.used_bytes()
    store.budget_bytes = used + 100
    assert store.ensure_room(100) == []
    store.touch("m0")  # now m1 is the least recently used, then m2, then m0
    evicted = store.ensure_room(4000, in_use={m1.sha256})
    assert [m.sha256 for m in evicted] == [m2.sha256]
    assert store.lookup("m2") is None and not m2.directory.exists()
    assert store.used_bytes() == sum(blob_files(store.root).values())
    evicted = store.ensure_room(used)
    assert [m.sha256 for m in evicted] == [m1.sha256, m0.sha256]
    assert store.models() == [] and blob_files(store.root) == {}


def test_store_full_evicts_nothing_when_evicting_all_would_not_do(tmp_path: Path) -> None:
    store, models = three_models(tmp_path, reserve_bytes=0)
    store.budget_bytes = store.used_bytes()
    before = blob_files(store.root)
    in_use = {models[0].sha256}
    with pytest.raises(StoreFull) as caught:
        store.ensure_room(3 * 4096, in_use=in_use)
    full = caught.value
    assert full.reason == "disk_full"
    assert (full.needed, full.available) == (3 * 4096, 0)
    assert 2 * 4096 < full.reclaimable < 3 * 4096  # m1 and m2 (the config stays with m0)
    assert "budget" in full.limit and str(3 * 4096) in str(full)
    assert blob_files(store.root) == before and len(store.models()) == 3
    assert [m.names for m in store.ensure_room(2 * 4096, in_use=in_use)] == [("m1",), ("m2",)]


def test_room_is_the_disk_less_its_reserve_when_there_is_no_budget(tmp_path: Path) -> None:
    disk = FakeDisk(capacity=40_000)
    store, models = three_models(tmp_path, reserve_bytes=10_000, disk_free=disk.free)
    disk.store = store
    room = 30_000 - store.used_bytes()
    assert store.available_bytes() == room
    assert store.ensure_room(room) == []
    evicted = store.ensure_room(room + 1)
    assert [m.sha256 for m in evicted] == [models[0].sha256]
    with pytest.raises(StoreFull, match="reserve"):
        store.ensure_room(30_001)


def test_verify_deletes_a_corrupted_blob_and_drops_every_model_using_it(tmp_path: Path) -> None:
    store, (m0, m1, m2) = three_models(tmp_path, reserve_bytes=0)
    assert store.verify("m1").ok
    weights = m1.directory / "model.safetensors"
    blob = store.blob_path(hashlib.sha256(weights.read_bytes()).hexdigest())
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:  # one flipped byte in the data
        f.seek(200)
        byte = f.read(1)
        f.seek(200)
        f.write(bytes([byte[0] ^ 1]))
    report = store.verify("m1")
    assert not report.ok
    assert report.corrupt == (("model.safetensors", blob.name),)
    assert [m.sha256 for m in report.dropped] == [m1.sha256]
    assert not blob.exists() and not m1.directory.exists()
    assert store.lookup("m1") is None
    config = store.blob_path(hashlib.sha256(b'{"model_type": "llama"}').hexdigest())
    os.chmod(config, 0o644)
    config.write_bytes(b'{"model_type": "evil"}')
    report = store.verify("m0")
    assert {m.sha256 for m in report.dropped} == {m0.sha256, m2.sha256}  # both used it
    assert store.models() == [] and blob_files(store.root) == {}


def test_a_file_changed_while_imported_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = make_model(tmp_path / "src", {"model.safetensors": safetensors(b"\x05" * 64)})
    real: Callable[..., object] = store_module.local_manifest

    def then_change(directory: Path, home: Path | None = None) -> object:
        found = real(directory, home)
        with open(directory / "model.safetensors", "r+b") as f:
            f.seek(-1, os.SEEK_END)
            f.write(b"\x06")
        return found

    monkeypatch.setattr(store_module, "local_manifest", then_change)
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    with pytest.raises(ManifestInvalid, match="changed while it was imported"):
        store.import_directory(src, "src")
    assert store.models() == [] and list((store.root / "models").iterdir()) == []
    assert list((store.root / "staging").iterdir()) == []


def test_prune_deletes_loose_blobs_of_a_download_that_never_committed(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    stage = store.staging("dl")
    for data in (b"one", b"two", b"three"):
        (stage / "f").write_bytes(data)
        store.add_verified_file(stage / "f", hashlib.sha256(data).hexdigest())
    assert store.used_bytes() == 11
    assert store.statistics() == StoreStatistics(0, 11, 11, None, store.available_bytes())
    assert store.prune() == 0  # added in this session: a commit may still come
    reopened = ModelStore(tmp_path / "store", reserve_bytes=0)
    assert reopened.used_bytes() == 11
    keep = hashlib.sha256(b"two").hexdigest()
    assert reopened.prune(keep={keep}) == 8
    assert set(blob_files(reopened.root)) == {keep} and reopened.used_bytes() == 3
    for bad in ("", "../x", ".hidden", "a/b"):
        with pytest.raises(ValueError):
            store.staging(bad)
    with pytest.raises(ValueError):
        store.blob_path("../" + "0" * 61)


def test_a_hub_cache_snapshot_of_symlinks_is_imported_as_copies(tmp_path: Path) -> None:
    """As in ``~/.cache/huggingface/hub``: snapshot files are links to ``../../blobs/<etag>``;
    the store copies their content (a later change there cannot reach a blob)."""
    hub_blobs = make_model(tmp_path / "repo" / "blobs", {"a": safetensors(b"\x09" * 32)})
    snapshot = tmp_path / "repo" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(hub_blobs / "config.json")
    (snapshot / "model.safetensors").symlink_to(hub_blobs / "a")
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    model = store.import_directory(snapshot, "org/repo")
    assert_complete(model)
    served = model.directory / "model.safetensors"
    assert not served.is_symlink() and not os.path.samefile(served, hub_blobs / "a")
    (hub_blobs / "a").write_bytes(b"changed")
    assert store.verify("org/repo").ok


def test_a_damaged_index_is_rebuilt_from_the_model_directories(tmp_path: Path) -> None:
    store, models = three_models(tmp_path, reserve_bytes=0)
    (store.root / "index.cbor").write_bytes(b"\xff garbage")
    (store.root / "models" / ("0" * 64)).mkdir()  # not a model: deleted
    reopened = ModelStore(store.root, reserve_bytes=0)
    assert sorted(m.sha256 for m in reopened.models()) == sorted(m.sha256 for m in models)
    assert all(m.names == () and m.last_used == 0.0 for m in reopened.models())
    assert sorted(p.name for p in (store.root / "models").iterdir()) == sorted(
        m.sha256 for m in models
    )
    assert reopened.lookup("m0") is None  # names are lost with the index; hashes are not
    assert reopened.import_directory(tmp_path / "m0", "m0").sha256 == models[0].sha256


def test_concurrent_imports_of_one_directory_both_succeed(tmp_path: Path) -> None:
    src = make_model(tmp_path / "src", {"model.safetensors": safetensors(b"\x0a" * 4096)})
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    results: list[StoredModel] = []
    threads = [
        threading.Thread(target=lambda n=n: results.append(store.import_directory(src, n)))
        for n in ("a", "b", "c")
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 3 and len({m.sha256 for m in results}) == 1
    (model,) = store.models()
    assert sorted(model.names) == ["a", "b", "c"]
    assert_complete(model)
    assert list((store.root / "staging").iterdir()) == []


def test_a_staged_download_is_committed_by_rename_checked_against_its_verified_hashes(
    tmp_path: Path,
) -> None:
    src = make_model(tmp_path / "src", {"model.safetensors": safetensors(b"\x0b" * 512)})
    hashes = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in src.iterdir()}
    store = ModelStore(tmp_path / "store", reserve_bytes=0)

    def stage(key: str) -> Path:
        staged = store.staging(key)
        for p in src.iterdir():
            shutil.copyfile(p, staged / p.name)
        (staged / ".cache").mkdir()  # what hf_hub_download(local_dir=…) leaves: ignored
        return staged

    staged = stage("dl-bad")
    with pytest.raises(ManifestInvalid, match=r"'model\.safetensors'"):
        store.commit_staging("dl-bad", ["org/repo"], {**hashes, "model.safetensors": "0" * 64})
    with pytest.raises(ManifestInvalid, match=r"'tokenizer\.json'"):  # not downloaded
        store.commit_staging("dl-bad", ["org/repo"], {**hashes, "tokenizer.json": "0" * 64})
    assert (staged / "model.safetensors").is_file() and store.models() == []
    assert blob_files(store.root) == {}
    stage("dl-good")
    model = store.commit_staging("dl-good", ["org/repo@abc", "org/repo"], hashes)
    assert model.sha256 == local_manifest(src).sha256
    assert model.names == ("org/repo@abc", "org/repo")
    assert_complete(model)
    assert not (store.root / "staging" / "dl-good").exists()
    assert set(blob_files(store.root)) == set(hashes.values())


def test_where_links_are_refused_models_hold_verified_copies(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(src: object, dst: object) -> None:
        raise PermissionError(errno.EPERM, "no links here")

    monkeypatch.setattr(os, "link", refuse)
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    src = make_model(tmp_path / "m", {"model.safetensors": safetensors(b"\x0c" * 64)})
    model = store.import_directory(src, "m")
    assert_complete(model)
    served = model.directory / "model.safetensors"
    blob = store.blob_path(hashlib.sha256(served.read_bytes()).hexdigest())
    assert not os.path.samefile(served, blob)
    assert stat.S_IMODE(served.stat().st_mode) & 0o222 == 0
    assert store.verify("m").ok
    os.chmod(served, 0o644)
    served.write_bytes(b"bad copy")
    report = store.verify("m")
    assert [name for name, _ in report.corrupt] == ["model.safetensors"]
    assert [m.sha256 for m in report.dropped] == [model.sha256]
    assert store.lookup("m") is None
    assert store.import_directory(src, "m") == store.lookup("m")  # its blobs were good: kept
