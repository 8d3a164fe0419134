"""The sampled workload of ``bench load --modes sharegpt`` and its report (sans-IO)."""

from __future__ import annotations

import math
import statistics

import pytest

from skulk.bench._load_workload import (
    SHAREGPT,
    Outcome,
    Slo,
    percentile,
    poisson_offsets,
    summarize,
    workload,
)


def test_the_workload_is_seeded_varied_and_within_its_shape() -> None:
    a, b = workload(7, 400), workload(7, 400)
    assert a == b and workload(8, 400) != a
    words = [len(r.prompt.split()) - 2 for r in a]  # less the "Request 7-i:" opening
    outputs = [r.max_tokens for r in a]
    assert min(words) >= SHAREGPT.prompt_low and max(words) <= SHAREGPT.prompt_high
    assert min(outputs) >= SHAREGPT.output_low and max(outputs) <= SHAREGPT.output_high
    # log-normal around the stated medians, heavy-tailed (the mean above the median)
    assert 0.8 < statistics.median(words) / SHAREGPT.prompt_median < 1.25
    assert 0.8 < statistics.median(outputs) / SHAREGPT.output_median < 1.25
    assert statistics.fmean(words) > statistics.median(words)
    assert len({r.prompt.split(":")[0] for r in a}) == 400  # no two share an opening
    assert len({r.seed for r in a}) > 390


def test_poisson_arrivals_have_the_rate_asked() -> None:
    offsets = poisson_offsets(3, 4.0, 2000)
    assert offsets == sorted(offsets) and offsets[0] == 0.0
    assert 0.9 < (len(offsets) - 1) / offsets[-1] / 4.0 < 1.1
    with pytest.raises(ValueError, match="rate"):
        poisson_offsets(3, 0.0, 10)


def test_the_report_counts_ttft_tpot_itl_and_goodput() -> None:
    fast = Outcome(sent=0.0, chunks=(0.2, 0.25, 0.3), end=0.3, tokens=3)  # TPOT 50 ms
    slow_start = Outcome(sent=0.0, chunks=(2.0, 2.1), end=2.1, tokens=2)  # TTFT 2 s
    slow_tokens = Outcome(sent=1.0, chunks=(1.1, 1.6), end=2.1, tokens=3)  # TPOT 500 ms
    report = summarize([fast, slow_start, slow_tokens], wall_s=2.0, slo=Slo(1.0, 0.1))
    assert report["requests"] == 3 and report["requests_per_s"] == 1.5
    assert report["output_tokens_per_s"] == 4.0
    assert report["ttft_ms"] == {"mean": 766.67, "p50": 200.0, "p99": 2000.0}
    assert report["tpot_ms"]["p50"] == 100.0 and report["tpot_ms"]["p99"] == 500.0
    assert report["itl_ms"]["p99"] == 500.0
    assert report["goodput_share"] == round(1 / 3, 3) and report["goodput_per_s"] == 0.5


def test_percentiles_are_nearest_rank() -> None:
    values = list(range(1, 101))
    assert percentile(values, 50) == 50 and percentile(values, 99) == 99
    assert percentile([5.0], 99) == 5.0 and math.isnan(percentile([], 50))
