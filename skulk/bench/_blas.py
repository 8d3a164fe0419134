"""``python -m skulk.bench blas``: what ``--cpu-blas openblas`` buys on this CPU.

Each measurement runs in a fresh ``python`` process, with the runners' OpenBLAS copy in
``LD_PRELOAD`` or without it (a preload only takes at process start), in interleaved rounds;
medians are reported:

* ``matmul_ms``: one float32 ``(512, 512) @ (512, 1536)`` product, the shape of an MLP layer of
  the large generated model;
* ``prefill_tokens_s``: a forward pass over a ``--prompt-tokens`` prompt (random token ids, a new
  draw each round) through that model (12 layers, hidden 512: ``bench distributed``'s default
  llama), with mlx-lm in the process — what a runner's prefill costs, and what ``mlx_lm.server``
  on the same BLAS would pay;
* ``decode_tokens_s``: 32 single-token steps after that prompt, with the KV cache (decode is
  matrix-vector work: BLAS matters less there).

The ratios are ``openblas ÷ reference``: the goal for prefill is ≥ 10.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = """
import json, sys, time
import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache
model, _ = load(sys.argv[1])
prompt_tokens, seed = int(sys.argv[2]), int(sys.argv[3])
a, b = mx.random.normal((512, 512)), mx.random.normal((512, 1536))
mx.eval(a @ b)
t = time.perf_counter(); mx.eval(a @ b); matmul = time.perf_counter() - t
mx.random.seed(seed)
tokens = mx.random.randint(0, 1000, (1, prompt_tokens))
cache = make_prompt_cache(model)
mx.eval(model(tokens[:, :8], cache=make_prompt_cache(model)))  # warm the kernels
t = time.perf_counter(); logits = model(tokens, cache=cache); mx.eval(logits)
prefill = time.perf_counter() - t
step = mx.argmax(logits[:, -1:], axis=-1)
t = time.perf_counter()
for _ in range(32):
    logits = model(step, cache=cache)
    step = mx.argmax(logits[:, -1:], axis=-1)
    mx.eval(step)
decode = time.perf_counter() - t
print(json.dumps({"matmul_ms": matmul * 1000, "prefill_tokens_s": prompt_tokens / prefill,
                  "decode_tokens_s": 32 / decode}))
"""

FIGURES = ("matmul_ms", "prefill_tokens_s", "decode_tokens_s")


def _probe(model: Path, prompt_tokens: int, seed: int, preload: str) -> dict[str, float]:
    from skulk.runner import preload_env

    done = subprocess.run(
        [sys.executable, "-c", PROBE, str(model), str(prompt_tokens), str(seed)],
        env=preload_env(preload, dict(os.environ)),
        capture_output=True,
        text=True,
        check=True,
        timeout=900,
    )
    figures: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return figures


def run(rounds: int, prompt_tokens: int) -> dict[str, object]:
    from skulk.bench._distributed_setup import DEFAULT_SHAPE
    from skulk.models import ensure_demo_model, write_generated_model
    from skulk.runner import openblas_library

    with tempfile.TemporaryDirectory(prefix="skulk-bench-blas-") as tmp:
        root = Path(tmp)
        demo = ensure_demo_model(root / "home")
        model = write_generated_model(root / "large", DEFAULT_SHAPE, demo, seed=1)
        library = str(openblas_library(root / "cache"))
        samples: dict[str, list[dict[str, float]]] = {"reference": [], "openblas": []}
        for seed in range(rounds):  # interleaved, each round a new prompt for both
            samples["reference"].append(_probe(model, prompt_tokens, seed, ""))
            samples["openblas"].append(_probe(model, prompt_tokens, seed, library))
    medians = {
        blas: {f: statistics.median(s[f] for s in runs) for f in FIGURES}
        for blas, runs in samples.items()
    }
    ref, fast = medians["reference"], medians["openblas"]
    return {
        "rounds": rounds,
        "prompt_tokens": prompt_tokens,
        "cpus": os.cpu_count(),
        "reference": ref,
        "openblas": fast,
        "matmul_speedup": ref["matmul_ms"] / fast["matmul_ms"],
        "prefill_ratio": fast["prefill_tokens_s"] / ref["prefill_tokens_s"],
        "decode_ratio": fast["decode_tokens_s"] / ref["decode_tokens_s"],
    }


def main(args: argparse.Namespace) -> int:
    result = run(args.rounds, args.prompt_tokens)
    if args.json:
        print(json.dumps(result))
        return 0
    ref, fast = result["reference"], result["openblas"]
    assert isinstance(ref, dict) and isinstance(fast, dict)
    print(f"{'figure':<18}{'reference':>12}{'openblas':>12}")
    for figure in FIGURES:
        print(f"{figure:<18}{ref[figure]:>12.1f}{fast[figure]:>12.1f}")
    print(
        f"matmul {result['matmul_speedup']:.1f}x faster, prefill x{result['prefill_ratio']:.1f}, "
        f"decode x{result['decode_ratio']:.2f} (openblas / reference, medians of "
        f"{result['rounds']} rounds)"
    )
    return 0
