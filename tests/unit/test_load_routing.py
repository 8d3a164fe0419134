"""The routing mode's report of ``bench load`` (sans-IO): per-policy figures, the TTFT ratios and
the table line."""

from __future__ import annotations

import pytest

from skulk.bench._load_routing import (
    ROUTING_GOAL,
    Conversation,
    policy_figures,
    ratios,
    table_line,
)

NODES = {"i-b": "b", "i-c": "c"}


def conv(r: int, first: str, second: str, ttft_ms: float, cached: int | None = 0) -> Conversation:
    return Conversation(r, first, second, ttft_ms / 1000, 600, cached)


def test_policy_figures_count_same_instance_turns_and_shares_by_first_turn() -> None:
    done = [
        conv(0, "i-b", "i-b", 10, 590),
        conv(0, "i-b", "i-c", 40, 0),
        conv(1, "i-c", "i-c", 20, 580),
        conv(1, "i-b", "i-b", 30, None),  # usage without cached tokens: left out
    ]
    f = policy_figures(done, NODES)
    assert f["same_instance_share"] == 0.75
    assert f["instance_shares"] == {"b": 0.75, "c": 0.25}  # by the first turn's instance
    assert f["ttft_p50_ms"] == 25.0 and f["ttft_p99_ms"] == 40.0
    assert f["cached_tokens"] == 580 and f["prompt_tokens"] == 600
    assert f["conversations"] == 4


def test_an_instance_the_cluster_did_not_place_is_shown_by_its_id() -> None:
    f = policy_figures([conv(0, "i-x", "i-x", 5), conv(0, "", "i-b", 5), conv(0, "", "", 5)], NODES)
    assert f["instance_shares"] == {"?": 0.667, "i-x": 0.333}
    assert f["same_instance_share"] == 0.333  # two missing headers are not the same instance
    assert f["cached_tokens"] == 0


def test_ratios_pool_every_round_and_go_round_by_round() -> None:
    prefix = [conv(0, "i-b", "i-b", 10), conv(0, "i-c", "i-c", 30), conv(1, "i-b", "i-b", 40)]
    least = [conv(0, "i-b", "i-c", 100), conv(0, "i-c", "i-b", 100), conv(1, "i-b", "i-c", 50)]
    pooled, by_round = ratios(prefix, least)
    assert pooled == pytest.approx(30 / 100)  # median 30 ms ÷ median 100 ms
    assert by_round == [pytest.approx(20 / 100), pytest.approx(40 / 50)]


def test_the_table_line_names_both_policies_and_the_goal() -> None:
    prefix = [conv(0, "i-b", "i-b", 10, 590)]
    least = [conv(0, "i-b", "i-c", 100, 0)]
    pooled, by_round = ratios(prefix, least)
    figures = {
        "available": True,
        "ratio_p50": pooled,
        "ratio_p50_median": by_round[0],
        "conversations": 1,
        "goal": ROUTING_GOAL,
        "prefix": policy_figures(prefix, NODES),
        "least-loaded": policy_figures(least, NODES),
    }
    line = table_line(figures)
    assert "ratio p50 0.1" in line and "goal 0.3" in line
    assert "prefix TTFT p50/p99 10.0/10.0 ms, same instance 1.0" in line
    assert "least-loaded TTFT p50/p99 100.0/100.0 ms, same instance 0.0" in line
    assert table_line({"error": "boom"}).startswith("routing: ")
    assert "no --route-policy" in table_line(
        {"available": False, "reason": "this build's node has no --route-policy flag"}
    )
