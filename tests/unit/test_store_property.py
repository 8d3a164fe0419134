"""A property of the model store: over any sequence of import / remove / touch / ensure_room
(with random budgets and models in use), every stored model is complete with all its blobs,
no blob is left that no model uses, the byte accounting equals the blobs on disk, a model in
use is never removed or evicted, and a refused ensure_room changes nothing."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skulk.models import local_manifest
from skulk.store import ModelInUse, ModelStore, NotStored, StoreFull
from tests.unit.test_store import Clock, assert_complete, blob_files, make_model, safetensors

#: Weight files shared between the pool's models (1, 2 and 3 KiB of data).
_WEIGHTS = {k: safetensors(bytes([k]) * 1024 * k) for k in (1, 2, 3)}
#: The pool: which weights each model has and its tokenizer; model 4 is model 0 elsewhere.
_POOL = [((1, 2), b"{}"), ((2, 3), b"{}"), ((1,), b'{"x":1}'), ((3,), b'{"y":2}'), ((1, 2), b"{}")]


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("store-pool")
    return [
        make_model(
            root / f"copy{i}" / f"m{i}",
            {
                **{f"w{k}.safetensors": _WEIGHTS[k] for k in weights},
                "tokenizer.json": tok,
            },
        )
        for i, (weights, tok) in enumerate(_POOL)
    ]


MODEL = st.integers(0, len(_POOL) - 1)
IN_USE = st.sets(MODEL, max_size=2)
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("import"), MODEL),
        st.tuples(st.just("remove"), MODEL, IN_USE),
        st.tuples(st.just("touch"), MODEL),
        st.tuples(st.just("room"), st.integers(0, 12_000), IN_USE),
    ),
    max_size=14,
)


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=OPS, budget=st.one_of(st.none(), st.integers(0, 20_000)))
def test_store_invariants_hold_over_any_sequence(
    pool: list[Path], ops: list[tuple[object, ...]], budget: int | None
) -> None:
    shas = [local_manifest(p).sha256 for p in pool]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "store"
        store = ModelStore(root, budget, reserve_bytes=0, clock=Clock())
        for op in ops:
            before = {m.sha256 for m in store.models()}
            if op[0] == "import":
                i = op[1]
                assert isinstance(i, int)
                store.import_directory(pool[i], f"m{i}")
                assert store.lookup(f"m{i}") == store.lookup(shas[i])
            elif op[0] == "remove":
                i, use = op[1], op[2]
                assert isinstance(i, int) and isinstance(use, set)
                in_use = {shas[u] for u in use}
                try:
                    store.remove(shas[i], in_use=in_use)
                    assert shas[i] in before and shas[i] not in in_use
                except NotStored:
                    assert shas[i] not in before
                except ModelInUse:
                    assert shas[i] in before and shas[i] in in_use
                assert {m.sha256 for m in store.models()} == before - ({shas[i]} - in_use)
            elif op[0] == "touch":
                i = op[1]
                assert isinstance(i, int)
                if shas[i] in before:
                    assert store.touch(shas[i]).last_used == max(
                        m.last_used for m in store.models()
                    )
            else:
                nbytes, use = op[1], op[2]
                assert isinstance(nbytes, int) and isinstance(use, set)
                in_use = {shas[u] for u in use}
                blobs_before = blob_files(root)
                try:
                    evicted = store.ensure_room(nbytes, in_use=in_use)
                except StoreFull as full:
                    assert full.needed == nbytes > full.available
                    assert {m.sha256 for m in store.models()} == before
                    assert blob_files(root) == blobs_before
                else:
                    assert not {m.sha256 for m in evicted} & in_use
                    assert {m.sha256 for m in store.models()} == before - {
                        m.sha256 for m in evicted
                    }
                    if budget is not None:
                        assert store.used_bytes() + nbytes <= budget
            check_invariants(store, root)
        reopened = ModelStore(root, budget, reserve_bytes=0)
        assert [m.sha256 for m in reopened.models()] == [m.sha256 for m in store.models()]
        assert [m.names for m in reopened.models()] == [m.names for m in store.models()]
        check_invariants(reopened, root)


def check_invariants(store: ModelStore, root: Path) -> None:
    used: dict[str, int] = {}
    for model in store.models():
        assert_complete(model)
        files = local_manifest(model.directory).manifest.files
        model_blobs = {f.sha256.hex(): f.size for f in files}
        assert model.size == sum(model_blobs.values())
        used.update(model_blobs)
    on_disk = blob_files(root)
    assert on_disk == used  # every model's blobs are there, and no orphan is
    assert store.used_bytes() == sum(on_disk.values())
    assert sorted(p.name for p in (root / "models").iterdir()) == sorted(used_models(store))


def used_models(store: ModelStore) -> list[str]:
    return [m.sha256 for m in store.models()]
