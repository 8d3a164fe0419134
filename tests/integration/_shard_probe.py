"""One rank of a sharded model, run as a plain process to capture logits (test helper).

python -m tests.integration._shard_probe MODEL SHARDING RANK HOSTS START END TOKENS OUT

HOSTS: comma-separated ``host:port`` of every rank; TOKENS: comma-separated token ids. The rank
joins the ring, loads its shard with the runner's own code (``skulk.engine._shard``), prefills
``TOKENS[:-PROBE_STEPS - 1]`` in the runner's chunks and then runs ``PROBE_STEPS + 1`` decode
steps, feeding the following tokens (teacher forcing, so every rank runs the same steps). The
rank that samples saves the logits of every decode step to OUT (``.npy``, one row per step).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from skulk.engine._engine import PREFILL_STEP
from skulk.engine._shard import check_sharding, load_shard, open_model
from skulk.engine._sharded import join_group
from skulk.wire.runner import ShardSpec

PROBE_STEPS = 4


class Recorder:
    """Stands in for the sampler: keeps the logits, picks the argmax."""

    def __init__(self) -> None:
        self.rows: list[Any] = []

    def __call__(self, logits: mx.array) -> mx.array:
        self.rows.append(logits)
        return mx.argmax(logits, axis=-1)


def main(argv: list[str]) -> int:
    model_dir, sharding, rank, hosts, start, end, tokens_arg, out = argv
    tokens = [int(t) for t in tokens_arg.split(",")]
    spec = ShardSpec(
        sharding,  # type: ignore[arg-type]
        int(rank),
        tuple(hosts.split(",")),
        int(start),
        int(end),
        connect_timeout=30,
        collective_timeout=30,
    )
    model, config = open_model(Path(model_dir))
    check_sharding(model, config, spec)
    group = join_group(spec)
    shard = load_shard(model, config, spec, group, lambda n, total: None)
    recorder = Recorder() if shard.sampling else None
    samplers = None if recorder is None else [recorder]  # a batch of one row
    cache = shard.new_cache()
    prompt, forced = tokens[: -PROBE_STEPS - 1], tokens[-PROBE_STEPS - 1 :]
    while len(prompt) > 1:
        n = min(PREFILL_STEP, len(prompt) - 1)
        chunk = mx.array(prompt[:n], dtype=mx.int32)[None]
        mx.eval(shard.prefill(chunk, cache))
        prompt = prompt[n:]
    for token in [prompt[0], *forced[:-1]]:
        work, _ = shard.decode(mx.array([[token]], dtype=mx.int32), cache, samplers)  # type: ignore[arg-type]
        mx.eval(work)
    if recorder is not None:
        rows = mx.concatenate(recorder.rows, axis=0).astype(mx.float32)
        np.save(out, np.array(rows))
    mx.eval(mx.distributed.all_sum(mx.array([1]), group=group))  # leave together
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
