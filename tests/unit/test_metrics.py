"""The metrics package without a node: the weighted histogram, one node's registry and its
sources, and a request observer's counts."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families

from skulk.metrics import NodeMetrics
from skulk.metrics._histogram import WeightedHistogram
from skulk.wire.runner import GenerationEnd, Usage


def samples(metrics: NodeMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape, parsed back with prometheus_client's own parser."""
    text = metrics.exposition().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(metrics: NodeMetrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, frozenset(labels.items())))


# ---- the weighted histogram ------------------------------------------------------------------


def test_weighted_histogram_adds_count_observations_in_their_bucket() -> None:
    h = WeightedHistogram("skulk:x_seconds", "x", ("model",), (0.1, 1.0))
    h.observe(("m",), 0.1, 3)  # on a bound: in that bucket (le is inclusive)
    h.observe(("m",), 0.5, 2)
    h.observe(("m",), 7.0)
    h.observe(("m",), math.nan, 5)  # not a number: nothing
    h.observe(("m",), 0.5, 0)  # no observations: nothing
    (family,) = h.collect()
    got = {(s.name, s.labels.get("le")): s.value for s in family.samples}
    assert got[("skulk:x_seconds_bucket", "0.1")] == 3
    assert got[("skulk:x_seconds_bucket", "1.0")] == 5
    assert got[("skulk:x_seconds_bucket", "+Inf")] == 6
    assert got[("skulk:x_seconds_count", None)] == 6
    assert got[("skulk:x_seconds_sum", None)] == pytest.approx(0.3 + 1.0 + 7.0)


def test_weighted_histogram_refuses_wrong_labels_and_bad_buckets() -> None:
    h = WeightedHistogram("skulk:x", "x", ("model", "instance"), (1.0,))
    with pytest.raises(ValueError, match="takes labels"):
        h.observe(("m",), 1.0)
    with pytest.raises(ValueError, match="buckets"):
        WeightedHistogram("skulk:y", "y", (), (1.0, 1.0))
    with pytest.raises(ValueError, match="buckets"):
        WeightedHistogram("skulk:y", "y", (), (math.inf,))


# ---- one node's registry ---------------------------------------------------------------------


def test_each_node_has_its_own_registry_with_process_metrics() -> None:
    a, b = NodeMetrics(), NodeMetrics()
    a.requests.refused("m", "", "none", "not_ready")
    assert value(a, "skulk:request_errors_total", model="m", instance="", route="none",
                 reason="not_ready") == 1  # fmt: skip
    assert value(b, "skulk:request_errors_total", model="m", instance="", route="none",
                 reason="not_ready") is None  # fmt: skip
    names = {name for name, _ in samples(a)}
    assert "python_gc_collections_total" in names
    assert "python_info" in names
    assert "process_cpu_seconds_total" in names  # Linux: the process collector has /proc


def test_a_failing_source_is_left_out_and_the_others_still_show() -> None:
    metrics = NodeMetrics()

    def broken() -> Iterator[Metric]:
        raise RuntimeError("a bug in a source")

    def fine() -> Iterator[Metric]:
        yield GaugeMetricFamily("skulk:fine", "fine", value=7)

    metrics.set_source("a", broken)
    metrics.set_source("b", fine)
    assert value(metrics, "skulk:fine") == 7
    metrics.set_source("b", lambda: [GaugeMetricFamily("skulk:fine", "fine", value=8)])
    assert value(metrics, "skulk:fine") == 8  # replaced, not doubled


# ---- a request's observations ----------------------------------------------------------------

MI = {"model": "m", "instance": "i1"}


def test_a_finished_request_counts_its_tokens_latencies_and_finish_reason() -> None:
    metrics = NodeMetrics()
    observed = metrics.requests.start("m", "i1", "local")
    end = GenerationEnd(
        "length", Usage(prompt_tokens=5, completion_tokens=4, cached_tokens=2), queue_seconds=0.2
    )
    for item in ("a", "b", end):
        observed.item(item)
    observed.failed("abandoned")  # the consumer closing after the end counts nothing more
    observed.item(end)
    routed = {**MI, "route": "local"}
    assert value(metrics, "skulk:prompt_tokens_total", **routed) == 5
    assert value(metrics, "skulk:generation_tokens_total", **routed) == 4
    assert value(metrics, "skulk:request_success_total", **routed, finish_reason="length") == 1
    assert value(metrics, "skulk:request_errors_total", **routed, reason="abandoned") is None
    assert value(metrics, "skulk:time_to_first_token_seconds_count", **MI) == 1
    assert value(metrics, "skulk:e2e_request_latency_seconds_count", **MI) == 1
    assert value(metrics, "skulk:inter_token_latency_seconds_count", **MI) == 3  # 4 tokens
    assert value(metrics, "skulk:request_queue_time_seconds_sum", **MI) == 0.2
    assert value(metrics, "skulk:request_queue_time_seconds_bucket", **MI, le="0.1") == 0
    assert value(metrics, "skulk:request_queue_time_seconds_bucket", **MI, le="0.25") == 1


def test_a_failed_request_counts_one_error_by_reason_and_no_tokens() -> None:
    metrics = NodeMetrics()
    observed = metrics.requests.start("m", "i1", "remote")
    observed.item("a")
    observed.failed("runner_crashed")
    observed.failed("abandoned")
    routed = {**MI, "route": "remote"}
    assert value(metrics, "skulk:request_errors_total", **routed, reason="runner_crashed") == 1
    assert value(metrics, "skulk:request_errors_total", **routed, reason="abandoned") is None
    assert value(metrics, "skulk:prompt_tokens_total", **routed) is None
    assert value(metrics, "skulk:time_to_first_token_seconds_count", **MI) is None


def test_a_request_that_ends_without_text_has_a_ttft_and_no_inter_token_latency() -> None:
    metrics = NodeMetrics()
    observed = metrics.requests.start("m", "i1", "local")
    observed.item(GenerationEnd("stop", Usage(prompt_tokens=3, completion_tokens=1)))
    assert value(metrics, "skulk:time_to_first_token_seconds_count", **MI) == 1
    assert value(metrics, "skulk:inter_token_latency_seconds_count", **MI) is None
