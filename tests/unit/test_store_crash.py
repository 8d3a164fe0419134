"""Crash safety of the model store: an operation cut at each of its file-system steps (every
later step fails too, as in a dead process) leaves a store that opens into a consistent state:
a readable index, only complete models, no half model, and the operation can be done again."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from skulk.models import decode_manifest, local_manifest
from skulk.store import MANIFEST_NAME, ModelStore
from skulk.store._index import read_index
from tests.unit.test_store import assert_complete, blob_files, make_model, safetensors

_STEPS = ("mkdir", "link", "replace", "rename", "fsync", "unlink", "rmdir", "chmod")


class Crash(BaseException):
    """The process died here (a BaseException: no ``except OSError`` cleanup catches it)."""


@contextlib.contextmanager
def crash_at(step: int) -> Iterator[list[int]]:
    """Make the ``step``-th file-system step (1-based, of :data:`_STEPS`) and every one after
    it raise :class:`Crash`. Yields a one-item list: the number of steps seen."""
    seen = [0]
    real = {name: getattr(os, name) for name in _STEPS}

    def wrap(name: str) -> Callable[..., object]:
        def step_or_crash(*args: object, **kwargs: object) -> object:
            seen[0] += 1
            if seen[0] >= step:
                raise Crash(f"crash at step {seen[0]} ({name})")
            return real[name](*args, **kwargs)

        return step_or_crash

    with pytest.MonkeyPatch.context() as patch:
        for name in _STEPS:
            patch.setattr(os, name, wrap(name))
        yield seen


def consistent(root: Path, *, content: bool = True) -> ModelStore:
    """Open the store after a crash and check what must hold whatever happened. Without
    ``content``, bytes are not hashed (a corruption the store was cut before handling)."""
    store = ModelStore(root, reserve_bytes=0)
    assert read_index(root / "index.cbor") is not None
    models = store.models()
    assert sorted(p.name for p in (root / "models").iterdir()) == sorted(m.sha256 for m in models)
    for model in models:
        manifest = decode_manifest((model.directory / MANIFEST_NAME).read_bytes())
        for line in manifest.files:
            assert (model.directory / line.name).is_file()
            assert store.has_blob(line.sha256.hex())
        if content:
            assert_complete(model)
    assert store.used_bytes() == sum(blob_files(root).values())
    for blob in (root / "blobs").iterdir():  # no bad byte under a good name, loose or not
        if content:
            assert hashlib.sha256(blob.read_bytes()).hexdigest() == blob.name
    return store


def prepare(tmp: Path) -> tuple[Path, bytes, Path]:
    """A store holding model ``old``, the blobs of a second model staged and added (not yet
    committed; it shares files with ``old``), and a third model's source directory, also
    staged as a finished download under ``download``."""
    shared = safetensors(b"\x07" * 256)
    old = make_model(tmp / "old", {"model.safetensors": shared, "tokenizer.json": b"{}"})
    new = make_model(tmp / "new", {"model.safetensors": shared, "tokenizer.json": b'{"n":1}'})
    third = make_model(tmp / "third", {"w.safetensors": safetensors(b"\x08" * 128)})
    root = tmp / "store"
    store = ModelStore(root, reserve_bytes=0)
    store.import_directory(old, "old")
    local = local_manifest(new)
    stage = store.staging("new")
    for f in local.manifest.files:
        shutil.copyfile(new / f.name, stage / f.name)
        store.add_verified_file(stage / f.name, f.sha256.hex())
    download = store.staging("download")
    for p in third.iterdir():
        shutil.copyfile(p, download / p.name)
    return root, local.body, third


def _corrupt_and_verify(store: ModelStore) -> object:
    blob = store.blob_path(hashlib.sha256(b"{}").hexdigest())
    with open(blob, "r+b") as f:
        f.write(b"[]")
    return store.verify("old")


def _if_old_is_there(then: Callable[[ModelStore], object]) -> Callable[[ModelStore], object]:
    """A retry for an operation on ``old`` that the cut may have completed already."""
    return lambda store: then(store) if store.lookup("old") is not None else None


#: name → (the operation, its retry after a cut).
OPERATIONS: dict[str, tuple[Callable[[ModelStore, bytes, Path], object], Callable[..., object]]]
OPERATIONS = {
    "commit": (lambda store, body, third: store.commit(body, ["org/new@main"]), None),
    "import": (lambda store, body, third: store.import_directory(third, "third"), None),
    "remove": (
        lambda store, body, third: store.remove("old"),
        _if_old_is_there(lambda store: store.remove("old")),
    ),
    "touch": (lambda store, body, third: store.touch("old"), None),
    "staged": (
        lambda store, body, third: store.commit_staging("download", ["org/third"]),
        lambda store: (
            store.commit_staging("download", ["org/third"])
            if (store.root / "staging" / "download").exists()
            else None
        ),
    ),
    "evict": (
        lambda store, body, third: store.ensure_room(store.available_bytes() + 1),
        _if_old_is_there(lambda store: store.ensure_room(store.available_bytes() + 1)),
    ),
    "verify": (
        lambda store, body, third: _corrupt_and_verify(store),
        _if_old_is_there(lambda store: store.verify("old")),
    ),
}


def done(operation: str, store: ModelStore, body: bytes, third: Path) -> None:
    """The operation's effect, once it finished (at the first try or on a retry)."""
    names = {n for m in store.models() for n in m.names}
    if operation in ("import", "staged"):
        model = store.lookup(local_manifest(third).sha256)
        assert model is not None and model.names == (
            ("third",) if operation == "import" else ("org/third",)
        )
    elif operation == "commit":
        new = store.lookup("org/new@main")
        assert new is not None and new.sha256 == hashlib.sha256(body).hexdigest()
    elif operation in ("remove", "evict", "verify"):
        assert store.lookup("old") is None
    else:
        assert "old" in names
    assert list((store.root / "staging").glob(".gone-*")) == []


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_an_operation_cut_at_any_step_leaves_a_consistent_store(
    operation: str, tmp_path: Path
) -> None:
    run, again = OPERATIONS[operation]
    crashed_at = 0
    for step in range(1, 200):
        tmp = tmp_path / str(step)
        root, body, third = prepare(tmp)
        store = ModelStore(root, reserve_bytes=0, budget_bytes=10**9)
        with crash_at(step) as seen:
            try:
                run(store, body, third)
                finished = True
            except Crash:
                finished = False
        store = consistent(root, content=operation != "verify")
        if finished:
            assert seen[0] < step
            break
        crashed_at += 1
        if again is None:
            run(store, body, third)  # it can be done again, and then holds
        else:
            again(store)
        done(operation, consistent(root), body, third)
        shutil.rmtree(tmp)
    else:
        pytest.fail("the operation never finished")
    done(operation, consistent(root), body, third)
    print(f"{operation}: cut at {crashed_at} steps")
    assert crashed_at >= 3  # it really was cut at several steps


def test_after_a_cut_commit_the_model_is_either_whole_or_absent(tmp_path: Path) -> None:
    outcomes = set()
    for step in range(1, 50):
        root, body, _ = prepare(tmp_path / str(step))
        sha = hashlib.sha256(body).hexdigest()
        with crash_at(step) as seen:
            try:
                ModelStore(root, reserve_bytes=0).commit(body, ["org/new"])
            except Crash:
                pass
        model = consistent(root).lookup(sha)
        outcomes.add(model is not None)
        if model is not None:
            assert_complete(model)
        if seen[0] < step:
            break
    assert outcomes == {False, True}
