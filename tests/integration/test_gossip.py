"""Telemetry gossip over real loopback meshes: three nodes converge, a dead node expires, and
with a bounded fan-out four nodes still converge while each round sends one digest."""

from __future__ import annotations

import random
from collections.abc import Callable

import attrs
import trio

from skulk.federation import Mesh
from skulk.telemetry import TelemetryConfig, TelemetryGossip, TelemetryStore
from skulk.wire.telemetry import NodeReadings
from tests._doubles import LINK_BACKOFF as BACKOFF
from tests._doubles import LINK_CONFIG as LINK
from tests._doubles import SECRET

TTL = 1.0
INTERVAL = 0.1


def readings(node_id: str, n: int) -> NodeReadings:
    return NodeReadings(
        node_id=node_id,
        hostname=f"host-{node_id}",
        platform="linux-x86_64",
        memory_total_bytes=n * 1024**3,
        memory_available_bytes=n * 1024**2,
        mlx_version="0.0.test",
        mlx_backends=("cpu",),
        cpu_count=n,
        load_1m=n / 10,
        listen_addresses=(f"ws://127.0.0.1:{5000 + n}",),
        api_address=f"http://127.0.0.1:{6000 + n}",
        sampled_at=1_700_000_000.0 + n,
    )


EXPECTED = {f"node-{c}": readings(f"node-{c}", n) for n, c in enumerate("abcd", start=1)}


@attrs.define
class Node:
    mesh: Mesh
    gossip: TelemetryGossip
    url: str
    scope: trio.CancelScope


async def start_node(
    nursery: trio.Nursery,
    node_id: str,
    join: tuple[str, ...] = (),
    sample: Callable[[], NodeReadings] | None = None,
    fanout: int = 0,
) -> Node:
    """A mesh plus its gossip driver under one cancel scope (cancel it to kill the node)."""
    mesh = Mesh(
        node_id,
        SECRET,
        listen=("127.0.0.1", 0),
        join=join,
        link_config=LINK,
        rng=random.Random(node_id),
        backoff=BACKOFF,
    )
    store = TelemetryStore(node_id, 1, TelemetryConfig(ttl=TTL, forget_after=10 * TTL))
    fixed = EXPECTED[node_id]
    gossip = TelemetryGossip(
        mesh, store, sample or (lambda: fixed), interval=INTERVAL, fanout=fanout
    )
    scope = trio.CancelScope()

    async def body(task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        with scope:
            async with trio.open_nursery() as inner:
                address = await inner.start(mesh.run)
                await inner.start(gossip.run)
                task_status.started(address)

    host, port = await nursery.start(body)
    return Node(mesh, gossip, f"ws://{host}:{port}", scope)


async def until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Poll ``predicate`` until it holds; ``trio.TooSlowError`` after ``within`` seconds."""
    with trio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - polling with a deadline, on purpose
            await trio.sleep(0.01)


def rows(node: Node) -> dict[str, dict[str, object]]:
    body = node.gossip.nodes_json()
    assert set(body) == {"nodes"}
    listed = body["nodes"]
    assert isinstance(listed, list)
    result: dict[str, dict[str, object]] = {}  # in the order listed
    for row in listed:
        assert isinstance(row, dict)
        result[str(row["node_id"])] = row
    return result


def shows(node: Node, *node_ids: str) -> bool:
    """Whether ``node`` lists exactly ``node_ids``, each with its expected readings."""
    listed = rows(node)
    if set(listed) != set(node_ids):
        return False
    for node_id in node_ids:
        row = listed[node_id]
        want = attrs.asdict(EXPECTED[node_id])
        if any(row[k] != (list(v) if isinstance(v, tuple) else v) for k, v in want.items()):
            return False
    return True


async def test_three_nodes_converge_and_a_dead_node_expires() -> None:
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, "node-a")
        b = await start_node(nursery, "node-b", join=(a.url,))
        c = await start_node(nursery, "node-c", join=(a.url, b.url))
        everyone = ("node-a", "node-b", "node-c")
        await until(lambda: all(shows(n, *everyone) for n in (a, b, c)))

        listed = rows(a)
        assert list(listed) == list(everyone)  # sorted by node id
        for row in listed.values():
            assert row["epoch"] == 1
            assert isinstance(row["seq"], int) and row["seq"] >= 1
            assert isinstance(row["age_s"], float) and 0 <= row["age_s"] <= TTL
            assert row["mlx_backends"] == ["cpu"]
        # (C's entry may reach A through B before the A-C link is up: wait for the readers.)
        await until(lambda: all(n.gossip.statistics().readers == 2 for n in (a, b, c)))
        for node in (a, b, c):
            stats = node.gossip.statistics()
            assert stats.digests_sent > 0 and stats.pushes_received > 0
            # bytes counted per frame sent: a digest is small, a push carries readings
            assert stats.digest_bytes_sent >= 10 * stats.digests_sent
            assert stats.push_bytes_sent > 100 * stats.pushes_sent > 0
            assert stats.frames_failed == stats.samples_failed == 0
        # Peers keep publishing: their seq goes up on the others.
        seen = rows(a)["node-b"]["seq"]
        assert isinstance(seen, int)
        await until(lambda: (s := rows(a)["node-b"]["seq"]) != seen and isinstance(s, int))

        c.scope.cancel()
        await until(lambda: shows(a, "node-a", "node-b") and shows(b, "node-a", "node-b"))
        for node in (a, b):
            stats = node.gossip.statistics()
            assert stats.expired == 1
            assert node.gossip.store.statistics().forgotten == 1
            # Expired, C is still remembered as last heard of more than a TTL ago.
            silent = node.gossip.last_seen_age("node-c")
            assert silent is not None and silent > TTL
            fresh = node.gossip.last_seen_age("node-b" if node is a else "node-a")
            assert fresh is not None and fresh < TTL
            assert node.gossip.last_seen_age("never-seen") is None
        await until(lambda: a.gossip.statistics().readers == b.gossip.statistics().readers == 1)
        # A and B still gossip with each other: B's entry keeps being refreshed on A.
        seen = rows(a)["node-b"]["seq"]
        await until(lambda: rows(a)["node-b"]["seq"] != seen)
        assert shows(a, "node-a", "node-b")
        nursery.cancel_scope.cancel()


async def test_a_failing_sample_does_not_stop_gossip() -> None:
    calls = 0

    def flaky() -> NodeReadings:
        nonlocal calls
        calls += 1
        if calls % 2:
            raise OSError("sensor gone")
        return EXPECTED["node-b"]

    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, "node-a")
        b = await start_node(nursery, "node-b", join=(a.url,), sample=flaky)
        await until(lambda: shows(a, "node-a", "node-b") and shows(b, "node-a", "node-b"))
        assert b.gossip.statistics().samples_failed >= 1
        nursery.cancel_scope.cancel()


async def test_a_bounded_fanout_sends_one_digest_a_round_and_still_converges() -> None:
    ids = ("node-a", "node-b", "node-c", "node-d")
    async with trio.open_nursery() as nursery:
        nodes: list[Node] = []
        for node_id in ids:  # each joins every earlier one (their readings' addresses are fake)
            join = tuple(n.url for n in nodes)
            nodes.append(await start_node(nursery, node_id, join=join, fanout=1))
        await until(lambda: all(n.gossip.statistics().readers == 3 for n in nodes))
        await until(lambda: all(shows(n, *ids) for n in nodes))
        # Entries keep flowing with one digest a round: every node sees every other refreshed.
        seqs = [{i: rows(n)[i]["seq"] for i in ids} for n in nodes]
        await until(
            lambda: all(
                all(rows(n)[i]["seq"] != seen[i] for i in ids)
                for n, seen in zip(nodes, seqs, strict=True)
            )
        )
        for node in nodes:
            stats = node.gossip.statistics()
            assert 0 < stats.round_digests <= stats.rounds
        nursery.cancel_scope.cancel()


async def test_fanout_zero_sends_every_round_to_every_peer() -> None:
    async with trio.open_nursery() as nursery:
        a = await start_node(nursery, "node-a")
        b = await start_node(nursery, "node-b", join=(a.url,))
        c = await start_node(nursery, "node-c", join=(a.url, b.url))
        await until(lambda: all(n.gossip.statistics().readers == 2 for n in (a, b, c)))
        await until(lambda: a.gossip.statistics().round_digests > a.gossip.statistics().rounds + 2)
        nursery.cancel_scope.cancel()
