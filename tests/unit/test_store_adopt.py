"""ModelStore.adopt_verified: a fetched model directory goes into the store by hard links."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from skulk.models import ManifestInvalid, local_manifest
from skulk.store import ModelStore
from tests.unit.test_store import make_model, safetensors


def test_adopted_files_are_linked_in_as_blobs_and_committed(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    stage = store.staging("peer-x")
    make_model(stage, {"model.safetensors": safetensors(b"\x01\x02\x03\x04" * 64)})
    local = local_manifest(stage)
    stored = store.adopt_verified(stage, local.body, ("org/model",))
    assert stored.sha256 == local.sha256 and stored.names == ("org/model",)
    assert store.lookup("org/model") == stored
    for f in local.manifest.files:
        blob = store.blob_path(f.sha256.hex())
        assert os.path.samefile(blob, stage / f.name)  # linked, not copied
        assert os.path.samefile(blob, stored.directory / f.name)
    store.discard_staging("peer-x")
    assert not stage.exists() and store.verify(stored.sha256).ok
    # The store reopened (a restart) still holds it.
    assert ModelStore(tmp_path / "store", reserve_bytes=0).lookup(local.sha256) is not None


def test_adopting_needs_canonical_manifest_bytes(tmp_path: Path) -> None:
    store = ModelStore(tmp_path / "store", reserve_bytes=0)
    stage = store.staging("peer-y")
    make_model(stage, {"model.safetensors": safetensors(b"\x00" * 16)})
    with pytest.raises(ManifestInvalid):
        store.adopt_verified(stage, b"\xa0junk", ())
    assert store.models() == []
