"""``--cpu-blas openblas`` (:mod:`skulk.runner._blas`): the OpenBLAS copy the runners preload
exports what mlx imports, mlx's calls bind to it, its results agree with the reference BLAS
within a tolerance (not bit for bit: the documented trade-off), and a runner started with it
loads OpenBLAS and serves."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from skulk.config import ServeConfig, add_serve_arguments, serve_config
from skulk.models import ensure_demo_model
from skulk.runner import (
    CpuBlasUnavailable,
    Runner,
    RunnerConfig,
    openblas_library,
    preload_env,
)
from skulk.wire.runner import Finished, SamplingParams, TextPrompt


@pytest.fixture(scope="module")
def library(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return openblas_library(tmp_path_factory.mktemp("cache") / "blas")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_demo_model(tmp_path_factory.mktemp("home"))


#: Logits of the demo model for one prompt, and a product whose kernel OpenBLAS must run.
PROBE = """
import json, sys
import mlx.core as mx
from mlx_lm import load
model, tokenizer = load(sys.argv[1])
tokens = mx.array([tokenizer.encode("the quick brown fox jumps over the lazy dog")])
logits = model(tokens)[0, -1].astype(mx.float32)
mx.random.seed(7)
a, b = mx.random.normal((256, 256)), mx.random.normal((256, 384))
print(json.dumps({"logits": logits.tolist(), "product": (a @ b).sum().item()}))
"""


def probe(model: Path, env: dict[str, str]) -> tuple[dict[str, object], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(model)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


def test_the_copy_exports_what_mlx_imports_and_is_written_once(
    library: Path, tmp_path: Path
) -> None:
    import lief

    parsed = lief.parse(str(library))
    assert parsed is not None
    symbols = {s.name for s in parsed.exported_symbols}
    assert "cblas_sgemm" in symbols and "sgetrf_" in symbols
    assert "scipy_cblas_sgemm" in symbols  # the wheel's own names stay: OpenBLAS calls them
    again = openblas_library(library.parent)
    assert again == library and again.stat().st_mtime_ns == library.stat().st_mtime_ns
    assert not list(library.parent.glob(".*.partial"))


def test_mlx_binds_to_openblas_and_agrees_with_the_reference_within_a_tolerance(
    library: Path, model_dir: Path
) -> None:
    reference, _ = probe(model_dir, dict(os.environ))
    env = preload_env(str(library), {**os.environ, "LD_DEBUG": "bindings"})
    fast, bindings = probe(model_dir, env)
    bound = [line for line in bindings.splitlines() if "`cblas_sgemm'" in line]
    assert bound and all(library.name in line for line in bound), bound[:3]
    ref, got = reference["logits"], fast["logits"]
    assert isinstance(ref, list) and isinstance(got, list) and len(ref) == len(got)
    scale = max(abs(x) for x in ref)
    assert max(abs(x - y) for x, y in zip(ref, got, strict=True)) <= 1e-4 * scale
    assert max(range(len(ref)), key=ref.__getitem__) == max(range(len(got)), key=got.__getitem__)
    assert fast["product"] == pytest.approx(reference["product"], rel=1e-4, abs=1e-2)


async def test_a_runner_started_with_it_loads_openblas_and_serves(
    library: Path, model_dir: Path
) -> None:
    runner = Runner("skulk-demo", str(model_dir), RunnerConfig(preload=str(library)))
    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            await nursery.start(runner.run)
            pid = runner.statistics().pid
            assert pid is not None
            maps = await trio.Path(f"/proc/{pid}/maps").read_text()
            assert str(library) in maps
            params = SamplingParams(max_tokens=8, seed=3, temperature=0.7)
            async with runner.open_request("r", TextPrompt("once upon"), params) as events:
                last = [event async for event in events][-1]
            assert isinstance(last, Finished)
            nursery.cancel_scope.cancel()


def test_without_the_extra_it_is_a_clear_startup_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setitem(sys.modules, "lief", None)  # import lief now raises ImportError
    with pytest.raises(CpuBlasUnavailable, match=r"skulk\[cpu-blas\]"):
        openblas_library(tmp_path)
    assert not tmp_path.exists() or not any(tmp_path.iterdir())


def parse(argv: list[str], env: dict[str, str] | None = None) -> ServeConfig:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return serve_config(parser.parse_args(argv), env or {})


def test_the_option_takes_reference_or_openblas() -> None:
    assert parse([]).cpu_blas == "reference"
    assert parse([], {"SKULK_CPU_BLAS": "openblas"}).cpu_blas == "openblas"
    assert parse(["--cpu-blas", "openblas"]).cpu_blas == "openblas"
    with pytest.raises(ValueError, match=r"--cpu-blas.*reference or openblas"):
        parse(["--cpu-blas", "mkl"])


def test_preload_goes_first_and_nothing_changes_without_one() -> None:
    assert preload_env("", {"A": "1"}) == {"A": "1"}
    assert preload_env("/x.so", {}) == {"LD_PRELOAD": "/x.so", "OPENBLAS_NUM_THREADS": "1"}
    assert preload_env("/x.so", {"LD_PRELOAD": "/y.so"})["LD_PRELOAD"] == "/x.so:/y.so"
    assert preload_env("/x.so", {"OPENBLAS_NUM_THREADS": "4"})["OPENBLAS_NUM_THREADS"] == "4"
