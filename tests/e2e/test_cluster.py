"""Several real nodes on loopback: the federation mesh, authentication, a node lost and back."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from skulk.harness import NodeProcess

SECRET = "5a" * 32  # 32 bytes, hex


def links(node: NodeProcess) -> dict[str, dict[str, Any]]:
    rows = node.get("/v1/cluster/links").json()["links"]
    return {row["peer_id"]: row for row in rows if row["peer_id"]}


def up(node: NodeProcess) -> set[str]:
    return {peer for peer, row in links(node).items() if row["state"] == "up"}


@pytest.fixture
def make_node(skulk_home: Path, tmp_path: Path) -> Iterator[Any]:
    started: list[NodeProcess] = []

    def make(name: str, *args: str, secret: str = SECRET) -> NodeProcess:
        home = tmp_path / name
        if not home.exists():
            home.mkdir()
            (home / "models").symlink_to(skulk_home / "models")  # one demo model for all
        node = NodeProcess(home, *args, env={"SKULK_CLUSTER_SECRET": secret})
        started.append(node)
        return node.start(wait_ready=False)

    yield make
    for node in started:
        node.stop()


def test_three_nodes_mesh_a_stranger_is_refused_and_a_lost_node_returns(make_node: Any) -> None:
    a = make_node("a")
    b = make_node("b", "--join", a.ws_url)
    c = make_node("c", "--join", a.ws_url)  # C learns of B by gossip and dials it
    nodes = {a.node_id: a, b.node_id: b, c.node_id: c}
    assert len(nodes) == 3  # each data dir has its own node id

    def meshed() -> bool:
        return all(up(n) == set(nodes) - {i} for i, n in nodes.items())

    a.wait_for(meshed, 60, "a full mesh")
    row = links(a)[b.node_id]
    assert row["rtt_ms"] is not None and row["frames_in"] > 0 and row["bytes_out"] > 0

    # Telemetry gossip converges: every node sees every node's own readings.
    def gossiped() -> bool:
        views = [{r["node_id"]: r for r in n.get("/v1/cluster/nodes").json()["nodes"]}
                 for n in nodes.values()]  # fmt: skip
        return all(set(v) == set(nodes) for v in views) and all(
            v[i]["api_address"] == n.url and v[i]["memory_total_bytes"] > 0
            for v in views for i, n in nodes.items()
        )  # fmt: skip

    a.wait_for(gossiped, 60, "telemetry gossip converged")

    # A node with another secret is refused: seen in the logs, never in the peer lists.
    d = make_node("d", "--join", a.ws_url, secret="c3" * 32)
    a.wait_for(lambda: "wrong_cluster" in a.log(), 30, "the stranger's refusal logged")
    d.wait_for(lambda: "wrong_cluster" in d.log(), 30, "the refusal seen by the stranger")
    assert d.node_id not in links(a) and up(d) == set()

    # Kill B: A and C see its link down within the liveness deadline, then B comes back.
    port = b.ws_url.rsplit(":", 1)[1]
    b.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    b.wait_exit(10)
    for other in (a, c):
        other.wait_for(lambda o=other: b.node_id not in up(o), 30, "B's link down")
    b2 = make_node("b", "--join", a.ws_url, "--listen", f"127.0.0.1:{port}")
    assert b2.node_id == b.node_id  # the same data dir, the same node
    nodes[b.node_id] = b2
    a.wait_for(meshed, 60, "the mesh whole again")


def raft(node: NodeProcess) -> dict[str, Any]:
    body: dict[str, Any] = node.get("/v1/cluster/raft").json()
    return body


def test_raft_forms_over_the_mesh_survives_a_leader_kill_and_hands_over_on_sigterm(
    make_node: Any,
) -> None:
    a = make_node("a")  # no --join: founds the cluster, its only voter at first
    b = make_node("b", "--join", a.ws_url)
    c = make_node("c", "--join", a.ws_url)
    nodes = {n.node_id: n for n in (a, b, c)}

    def agreed(members: dict[str, NodeProcess]) -> str | None:
        """The leader every live node names, once all of them see the same three voters."""
        views = [raft(n) for n in members.values()]
        leaders = {v["leader"] for v in views}
        voters = [sorted(v["voters"]) for v in views]
        if len(leaders) == 1 and None not in leaders and voters == [sorted(nodes)] * len(views):
            return leaders.pop()  # type: ignore[no-any-return]
        return None

    a.wait_for(lambda: agreed(nodes) is not None, 60, "three voters and one leader")
    first = agreed(nodes)
    assert first == a.node_id  # the founder leads until something happens to it
    term = raft(a)["term"]

    # SIGKILL the leader: the other two elect one of themselves.
    a.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]
    a.wait_exit(10)
    rest = {i: n for i, n in nodes.items() if i != a.node_id}
    b.wait_for(lambda: agreed(rest) not in (None, a.node_id), 60, "a new leader of two")
    second = agreed(rest)
    assert second in rest and raft(rest[second])["term"] > term  # type: ignore[index]

    # The killed founder comes back (same data dir, same port): it follows, it does not found.
    port = a.ws_url.rsplit(":", 1)[1]
    a2 = make_node("a", "--listen", f"127.0.0.1:{port}")
    nodes[a.node_id] = a2
    a2.wait_for(lambda: agreed(nodes) == second, 60, "the old leader rejoined as a follower")

    # SIGTERM the leader: it hands leadership over before it exits.
    leader = nodes[second]  # type: ignore[index]
    leader.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    leader.wait_exit(30)
    assert "leadership handed to node-" in leader.log()
    rest = {i: n for i, n in nodes.items() if i != second}
    a2.wait_for(lambda: agreed(rest) not in (None, second), 60, "the transferred leader")
