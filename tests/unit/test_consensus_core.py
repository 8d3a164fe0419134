"""The sans-IO Raft core driven by a tiny in-memory cluster with perfect storage.

The simulator (``tests/sim``) checks the core under faults; these tests pin down single
behaviours by name."""

from __future__ import annotations

import random

import pytest

from skulk.consensus import (
    Compact,
    ConfChange,
    ConfState,
    EntryKind,
    HardState,
    Message,
    NotLeader,
    ProposalRefused,
    Propose,
    ProposeConfChange,
    RaftConfig,
    RaftCore,
    Receive,
    Recovered,
    Role,
    Snapshot,
    SnapshotMeta,
    Tick,
    TransferLeadership,
    VoteRequest,
)

CONFIG = RaftConfig(election_ticks=10, heartbeat_ticks=2, snapshot_chunk_bytes=8)


class Cluster:
    """Cores with perfect storage and a network that delivers everything unless cut."""

    def __init__(self, voters: list[str], seed: int = 0, config: RaftConfig = CONFIG) -> None:
        self.config = config
        self.seed = seed
        boot = Snapshot(SnapshotMeta(0, 0, ConfState(tuple(voters))), b"")
        self.cores = {
            n: RaftCore(n, config, random.Random(f"{seed}:{n}"), Recovered(HardState(), boot, ()))
            for n in voters
        }
        self.applied: dict[str, list[bytes]] = {n: [] for n in voters}
        self.queue: list[Message] = []
        self.cut: set[str] = set()

    def add_node(self, node: str) -> None:
        self.cores[node] = RaftCore(
            node, self.config, random.Random(node), Recovered(HardState(), None, ())
        )
        self.applied[node] = []

    def handle(self, node: str, ready_inputs: object) -> None:
        raise NotImplementedError

    def step(self, node: str, inp: object) -> None:
        ready = self.cores[node].step(inp)  # type: ignore[arg-type]
        if ready.restore:
            assert ready.snapshot is not None
            self.applied[node] = ready.snapshot.data.split(b",") if ready.snapshot.data else []
        for e in ready.committed:
            if e.kind is EntryKind.COMMAND:
                self.applied[node].append(e.data)
        self.queue.extend(ready.messages)

    def deliver_all(self, limit: int = 10_000) -> None:
        for _ in range(limit):
            if not self.queue:
                return
            m = self.queue.pop(0)
            if m.src in self.cut or m.dst in self.cut or m.dst not in self.cores:
                continue
            self.step(m.dst, Receive(m))
        raise AssertionError("message storm")

    def tick(self, n: int = 1) -> None:
        for _ in range(n):
            for node in sorted(self.cores):
                if node not in self.cut:
                    self.step(node, Tick())
            self.deliver_all()

    def leader(self) -> str | None:
        leaders = [n for n, c in self.cores.items() if c.role is Role.LEADER and n not in self.cut]
        return max(leaders, key=lambda n: self.cores[n].term) if leaders else None

    def elect(self) -> str:
        for _ in range(200):
            self.tick()
            leader = self.leader()
            if leader is not None and self.cores[leader].commit >= self.cores[leader].last_index:
                return leader
        raise AssertionError("no leader")


def test_a_leader_is_elected_and_commits_its_noop() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    core = c.cores[leader]
    assert core.term == 1
    assert core.entries(1, 1)[0].kind is EntryKind.NOOP
    assert sum(1 for x in c.cores.values() if x.role is Role.LEADER) == 1


def test_commands_replicate_and_apply_everywhere_in_order() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    for i in range(20):
        c.step(leader, Propose(f"cmd{i}".encode()))
    c.deliver_all()
    c.tick(3)
    for node in c.cores:
        assert c.applied[node] == [f"cmd{i}".encode() for i in range(20)]


def test_a_follower_refuses_proposals_naming_the_leader() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    follower = next(n for n in c.cores if n != leader)
    with pytest.raises(NotLeader) as err:
        c.step(follower, Propose(b"x"))
    assert err.value.leader == leader


def test_prevote_keeps_an_isolated_node_from_raising_its_term() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    lonely = next(n for n in c.cores if n != leader)
    term = c.cores[lonely].term
    c.cut.add(lonely)
    for _ in range(100):
        c.step(lonely, Tick())
        c.deliver_all()
    assert c.cores[lonely].term == term
    c.cut.clear()
    c.tick(5)
    assert c.leader() == leader
    assert c.cores[leader].term == term


def test_without_prevote_an_isolated_node_raises_its_term() -> None:
    c = Cluster(["a", "b", "c"], config=RaftConfig(election_ticks=10, pre_vote=False))
    leader = c.elect()
    lonely = next(n for n in c.cores if n != leader)
    term = c.cores[lonely].term
    c.cut.add(lonely)
    for _ in range(100):
        c.step(lonely, Tick())
        c.deliver_all()
    assert c.cores[lonely].term > term


def test_check_quorum_makes_a_stranded_leader_step_down() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    others = [n for n in c.cores if n != leader]
    c.cut.update(others)
    for _ in range(3 * CONFIG.election_ticks):
        c.step(leader, Tick())
        c.deliver_all()
    assert c.cores[leader].role is Role.FOLLOWER


def test_a_vote_request_is_ignored_while_a_leader_is_fresh() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    follower = next(n for n in c.cores if n != leader)
    term = c.cores[follower].term
    c.step(follower, Receive(Message("zz", follower, VoteRequest(term + 5, 999, 999))))
    assert c.cores[follower].term == term


def test_leadership_transfer_hands_over_to_the_target() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    target = next(n for n in sorted(c.cores) if n != leader)
    c.step(leader, TransferLeadership(target))
    c.deliver_all()
    c.tick(3)
    assert c.leader() == target


def test_snapshot_is_sent_to_a_follower_behind_the_compacted_log() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    slow = next(n for n in sorted(c.cores) if n != leader)
    c.cut.add(slow)
    for i in range(10):
        c.step(leader, Propose(str(i).encode()))
    c.deliver_all()
    c.tick(2)
    core = c.cores[leader]
    data = b",".join(c.applied[leader])
    c.step(leader, Compact(core.applied, data))
    assert core.first_index == core.applied + 1
    c.cut.clear()
    c.tick(20)
    assert c.applied[slow] == c.applied[leader]
    assert c.cores[slow].snapshot_meta is not None


def test_a_new_node_joins_as_learner_then_is_promoted() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    c.step(leader, Propose(b"before"))
    c.deliver_all()
    c.add_node("d")
    c.step(leader, ProposeConfChange(ConfChange("add_learner", "d")))
    c.tick(10)
    assert c.cores["d"].conf.learners == ("d",)
    assert c.applied["d"] == [b"before"]
    c.step(leader, ProposeConfChange(ConfChange("promote", "d")))
    c.tick(5)
    assert c.cores[leader].conf.voters == ("a", "b", "c", "d")
    assert c.cores["d"].conf.voters == ("a", "b", "c", "d")


def test_a_removed_leader_steps_down_once_its_removal_commits() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    c.step(leader, ProposeConfChange(ConfChange("remove", leader)))
    c.tick(5)
    assert c.cores[leader].role is Role.FOLLOWER
    new = c.elect()
    assert new != leader
    assert leader not in c.cores[new].conf.voters


def test_one_conf_change_at_a_time() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    c.cut.update(n for n in c.cores if n != leader)
    c.add_node("d")
    c.step(leader, ProposeConfChange(ConfChange("add_learner", "d")))
    with pytest.raises(ProposalRefused) as err:
        c.step(leader, ProposeConfChange(ConfChange("remove", "c")))
    assert err.value.reason == "conf_change_pending"


def test_promoting_a_lagging_learner_is_refused() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    c.add_node("d")
    c.cut.add("d")
    c.step(leader, ProposeConfChange(ConfChange("add_learner", "d")))
    for i in range(40):
        c.step(leader, Propose(str(i).encode()))
    c.tick(3)
    with pytest.raises(ProposalRefused) as err:
        c.step(leader, ProposeConfChange(ConfChange("promote", "d")))
    assert err.value.reason == "learner_not_caught_up"


def test_hard_state_is_in_the_ready_before_the_vote_is_sent() -> None:
    c = Cluster(["a", "b", "c"])
    core = c.cores["a"]
    for _ in range(100):
        ready = core.step(Tick())
        if ready.messages:
            break
    request = ready.messages[0].payload
    assert isinstance(request, VoteRequest) and request.pre_vote
    ready = c.cores["b"].step(Receive(ready.messages[0]))
    assert ready.hard_state is None  # a pre-vote changes nothing durable
    real = VoteRequest(request.term, request.last_index, request.last_term)
    ready = c.cores["b"].step(Receive(Message("a", "b", real)))
    assert ready.hard_state is not None and ready.hard_state.vote == "a"
    assert ready.messages and ready.messages[0].payload.granted  # type: ignore[union-attr]


def test_a_change_leaving_no_live_majority_is_refused() -> None:
    c = Cluster(["a", "b", "c"])
    leader = c.elect()
    dead = next(n for n in sorted(c.cores) if n != leader)
    c.cut.add(dead)
    c.tick(3 * CONFIG.election_ticks)  # two CheckQuorum periods without a word from it
    assert c.cores[leader].role is Role.LEADER
    with pytest.raises(ProposalRefused) as err:  # {dead, other}: only one of two answers
        c.step(leader, ProposeConfChange(ConfChange("remove", leader)))
    assert err.value.reason == "would_lose_quorum"
    c.step(leader, ProposeConfChange(ConfChange("remove", dead)))  # {leader, other}: fine
    c.tick(3)
    assert c.cores[leader].conf.voters == tuple(sorted(set(c.cores) - {dead}))


def test_a_leader_whose_self_removal_did_not_replicate_can_be_elected_again() -> None:
    c = Cluster(["a", "b"])
    leader = c.elect()
    other = next(n for n in c.cores if n != leader)
    c.cut.add(other)
    c.step(leader, ProposeConfChange(ConfChange("remove", leader)))
    assert leader not in c.cores[leader].conf.voters  # in effect once appended
    for _ in range(3 * CONFIG.election_ticks):  # CheckQuorum: it steps down, uncommitted
        c.step(leader, Tick())
    c.queue.clear()
    c.cut.clear()
    # Only the old leader (longer log) can win; it may campaign because it is a voter of the
    # committed membership. It then commits its removal and steps down, and the other leads.
    c.tick(20 * CONFIG.election_ticks)
    assert c.leader() == other
    assert all(core.conf.voters == (other,) for core in c.cores.values())
    assert c.cores[other].commit == c.cores[other].last_index
