"""``python -m skulk.bench distributed`` end to end with a tiny model and tiny counts: real
runner processes (one runner, then pipeline-2, pipeline-3 and tensor-2 groups on loopback),
the sharded features (prefix cache, speculation) and the weight transfer. Checks the shape of
the result, not the numbers (timing is for benchmarks, not tests)."""

from __future__ import annotations

import json
import subprocess
import sys

TINY = ("--tiny", "--rounds", "1", "--max-tokens", "12", "--transfer-mib", "1",
        "--transfer-rounds", "1", "--concurrency", "1,2")  # fmt: skip
SUBJECTS = {"pipeline-2": 2, "pipeline-3": 3, "tensor-2": 2}


def positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def test_distributed_bench_measures_every_sharding() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "skulk.bench", "distributed", "--json", *TINY],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["benchmark"] == "distributed"
    assert result["model"]["layers"] == 4 and result["model"]["dtype"] == "float32"
    assert result["rounds"] == 1 and result["max_tokens"] == 12
    assert result["tokens"] >= 2 and result["prompt_tokens"] > 0
    single = result["single"]
    assert single["ranks"] == 1 and positive(single["tokens_per_s"])
    assert len(single["rss_mib"]) == 1 and positive(single["rss_mib"][0])
    assert set(result["subjects"]) == set(SUBJECTS)
    for name, ranks in SUBJECTS.items():
        figures = result["subjects"][name]
        assert figures["ranks"] == ranks, name
        for key in ("tokens_per_s", "tokens_per_s_ratio", "ttft_ratio", "ms_per_token"):
            assert positive(figures[key]), (name, key)
        for key in ("rss_mib", "rss_ratio", "rss_ideal_ratio", "runtime_rss_mib"):
            assert len(figures[key]) == ranks and all(map(positive, figures[key])), (name, key)
        assert len(figures["cpu_cores"]) == ranks, name
        assert len(figures["by_round"]["tokens_per_s_ratio"]) == 1, name
        assert isinstance(figures["added_ms_per_token"], int | float), name
    assert result["subjects"]["pipeline-2"]["hops"] == 2
    assert result["subjects"]["pipeline-3"]["hops"] == 3
    assert result["subjects"]["tensor-2"]["all_sums_per_token"] == 8
    concurrent = result["concurrent"]  # pipeline-2's aggregate tokens/s by concurrency
    assert set(concurrent["tokens_per_s"]) == set(concurrent["ratio"]) == {"1", "2"}
    assert all(map(positive, concurrent["tokens_per_s"].values()))
    assert concurrent["ratio"]["1"] == 1.0 and len(concurrent["by_round"]["2"]) == 1
    prefix, speculation = result["features"]["prefix"], result["features"]["speculation"]
    assert positive(prefix["ttft_ratio"]) and positive(prefix["prompt_tokens"])
    assert len(prefix["reused_tokens"]) == 1 and positive(prefix["reused_tokens"][0])
    assert set(speculation) == {"demo", "shape"}
    for run in speculation.values():
        assert positive(run["tokens_per_s_ratio"]) and positive(run["single_tokens_per_s_ratio"])
        assert set(run["ms_per_token"]) == {"pipeline-2", "pipeline-2-off", "single", "single-off"}
        assert all(0 <= rate <= 1 for rate in run["acceptance_rate"].values())
        assert run["tokens"] and all(n >= 2 for n in run["tokens"])
    transfer = result["transfer"]
    for key in ("fetch_mb_s", "copy_mb_s", "fetch_vs_copy", "fetch_vs_copy_fsync"):
        assert positive(transfer[key]), key
