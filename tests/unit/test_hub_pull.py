"""pull(): a Hub model into a node's content-addressed store, through the real
huggingface_hub client against the local Hub (``tests/hubserver.py``)."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest

from skulk.hub import CHUNK_BYTES, RepoNotFound, pull
from skulk.hub import _pull as hub_pull
from skulk.models import ModelShape, ensure_demo_model, local_manifest, write_generated_model
from skulk.store import ModelStore, StoreFull
from tests.hubserver import HubServer, hub, repo_files, tiny_model

__all__ = ["hub", "tiny_model"]  # fixtures

ROOMY = 1 << 40  # a disk that never fills, for stores whose budget is what is tested


def store_at(tmp_path: Path, budget: int | None = None) -> ModelStore:
    return ModelStore(tmp_path / "store", budget, disk_free=lambda: ROOMY)


def weight_bytes(hub: HubServer, repo: str) -> int:
    return sum(n for (r, f), n in hub.served.items() if r == repo and f != "config.json")


def test_a_pull_stores_the_model_by_content_and_a_second_pull_moves_no_byte(
    hub: HubServer, tiny_model: Path, tmp_path: Path
) -> None:
    repo = hub.add_repo("org/tiny", repo_files(tiny_model))
    store = store_at(tmp_path)
    model = pull("org/tiny", store)
    assert model.sha256 == local_manifest(tiny_model).sha256  # the same content, any path
    assert set(model.names) == {f"org/tiny@{repo.commit}", "org/tiny"}
    assert local_manifest(model.directory).sha256 == model.sha256
    assert not any(store.staging("probe").parent.glob(repo.commit))  # staging discarded
    sent = weight_bytes(hub, "org/tiny")
    assert sent == sum(len(b) for n, b in repo_files(tiny_model).items() if n != "config.json")

    again = pull("org/tiny@main", store)
    assert again.sha256 == model.sha256 and "org/tiny@main" in again.names
    assert weight_bytes(hub, "org/tiny") == sent  # nothing downloaded twice
    # The same files under another repo are stored once: no new blob.
    hub.add_repo("org/copy", repo_files(tiny_model))
    used = store.used_bytes()
    copy = pull("org/copy", store)
    assert copy.sha256 == model.sha256 and store.used_bytes() == used
    assert {"org/copy", "org/tiny"} <= set(store.lookup(model.sha256).names)  # type: ignore[union-attr]


def test_a_pull_that_cannot_fit_moves_no_weight_byte(
    hub: HubServer, tiny_model: Path, tmp_path: Path
) -> None:
    hub.add_repo("org/tiny", repo_files(tiny_model))
    store = store_at(tmp_path, budget=1024)
    with pytest.raises(StoreFull) as refused:
        pull("org/tiny", store)
    assert refused.value.reason == "disk_full" and refused.value.needed > 1024
    assert weight_bytes(hub, "org/tiny") == 0 and store.models() == []


def test_a_pull_cut_mid_file_resends_at_most_one_read_buffer(
    hub: HubServer, tmp_path: Path
) -> None:
    demo = ensure_demo_model(tmp_path / "demo-home")
    shape = ModelShape(hidden_size=256, intermediate_size=512)
    model_dir = write_generated_model(tmp_path / "gen", shape, demo, files=1, seed=5)
    files = repo_files(model_dir)
    weights = "model.safetensors"
    assert len(files[weights]) > 8 * CHUNK_BYTES  # large enough for the bound to mean something
    hub.add_repo("org/mid", files)
    hub.cut_once("org/mid", weights, at=len(files[weights]) // 2)
    model = pull("org/mid", store_at(tmp_path))
    assert model.sha256 == local_manifest(model_dir).sha256
    resent = hub.served_bytes("org/mid", weights) - len(files[weights])
    assert 0 <= resent <= CHUNK_BYTES, resent  # resumed, not started again from zero


def test_a_missing_repo_is_typed_and_stores_nothing(hub: HubServer, tmp_path: Path) -> None:
    store = store_at(tmp_path)
    with pytest.raises(RepoNotFound) as missing:
        pull("org/nothing", store)
    assert missing.value.reason == "repo_not_found" and "org/nothing" in str(missing.value)
    assert store.models() == []


def test_a_disk_that_fills_during_a_pull_is_disk_full_and_the_pull_resumes_once(
    hub: HubServer, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo("org/tiny", repo_files(tiny_model))
    real = hub_pull.download
    fills = [1]  # the disk fills once: the store checks its room, the download resumes

    def filling(*args: Any, **kwargs: Any) -> dict[str, str]:
        if fills[0] > 0:
            fills[0] -= 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(hub_pull, "download", filling)
    store = store_at(tmp_path)
    assert pull("org/tiny", store).sha256 == local_manifest(tiny_model).sha256
    # Full every time: a typed disk_full naming the bytes, never a raw OSError.
    fills[0] = 2
    other = store_at(tmp_path / "other")
    with pytest.raises(StoreFull) as full:
        pull("org/tiny", other)
    assert full.value.reason == "disk_full" and "disk filled" in str(full.value)
    assert other.models() == []
