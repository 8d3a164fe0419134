"""``python -m skulk.bench load`` end to end with tiny counts: a real node and a real
``mlx_lm.server`` on loopback, two concurrency levels, every mode. Checks the shape of the
result, not the numbers (timing is for benchmarks, not tests)."""

from __future__ import annotations

import json
import subprocess
import sys

from skulk.bench._load import PREFIX_FLAG, SPECULATIVE_FLAG
from skulk.bench._load_servers import node_flags

TINY = ("--levels", "1,2", "--rounds", "1", "--max-tokens", "8", "--chat-chars", "600")
SERVERS = ("skulk", "mlx_lm_server")


def positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value > 0


def test_load_bench_measures_both_servers_and_every_mode() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "skulk.bench", "load", "--json", *TINY],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert result["benchmark"] == "load" and result["model"] == "demo"
    assert result["levels"] == [1, 2] and result["rounds"] == 1 and result["max_tokens"] == 8
    assert set(result["throughput"]) == {"1", "2"}
    for level, figures in result["throughput"].items():
        assert positive(figures["ratio"]), level
        assert figures["goal"] == (1.0 if level == "1" else 1.2)
        assert len(figures["ratio_by_round"]) == 1
        for server in SERVERS:
            side = figures[server]
            for key in ("tokens_per_s", "ttft_p50_ms", "ttft_p99_ms"):
                assert positive(side[key]), (level, server, key)
            assert side["ttft_p99_ms"] >= side["ttft_p50_ms"]
            assert side["tokens"] == [8], (level, server)  # the demo model never stops early
            assert isinstance(side["retries"], int) and side["retries"] >= 0
        assert figures["full_length"] is True
    flags = node_flags()
    for mode, flag in (("prefix", PREFIX_FLAG), ("speculative", SPECULATIVE_FLAG)):
        assert result[mode]["available"] is (flag in flags), mode
        if not result[mode]["available"]:
            assert flag in result[mode]["reason"]
    if result["prefix"]["available"]:
        prefix = result["prefix"]
        assert positive(prefix["ratio"]) and prefix["goal"] == 0.3
        assert prefix["prompt_tokens"][1] > prefix["prompt_tokens"][0] > 0
        assert len(prefix["cached_ttft_ms"]) == len(prefix["uncached_ttft_ms"]) == 2
    if result["speculative"]["available"]:
        for kind in ("copy", "free"):
            figures = result["speculative"][kind]
            assert positive(figures["ratio"]) and positive(figures["plain_tokens_per_s"]), kind
            assert len(figures["ratio_by_round"]) == 1, kind


def test_the_sampled_sweep_measures_every_server_at_every_setting() -> None:
    """``--modes sharegpt``: the sampled workload through Skulk, Skulk without speculation
    and mlx_lm.server, one concurrency level and one Poisson rate, tiny counts."""
    done = subprocess.run(
        [sys.executable, "-m", "skulk.bench", "load", "--json", "--modes", "sharegpt",
         "--levels", "2", "--rates", "8", "--requests", "4", "--rounds", "1"],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    sweep = json.loads(done.stdout)["sharegpt"]
    assert "error" not in sweep, sweep
    assert sweep["baseline"] == "mlx_lm_server" and sweep["requests"] == 4
    assert sweep["shape"]["temperature"] == 0.7 and sweep["slo"]["ttft_s"] > 0
    for setting in ("c2", "rate8"):
        entry = sweep[setting]
        for server in ("skulk", "skulk-no-spec", "mlx_lm_server"):
            figures = entry[server]
            assert figures["requests"] == 4, (setting, server)
            assert positive(figures["output_tokens_per_s"]), (setting, server)
            assert figures["ttft_ms"]["p99"] >= figures["ttft_ms"]["p50"] > 0
            assert 0 <= figures["goodput_share"] <= 1
        for server in ("skulk", "skulk-no-spec"):
            ratios = entry[f"{server}_vs_mlx_lm_server"]
            assert set(ratios) == {"output_tokens_per_s", "ttft_p99", "goodput_per_s"}
            assert positive(ratios["output_tokens_per_s"]) and positive(ratios["ttft_p99"])


def test_the_routing_mode_measures_both_policies_on_two_clusters() -> None:
    """``--modes routing``: two three-node clusters (prefix-aware and least-loaded routing), two
    instances each, one round of two conversations. Prefix routing sends both turns of every
    conversation to one instance, whose prefix cache then serves the first turn's prompt."""
    done = subprocess.run(
        [sys.executable, "-m", "skulk.bench", "load", "--json", "--modes", "routing",
         "--rounds", "1", "--conversations", "2", "--chat-chars", "600"],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout)
    assert set(result) >= {"routing", "load_average"} and "throughput" not in result
    routing = result["routing"]
    assert routing["available"] is True, routing
    assert routing["goal"] == 0.3 and routing["conversations"] == 2
    assert positive(routing["ratio_p50"]) and len(routing["ratio_p50_by_round"]) == 1
    for policy in ("prefix", "least-loaded"):
        figures = routing[policy]
        assert figures["conversations"] == 2, policy
        assert figures["ttft_p99_ms"] >= figures["ttft_p50_ms"] > 0, policy
        assert set(figures["instance_shares"]) <= {"b", "c"}, policy  # both turns named one
        assert sum(figures["instance_shares"].values()) == 1.0, policy
        assert 0 <= figures["same_instance_share"] <= 1, policy
    prefix = routing["prefix"]
    assert prefix["same_instance_share"] == 1.0
    assert prefix["cached_tokens"] > prefix["prompt_tokens"] // 2
