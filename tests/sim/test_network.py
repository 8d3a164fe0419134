"""The simulated network: partitions, one-way cuts, bridges, flapping, per-type settings."""

from __future__ import annotations

import random

from skulk.sim._network import LinkParams, SimNetwork

NODES = ("n1", "n2", "n3", "n4", "n5")


def net(base: LinkParams | None = None, seed: int = 0) -> SimNetwork:
    return SimNetwork(random.Random(seed), NODES, base or LinkParams(lo=1, hi=1))


def test_partition_blocks_both_ways_between_groups_only() -> None:
    n = net()
    n.partition([["n1", "n2"], ["n3", "n4"]])
    assert n.blocked("n1", "n3", 0) and n.blocked("n3", "n1", 0)
    assert not n.blocked("n1", "n2", 0) and not n.blocked("n3", "n4", 0)
    # n5 is in no group: a bridge that reaches both sides
    assert not any(n.blocked("n5", x, 0) or n.blocked(x, "n5", 0) for x in NODES)
    n.heal()
    assert not n.blocked("n1", "n3", 0)


def test_one_way_cut_and_message_type_cut() -> None:
    n = net()
    n.cut("n1", "n2")
    assert n.blocked("n1", "n2", 0) and not n.blocked("n2", "n1", 0)
    n.heal()
    n.cut("n1", "n2", "AppendRequest")
    assert n.blocked("n1", "n2", 0, "AppendRequest")
    assert not n.blocked("n1", "n2", 0, "VoteRequest")
    assert n.send("n1", "n2", 0, "AppendRequest") == []
    assert n.send("n1", "n2", 0, "VoteRequest") == [1]


def test_isolate() -> None:
    n = net()
    n.isolate("n3")
    assert all(n.blocked("n3", x, 0) and n.blocked(x, "n3", 0) for x in NODES if x != "n3")
    assert not n.blocked("n1", "n2", 0)


def test_rejoin_ends_one_isolation_and_nothing_else() -> None:
    n = net()
    n.isolate("n1")
    n.isolate("n3")
    n.partition([["n4"], ["n5"]])
    n.cut("n2", "n3")
    n.rejoin("n1")
    assert not n.blocked("n1", "n2", 0) and not n.blocked("n4", "n1", 0)
    assert n.blocked("n1", "n3", 0) and n.blocked("n3", "n1", 0)  # n3 is still isolated
    assert n.blocked("n4", "n5", 0)
    n.rejoin("n3")
    assert not n.blocked("n1", "n3", 0) and n.blocked("n2", "n3", 0)  # the cut stays
    n.isolate("n2")
    assert n.statistics().isolated == 1
    n.heal()
    assert not any(n.blocked(a, b, 0) for a in NODES for b in NODES if a != b)


def test_flapping_link_alternates_by_period() -> None:
    n = net()
    n.flap("n1", "n2", 3, now=10)
    down = [n.blocked("n1", "n2", t) for t in range(10, 22)]
    assert down == [True] * 3 + [False] * 3 + [True] * 3 + [False] * 3
    assert [n.blocked("n2", "n1", t) for t in range(10, 22)] == down


def test_delay_loss_duplication_and_overrides() -> None:
    n = net(LinkParams(lo=2, hi=5))
    times = [t for _ in range(200) for t in n.send("n1", "n2", 100)]
    assert set(times) == {102, 103, 104, 105}
    n.set_params(drop=1.0)
    assert all(n.send("n1", "n2", 0) == [] for _ in range(20))
    n.set_params(drop=0.0, dup=1.0)
    assert len(n.send("n1", "n2", 0)) == 2
    n.reset_params()
    n.set_params(link=("n1", "n2"), kind="AppendReply", lo=30, hi=30)
    assert n.send("n1", "n2", 0, "AppendReply") == [30]
    assert n.send("n2", "n1", 0, "AppendReply")[0] <= 5
    assert n.send("n1", "n2", 0, "AppendRequest")[0] <= 5
    stats = n.statistics()
    assert stats.sent > 200 and stats.lost == 20 and stats.duplicated == 1


def test_same_seed_same_deliveries() -> None:
    def run(seed: int) -> list[list[int]]:
        n = net(LinkParams(drop=0.2, dup=0.2, lo=1, hi=9), seed)
        return [n.send("n1", "n2", t) for t in range(300)]

    assert run(4) == run(4)
    assert run(4) != run(5)
