"""The weight manifest of a model directory: what it lists, that it is canonical and
content-only, the on-disk cache keyed by (size, mtime_ns), strict decoding of untrusted bytes,
and the model card carrying its hash."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
from pathlib import Path

import attrs
import mlx.core as mx
import pytest

import skulk.models._manifest as manifest_module
from skulk.models import (
    ManifestInvalid,
    decode_manifest,
    encode_manifest,
    ensure_demo_model,
    local_manifest,
    model_card,
)
from skulk.models._generated import ModelShape, write_generated_model
from skulk.models._manifest import manifest_cache_path
from skulk.wire.cluster import DemoSource, PathSource
from skulk.wire.transfer import FileEntry, Manifest, TensorEntry

SHAPE = ModelShape(layers=2, hidden_size=64, intermediate_size=128)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("manifest")
    demo = ensure_demo_model(root / "demo-home")
    return write_generated_model(root / "gen", SHAPE, demo, files=2, seed=5)


@pytest.fixture
def copy(model: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(model, tmp_path / "copy"))


def test_lists_every_file_and_tensor_with_true_ranges_and_hashes(model: Path) -> None:
    local = local_manifest(model)
    names = [f.name for f in local.manifest.files]
    assert names == sorted(p.name for p in model.iterdir() if p.suffix in (".json", ".safetensors"))
    assert "model.safetensors.index.json" in names and "config.json" in names
    for entry in local.manifest.files:
        data = (model / entry.name).read_bytes()
        assert entry.size == len(data)
        assert entry.sha256 == hashlib.sha256(data).digest()
        if not entry.name.endswith(".safetensors"):
            assert entry.header_length is None and entry.tensors == ()
            continue
        assert entry.header_length == 8 + struct.unpack("<Q", data[:8])[0]
        assert entry.header_sha256 == hashlib.sha256(data[: entry.header_length]).digest()
        loaded = mx.load(str(model / entry.name))
        assert sorted(t.name for t in entry.tensors) == sorted(loaded)
        at = entry.header_length
        for t in entry.tensors:
            assert t.start == at  # contiguous, in order
            at = t.end
            assert data[t.start : t.end] == bytes(memoryview(loaded[t.name]))
            assert t.sha256 == hashlib.sha256(data[t.start : t.end]).digest()
            assert list(t.shape) == list(loaded[t.name].shape)
        assert at == entry.size


def test_canonical_and_content_only(model: Path, copy: Path) -> None:
    first = local_manifest(model)
    assert local_manifest(model) == first
    os.utime(copy / "config.json", ns=(1, 1))  # other times, other path: same manifest
    assert local_manifest(copy).sha256 == first.sha256
    assert encode_manifest(decode_manifest(first.body)) == first.body
    assert hashlib.sha256(first.body).hexdigest() == first.sha256


def test_any_changed_byte_changes_the_hash(copy: Path) -> None:
    before = local_manifest(copy).sha256
    path = copy / "model-00002-of-00002.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert local_manifest(copy).sha256 != before


def test_the_cache_spares_rehashing_until_a_file_changes(
    copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    first = local_manifest(copy, home)
    assert manifest_cache_path(copy, home).is_file()
    hashed: list[str] = []
    real = manifest_module.file_entry

    def counting(path: Path) -> FileEntry:
        hashed.append(path.name)
        return real(path)

    monkeypatch.setattr(manifest_module, "file_entry", counting)
    assert local_manifest(copy, home) == first  # a "restart": nothing hashed again
    assert hashed == []
    tokenizer = copy / "tokenizer.json"
    tokenizer.write_bytes(tokenizer.read_bytes() + b" ")
    changed = local_manifest(copy, home)
    assert hashed == ["tokenizer.json"] and changed.sha256 != first.sha256
    st = tokenizer.stat()
    os.utime(tokenizer, ns=(st.st_atime_ns, st.st_mtime_ns + 1))  # touched: hashed again
    assert local_manifest(copy, home).sha256 == changed.sha256
    assert hashed == ["tokenizer.json", "tokenizer.json"]


def test_a_damaged_cache_is_ignored(copy: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = local_manifest(copy, home)
    manifest_cache_path(copy, home).write_bytes(b"\xa1junk")
    assert local_manifest(copy, home) == first


def test_a_damaged_safetensors_header_is_refused(copy: Path, tmp_path: Path) -> None:
    path = copy / "model-00001-of-00002.safetensors"
    data = path.read_bytes()
    path.write_bytes(struct.pack("<Q", len(data)) + data[8:])  # header longer than the file
    with pytest.raises(ManifestInvalid, match="header length"):
        local_manifest(copy)
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 999]}})
    path.write_bytes(struct.pack("<Q", len(header)) + header.encode() + bytes(8))
    with pytest.raises(ManifestInvalid, match="bad safetensors entry"):
        local_manifest(copy)
    with pytest.raises(ValueError, match="bad safetensors entry"):  # model_card: a ValueError
        model_card(str(copy), tmp_path / "home")


def _entry(name: str = "a.safetensors", **changes: object) -> FileEntry:
    tensor = TensorEntry("w", "F32", (2,), 16, 24, bytes(32))
    entry = FileEntry(name, 24, bytes(32), 16, bytes(32), (tensor,))
    return attrs.evolve(entry, **changes)


@pytest.mark.parametrize(
    "manifest",
    [
        Manifest((_entry("../etc/passwd"),)),
        Manifest((_entry(".hidden"),)),
        Manifest((_entry("b.json"), _entry("a.json"))),  # unsorted
        Manifest((_entry(), _entry())),  # duplicate
        Manifest((_entry(size=20),)),  # tensor past the end
        Manifest((_entry(header_length=20),)),  # tensor inside the header
        Manifest((_entry(sha256=b"short"),)),
        Manifest((_entry(header_length=None),)),  # tensors without a header
        Manifest(
            (
                _entry(
                    tensors=(
                        TensorEntry("a", "F32", (2,), 16, 24, bytes(32)),
                        TensorEntry("b", "F32", (2,), 20, 24, bytes(32)),  # overlaps
                    )
                ),
            )
        ),
    ],
)
def test_decoding_refuses_unsafe_or_inconsistent_manifests(manifest: Manifest) -> None:
    with pytest.raises(ManifestInvalid):
        decode_manifest(encode_manifest(manifest))


def test_decoding_refuses_what_is_not_a_manifest() -> None:
    good = encode_manifest(Manifest((_entry(),)))
    assert decode_manifest(good) == Manifest((_entry(),))
    for bad in (b"", b"\xa0", good + b"\x00", good.replace(b"Manifest", b"Manifesu")):
        with pytest.raises(ManifestInvalid):
            decode_manifest(bad)


def test_model_card_carries_the_manifest_hash_and_its_holder(model: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    card = model_card(str(model), home, "node-a")
    assert isinstance(card.source, PathSource)
    assert card.manifest_sha256 == local_manifest(model).sha256
    assert card.holders == ("node-a",)
    assert manifest_cache_path(model, home).is_file()
    assert model_card(str(model), home).holders == ()  # no node id: no holder
    demo = model_card("skulk-demo", home, "node-a")
    assert isinstance(demo.source, DemoSource)
    assert demo.manifest_sha256 is None and demo.holders == ()
