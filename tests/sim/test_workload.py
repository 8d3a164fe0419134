"""The client workload: one command at a time per client, retries with the same seq, acks."""

from __future__ import annotations

import random

from skulk.consensus import Entry, EntryKind, LogPosition
from skulk.sim._workload import Answer, Outcome, Workload

NODES = ("n1", "n2", "n3")


class FakeCluster:
    """Answers submissions from a script; records what was submitted where."""

    def __init__(self, answers: list[Answer]) -> None:
        self.answers = answers
        self.calls: list[tuple[str, str, int]] = []

    def submit(self, node: str, client: str, seq: int, data: bytes) -> Answer:
        self.calls.append((node, client, seq))
        return self.answers.pop(0)


def workload(timeout: int = 10) -> tuple[Workload, list[str]]:
    lines: list[str] = []
    w = Workload(random.Random(0), NODES, clients=0, rate=0.0, timeout=timeout, trace=lines.append)
    return w, lines


def entry(index: int, term: int, client: str, seq: int) -> Entry:
    return Entry(index, term, EntryKind.COMMAND, b"", client, seq)


def test_ack_when_the_submitted_entry_applies_on_that_node() -> None:
    w, _ = workload()
    w.enqueue("sc", 2)
    fake = FakeCluster([Answer(position=LogPosition(5, 2))])
    w.tick(0, fake.submit)
    node = fake.calls[0][0]
    assert w.on_applied("other" if node != "other" else "x", entry(5, 2, "sc", 1), 1) is None
    ack = w.on_applied(node, entry(5, 2, "sc", 1), 3)
    assert ack is not None and (ack.client, ack.seq, ack.index, ack.term) == ("sc", 1, 5, 2)
    assert w.acked_by("sc") == 1
    fake.answers.append(Answer(position=LogPosition(6, 2)))
    w.tick(4, fake.submit)
    assert fake.calls[-1][1:] == ("sc", 2)  # the next command only after the first's ack


def test_a_different_entry_at_the_index_fails_the_attempt_and_retries_same_seq() -> None:
    w, lines = workload()
    w.enqueue("sc", 1)
    fake = FakeCluster([Answer(position=LogPosition(5, 2)), Answer(position=LogPosition(7, 3))])
    w.tick(0, fake.submit)
    node = fake.calls[0][0]
    assert w.on_applied(node, entry(5, 3, "other", 1), 2) is None  # lost to a new leader
    w.tick(3, fake.submit)
    assert fake.calls[1][1:] == ("sc", 1)
    assert any("lost-at" in line for line in lines)


def test_not_leader_hint_is_followed_and_timeouts_retry() -> None:
    w, _ = workload(timeout=5)
    w.enqueue("sc", 1)
    fake = FakeCluster(
        [
            Answer(outcome=Outcome.NOT_LEADER, hint="n3"),
            Answer(outcome=Outcome.NO_ANSWER),
            Answer(position=LogPosition(2, 1)),
        ]
    )
    w.tick(0, fake.submit)
    w.tick(1, fake.submit)
    assert fake.calls[1][0] == "n3"
    for t in range(2, 6):
        w.tick(t, fake.submit)
    assert len(fake.calls) == 2  # waiting for a paused node, until the timeout
    w.tick(6, fake.submit)
    assert len(fake.calls) == 3 and fake.calls[2][2] == 1


def test_node_down_and_snapshot_past_the_index_fail_pending_attempts() -> None:
    w, _ = workload()
    w.enqueue("a", 1)
    w.enqueue("b", 1)
    fake = FakeCluster([Answer(position=LogPosition(4, 1)), Answer(position=LogPosition(5, 1))])
    w.tick(0, fake.submit)
    (na, _, _), (nb, _, _) = fake.calls
    w.on_restored(na, 4, 1)
    w.on_node_down(nb, 1)
    fake.answers += [Answer(position=LogPosition(9, 2)), Answer(position=LogPosition(10, 2))]
    w.tick(2, fake.submit)
    assert [c[1:] for c in fake.calls[2:]] == [("a", 1), ("b", 1)]


def test_entries_applied_while_submitting_are_checked() -> None:
    w, _ = workload()
    w.enqueue("sc", 1)
    applied = ((entry(3, 1, "sc", 1), b"told"),)
    fake = FakeCluster([Answer(position=LogPosition(3, 1), applied=applied)])
    w.tick(0, fake.submit)
    assert w.acked_by("sc") == 1 and w.acks[0].result == b"told"
