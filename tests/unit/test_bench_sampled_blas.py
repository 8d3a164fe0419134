"""The pure pieces of ``bench serve --temperature`` (:mod:`skulk.bench._serve`) and of
``bench load --modes blas`` (:mod:`skulk.bench._load_blas`): the prompt plan, the request body,
the summary of pairs, the turn order, the ratios, the preload check and the arguments."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from skulk.bench.__main__ import main
from skulk.bench._load_blas import descendants, maps_library, preloaded
from skulk.bench._load_modes import default_levels, ratios, turns
from skulk.bench._load_servers import MlxLmServer, Server
from skulk.bench._serve import PROMPT, Run, plan, prompts, request_body, summary
from skulk.runner import preload_env


def test_prompts_are_different_and_the_same_for_the_same_seed() -> None:
    ten = prompts(10, seed=3)
    assert len(set(ten)) == 10
    assert prompts(10, seed=3) == ten
    assert prompts(10, seed=4) != ten
    assert not any(p != q and q.startswith(p) for p in ten for q in ten)
    with pytest.raises(ValueError, match="different prompts"):
        prompts(10_000, seed=0)


def test_greedy_keeps_one_prompt_and_sampling_varies_prompt_and_seed_per_pair() -> None:
    assert plan(3, 0.0, seed=5) == [(PROMPT, 5)] * 4
    sampled = plan(3, 0.7, seed=5)
    assert len(sampled) == 4  # the warm-up, then one per pair
    assert len({text for text, _ in sampled}) == 4
    assert [seed for _, seed in sampled] == [5, 6, 7, 8]
    assert plan(3, 0.7, seed=5) == sampled


def test_the_request_carries_temperature_and_a_seed_only_when_sampling() -> None:
    greedy = request_body("hi", 8, 0.0, seed=9)
    assert greedy["temperature"] == 0.0 and "seed" not in greedy
    sampled = request_body("hi", 8, 0.7, seed=9)
    assert sampled["temperature"] == 0.7 and sampled["seed"] == 9
    assert sampled["messages"] == [{"role": "user", "content": "hi"}]
    assert sampled["max_tokens"] == 8 and sampled["stream"] is True


def test_the_summary_rates_decode_and_leaves_out_runs_without_one() -> None:
    pairs = [
        (Run(0.010, 100, 500.0), Run(0.012, 100, 450.0)),
        (Run(0.010, 40, 400.0), Run(0.011, 60, 440.0)),  # sampled: ended early, apart
        (Run(0.010, 1, 0.0), Run(0.012, 30, 300.0)),  # one token: no decode rate
    ]
    out = summary(pairs, max_tokens=100, temperature=0.7, seed=2)
    assert out["rated_pairs"] == 2
    assert out["tokens_per_s_ratio"] == pytest.approx((0.9 + 1.1) / 2, abs=1e-3)
    assert out["skulk_tokens"] == [100, 60, 30] and out["mlx_lm_tokens"] == [100, 40, 1]
    assert out["prompts"] == "varied" and out["seed"] == 2 and out["temperature"] == 0.7
    none = summary([(Run(0.01, 1, 0.0), Run(0.01, 1, 0.0))], 8, 0.7, 0)
    assert none["rated_pairs"] == 0 and none["tokens_per_s_ratio"] is None
    greedy = summary(pairs[:1], 100, 0.0, 2)
    assert greedy["prompts"] == "fixed" and greedy["seed"] is None


def test_servers_take_turns_in_a_rotating_order() -> None:
    a, b, c = (Server(n, "http://x", "m") for n in "abc")
    assert [turns((a, b), r) for r in range(3)] == [[a, b], [b, a], [a, b]]
    assert [[s.name for s in turns((a, b, c), r)] for r in range(4)] == [
        list("abc"), list("bca"), list("cab"), list("abc"),
    ]  # fmt: skip


def test_ratios_are_medians_of_per_round_ratios() -> None:
    rates = {"fast": [30.0, 10.0, 40.0], "slow": [10.0, 10.0, 10.0]}
    assert ratios(rates, "fast", "slow") == {"ratio": 3.0, "ratio_by_round": [3.0, 1.0, 4.0]}


def test_blas_alone_defaults_to_eight_streams() -> None:
    assert default_levels(("blas",)) == (8,)
    assert default_levels(("throughput", "blas")) == (1, 8, 16)
    assert default_levels(("throughput",)) == (1, 8, 16)


def test_a_process_tree_is_found_from_its_parents() -> None:
    parents = {1: 0, 10: 1, 11: 10, 12: 11, 20: 1, 21: 20}
    assert descendants(10, parents) == {10, 11, 12}
    assert descendants(12, parents) == {12}
    assert descendants(99, parents) == {99}


def test_a_library_is_found_in_a_maps_text_by_file_name() -> None:
    maps = (
        "7f00-7f10 r-xp 00000000 08:01 123 /cache/blas/libopenblas-0.3-abc.so\n"
        "7f10-7f20 rw-p 00000000 00:00 0 \n"
        "7f20-7f30 r--p 00000000 08:01 124 /usr/lib/libc.so.6\n"
    )
    assert maps_library(maps, "libopenblas-0.3-abc.so")
    assert not maps_library(maps, "libopenblas-0.3-abd.so")
    assert not maps_library(maps, "blas")  # a file name, not a substring
    assert not maps_library("", "libc.so.6")


CHILD = "import ctypes, sys; ctypes.CDLL(sys.argv[1]); print('ready', flush=True); input()"


def test_the_preload_check_finds_a_library_only_a_descendant_maps(tmp_path: Path) -> None:
    import _ctypes

    library = tmp_path / "libskulk-test-only-here.so"  # a file name no other process maps
    shutil.copy(_ctypes.__file__, library)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(library)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert not maps_library(Path("/proc/self/maps").read_text(), library.name)
        assert preloaded(os.getpid(), library.name) is True  # through the child
        assert preloaded(child.pid, library.name) is True
        assert preloaded(os.getpid(), "libnothing-such-0.so") is False
        assert preloaded(None, library.name) is None
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(30)


def test_mlx_lm_server_gets_the_environment_it_is_given() -> None:
    env = preload_env("/x/libopenblas.so", {"PATH": "/bin"})
    assert MlxLmServer(Path("/m"), env=env).env == {
        "PATH": "/bin",
        "LD_PRELOAD": "/x/libopenblas.so",
        "OPENBLAS_NUM_THREADS": "1",
    }
    assert MlxLmServer(Path("/m")).env == dict(os.environ)


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--temperature", "-0.5"],
        ["serve", "--temperature", "hot"],
        ["serve", "--seed", "-1"],
        ["serve", "--model", "huge"],
        ["load", "--modes", "throughput,bls"],
    ],
)
def test_bad_arguments_are_refused_naming_the_option(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    assert argv[1] in capsys.readouterr().err
