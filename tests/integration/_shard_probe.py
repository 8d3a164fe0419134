"""One rank of a sharded model, run as a plain process to capture logits (test helper).

python -m tests.integration._shard_probe MODEL SHARDING RANK HOSTS START END TOKENS OUT

HOSTS: comma-separated ``host:port`` of every rank; TOKENS: comma-separated token ids. The rank
joins the ring, loads its shard with the runner's own code (``skulk.engine._shard``), prefills
``TOKENS[:-PROBE_STEPS - 1]`` in the runner's chunks and then runs ``PROBE_STEPS + 1`` decode
steps, feeding the following tokens (teacher forcing, so every rank runs the same steps). Rank
0, where the logits come out, saves those of every decode step to OUT (``.npy``, one row per
step); the other ranks run their part of each pass (``Shard.follow``).
"""

from __future__ import annotations

import sys
from pathlib import Path

import mlx.core as mx
import numpy as np

from skulk.engine._budget import PREFILL_STEP
from skulk.engine._shard import check_sharding, load_shard, open_model
from skulk.engine._sharded import join_group
from skulk.wire.runner import ShardSpec

PROBE_STEPS = 4


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
    lead = spec.rank == 0
    cache = shard.new_cache()
    prompt, forced = tokens[: -PROBE_STEPS - 1], tokens[-PROBE_STEPS - 1 :]
    while len(prompt) > 1:
        n = min(PREFILL_STEP, len(prompt) - 1)
        if lead:
            shard.fill(mx.array(prompt[:n], dtype=mx.int32)[None], cache)
        else:
            shard.follow(1, n, cache, back=False)
        prompt = prompt[n:]
    rows = []
    for token in [prompt[0], *forced[:-1]]:
        if lead:
            logits = shard.logits(mx.array([[token]], dtype=mx.int32), cache)[:, -1, :]
            mx.eval(logits)
            rows.append(logits)
        else:
            shard.follow(1, 1, cache, back=True)
    if lead:
        np.save(out, np.array(mx.concatenate(rows, axis=0).astype(mx.float32)))
    mx.eval(mx.distributed.all_sum(mx.array([1]), group=group))  # leave together
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
