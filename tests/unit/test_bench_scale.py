"""``bench scale``'s figures from two scrapes of a node's metrics text (rates, counters that
restart with a link, the links up, the apply time per entry), their summary over nodes, and
the verdict's growth exponent between the two largest sizes (sans-IO)."""

from __future__ import annotations

import pytest

from skulk.bench._scale import tail_exponent
from skulk.bench._scale_metrics import FIGURES, node_figures, parse, summarize

BEFORE = """
skulk:link_state{peer="n2",state="up"} 1.0
skulk:link_state{peer="n3",state="up"} 1.0
skulk:link_sent_bytes_total{peer="n2"} 1000.0
skulk:link_sent_bytes_total{peer="n3"} 5000.0
skulk:gossip_sent_bytes_total{frame="digest"} 100.0
skulk:gossip_sent_bytes_total{frame="push"} 900.0
skulk:raft_sent_bytes_total{message="append"} 0.0
skulk:raft_sent_bytes_total{message="heartbeat"} 50.0
skulk:raft_sent_bytes_total{message="vote"} 10.0
skulk:raft_entries_applied_total 10.0
skulk:raft_apply_seconds_total 0.001
skulk:raft_role{role="leader"} 0.0
process_cpu_seconds_total 1.0
process_resident_memory_bytes 1.048576e+08
"""

AFTER = """
skulk:link_state{peer="n2",state="up"} 1.0
skulk:link_state{peer="n3",state="up"} 0.0
skulk:link_state{peer="n3",state="connecting"} 1.0
skulk:link_sent_bytes_total{peer="n2"} 3000.0
skulk:link_sent_bytes_total{peer="n3"} 400.0
skulk:gossip_sent_bytes_total{frame="digest"} 300.0
skulk:gossip_sent_bytes_total{frame="push"} 2700.0
skulk:raft_sent_bytes_total{message="append"} 400.0
skulk:raft_sent_bytes_total{message="heartbeat"} 250.0
skulk:raft_sent_bytes_total{message="vote"} 10.0
skulk:raft_entries_applied_total 30.0
skulk:raft_apply_seconds_total 0.003
skulk:raft_role{role="leader"} 1.0
skulk:cluster_state_bytes 800.0
skulk:cluster_snapshot_bytes 300.0
skulk:cluster_snapshot_seconds 0.0002
process_cpu_seconds_total 1.5
process_resident_memory_bytes 1.1534336e+08
"""


def test_node_figures_from_two_scrapes() -> None:
    got = node_figures(parse(BEFORE, 10.0), parse(AFTER, 12.0))
    assert set(got) == set(FIGURES) | {"leader"}
    assert got["links"] == 1  # n3's link is connecting again
    assert got["gossip_bytes_per_s"] == pytest.approx(1000.0)
    assert got["raft_bytes_per_s"] == pytest.approx(300.0)
    assert got["raft_append_bytes_per_s"] == pytest.approx(300.0)
    # n2 grew 2000; n3's counter restarted with its new link: its 400 count whole
    assert got["link_bytes_per_s"] == pytest.approx(1200.0)
    assert got["entries_per_s"] == pytest.approx(10.0)
    assert got["apply_us_per_entry"] == pytest.approx(100.0)
    assert got["state_bytes"] == 800 and got["snapshot_bytes"] == 300
    assert got["snapshot_ms"] == pytest.approx(0.2)
    assert got["rss_mib"] == pytest.approx(110.0)
    assert got["cpu_percent"] == pytest.approx(25.0)
    assert got["leader"] == 1


def test_no_entry_applied_has_no_apply_time_and_scrapes_must_be_ordered() -> None:
    got = node_figures(parse(BEFORE, 0.0), parse(BEFORE, 1.0))
    assert got["apply_us_per_entry"] is None and got["entries_per_s"] == 0
    with pytest.raises(ValueError, match="later"):
        node_figures(parse(BEFORE, 1.0), parse(AFTER, 1.0))


def test_summary_over_nodes_names_the_leader() -> None:
    follower = {name: 1.0 for name in FIGURES} | {"leader": 0.0, "apply_us_per_entry": None}
    leader = {name: 3.0 for name in FIGURES} | {"leader": 1.0}
    got = summarize([follower, leader])
    assert got["links"] == {"mean": 2.0, "min": 1.0, "max": 3.0, "leader": 3.0}
    assert got["apply_us_per_entry"] == {"mean": 3.0, "min": 3.0, "max": 3.0, "leader": 3.0}
    assert summarize([follower])["links"]["leader"] is None


def _runs(values: dict[int, float | None]) -> list[dict[str, object]]:
    return [{"nodes": n, "idle": {"g": {"mean": v}}} for n, v in values.items()]


def test_tail_exponent_is_the_growth_between_the_two_largest_sizes() -> None:
    # quadratic up to 5 nodes, linear after (a fan-out of 4 bounds it past 5 nodes)
    runs = _runs({3: 9.0, 5: 25.0, 10: 50.0, 20: 100.0})
    assert tail_exponent(runs, "idle", "g") == pytest.approx(1.0)
    assert tail_exponent(_runs({5: 25.0, 10: 100.0}), "idle", "g") == pytest.approx(2.0)
    assert tail_exponent(_runs({5: 25.0}), "idle", "g") is None
    assert tail_exponent(_runs({5: 0.0, 10: 1.0}), "idle", "g") is None
    assert tail_exponent(_runs({5: None, 10: 1.0}), "idle", "g") is None
