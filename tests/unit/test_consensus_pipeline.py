"""The Raft driver's fast path: a leader sends its AppendRequests while its own fsync runs, yet
applies, answers and tells followers a commit index only through what is durable on it;
persists run inline or in a worker thread; submission deadlines live in one heap.

The pure pieces (:class:`Batch.take_early`, :class:`CommitQueue`, :class:`WaiterTable`
deadlines) directly; the driver with three real drivers on ``tmp_path`` (the cluster helpers
of ``test_consensus_driver``).
"""

from __future__ import annotations

import math
import threading
from pathlib import Path

import attrs
import pytest
import trio

from skulk.consensus import (
    AppendReply,
    AppendRequest,
    ConfChange,
    ConfState,
    Entry,
    EntryKind,
    HardState,
    Message,
    RaftConfig,
    Ready,
    Snapshot,
    SnapshotMeta,
    SubmitTimeout,
    VoteReply,
)
from skulk.consensus._batch import Batch, CommitQueue, Retry, Waiter, WaiterTable
from skulk.consensus._transport import MemoryTransport

from .test_consensus_driver import FAST, IDS, WAIT, cluster, eventually

SYNCED = HardState(2, "a", 5)


def _command(index: int, term: int = 2) -> Entry:
    return Entry(index, term, EntryKind.COMMAND, b"x", "k", index)


def _append(dst: str, prev: int, count: int, commit: int) -> Message:
    entries = tuple(_command(prev + i) for i in range(1, count + 1))
    return Message("a", dst, AppendRequest(2, prev, 2, entries, commit))


# --- which messages may leave before the fsync --------------------------------------------------


def test_a_leader_batch_hands_out_its_appends_before_the_sync() -> None:
    batch = Batch()
    reply = Message("a", "c", AppendReply(2, True, 4))
    batch.add(Ready(entries=(_command(6),), messages=(_append("b", 5, 1, 5), reply)))
    batch.add(Ready(entries=(_command(7),), messages=(_append("b", 6, 1, 5),)))
    early = batch.take_early(SYNCED)
    assert [m.dst for m in early] == ["b"]  # the two appends to b, folded into one
    assert isinstance(early[0].payload, AppendRequest)
    assert [e.index for e in early[0].payload.entries] == [6, 7]
    assert batch.messages == [reply]  # an acknowledgement waits for the sync
    assert batch.needs_sync(SYNCED)  # the entries still have to be written
    batch.add(Ready(messages=(_append("b", 7, 1, 5),)))  # later messages still fold
    assert len(batch.messages) == 2


def test_nothing_leaves_early_when_the_batch_changes_term_or_vote() -> None:
    for hard_state in (HardState(3, None, 5), HardState(2, "b", 5)):
        batch = Batch()
        batch.add(Ready(hard_state=hard_state, messages=(_append("b", 5, 1, 5),)))
        assert batch.take_early(SYNCED) == []
        assert len(batch.messages) == 1
    commit_only = Batch()  # only the commit index moved: the term is the one on disk
    commit_only.add(Ready(hard_state=HardState(2, "a", 6), messages=(_append("b", 5, 1, 6),)))
    assert len(commit_only.take_early(SYNCED)) == 1


def test_nothing_leaves_early_with_a_membership_change_or_a_snapshot() -> None:
    conf = Entry(6, 2, EntryKind.CONF, conf=ConfChange("add_learner", "d"))
    batch = Batch()
    batch.add(Ready(entries=(conf,), messages=(_append("b", 5, 1, 5),)))
    assert batch.take_early(SYNCED) == []
    snapshot = Snapshot(SnapshotMeta(9, 2, ConfState(("a", "b", "c"))), b"image")
    with_snapshot = Batch()
    with_snapshot.add(Ready(snapshot=snapshot, messages=(_append("b", 9, 0, 9),)))
    assert with_snapshot.take_early(SYNCED) == []


def test_the_durable_end_of_the_log_after_a_batch() -> None:
    batch = Batch()
    assert batch.last_index_after(7) == 7  # writes nothing to the log
    batch.add(Ready(entries=(_command(4),)))  # a follower truncating back to 4
    assert batch.last_index_after(7) == 4
    restore = Batch()
    meta = SnapshotMeta(20, 2, ConfState(("a", "b", "c")))
    restore.add(Ready(snapshot=Snapshot(meta, b""), restore=True))
    assert restore.last_index_after(7) == 20
    compaction = Batch()
    compaction.add(Ready(snapshot=Snapshot(attrs.evolve(meta, index=3), b"")))
    assert compaction.last_index_after(7) == 7


# --- the commit queue ----------------------------------------------------------------------------


def test_committed_entries_wait_until_they_are_durable_here() -> None:
    commits = CommitQueue(durable=5)
    commits.push([_command(5), _command(6), _command(7)])
    assert [e.index for e in commits.take()] == [5]
    assert commits.take() == [] and len(commits) == 2
    commits.durable = 7
    assert [e.index for e in commits.take()] == [6, 7]
    commits.push([_command(8)])
    commits.clear()
    commits.durable = 8
    assert commits.take() == []


def test_an_append_never_carries_a_commit_index_beyond_the_durable_log() -> None:
    commits = CommitQueue(durable=5)
    capped = commits.cap(_append("b", 5, 2, commit=7)).payload
    assert isinstance(capped, AppendRequest)
    assert (capped.commit, [e.index for e in capped.entries]) == (5, [6, 7])
    below = _append("b", 5, 2, commit=4)
    assert commits.cap(below) is below
    vote = Message("a", "b", VoteReply(2, True))
    assert commits.cap(vote) is vote


# --- deadlines in one heap ---------------------------------------------------------------------


def test_waiters_expire_at_their_deadlines_in_any_order() -> None:
    table = WaiterTable()
    late, early, done = Waiter(deadline=30.0), Waiter(deadline=10.0), Waiter(deadline=20.0)
    for waiter in (late, early, done):
        table.add(waiter)
    assert table.next_deadline() == 10.0
    table.expire(5.0)
    assert not any(w.event.is_set() for w in (late, early, done))
    done.finish(b"result")  # committed before its deadline
    table.expire(10.0)
    assert early.outcome == Retry(0.0)
    assert done.outcome == b"result"  # untouched, and dropped once it reached the top
    assert table.next_deadline() == 30.0
    table.expire(math.inf)
    assert late.outcome == Retry(0.0) and table.next_deadline() == math.inf


def test_the_deadline_heap_stays_bounded_by_the_live_waiters() -> None:
    table = WaiterTable()
    for k in range(1000):
        waiter = Waiter(deadline=1000.0 + k)
        table.add(waiter)
        waiter.finish(b"")
        table.discard(waiter)
    assert len(table) == 0
    assert len(table._deadlines) <= 2 * 1 + 64 + 1


# --- a live cluster ------------------------------------------------------------------------------


async def test_a_leader_replicates_during_its_fsync_and_answers_once_it_is_durable(
    tmp_path: Path,
) -> None:
    # Persists in worker threads, so that the leader's fsync can be held; elections slow
    # enough that followers wait out the held fsync without heartbeats.
    config = attrs.evolve(
        FAST, inline_persist_below=0.0, raft=RaftConfig(election_ticks=250, check_quorum=False)
    )
    async with cluster(tmp_path, config) as c:
        leader = await c.leader()
        driver = c.drivers[leader]
        assert await driver.submit(b"x", client_id="k", seq=1, timeout=WAIT) == b"1"
        await c.converged(1)
        index = driver.statistics().last_index + 1
        followers = [c.drivers[n] for n in IDS if n != leader]
        hold = c.disks[leader].hold = threading.Event()
        answers: list[bytes] = []

        async def submit() -> None:
            answers.append(await driver.submit(b"x", client_id="k", seq=2, timeout=WAIT))

        c.nursery.start_soon(submit)
        # Both followers store and acknowledge the entry while the leader's fsync is held, so
        # the core counts it committed...
        await eventually(lambda: driver.statistics().commit >= index, "the core's commit")
        # ...but nothing of that commit is visible: not applied or answered on the leader,
        # and no follower learned it.
        assert answers == [] and driver.applied < index
        assert all(f.statistics().last_index >= index for f in followers)
        assert all(f.statistics().commit < index and f.applied < index for f in followers)
        hold.set()
        await eventually(lambda: answers == [b"2"], "the answer once durable")
        await c.converged(2)
        assert driver.statistics().inline_persists == 0


@pytest.mark.parametrize(
    ("quiet_loop_tasks", "busy_loop_tasks", "leader_inline"),
    [(10**6, 10**6, "all"), (-1, 10**6, "some"), (-1, 0, "all")],
    ids=["quiet-leader", "serving-leader", "busy-leader"],
)
async def test_who_persists_inline_on_a_fast_disk(
    tmp_path: Path, quiet_loop_tasks: int, busy_loop_tasks: int, leader_inline: str
) -> None:
    # Followers always. A leader that just sent AppendRequests: on a quiet loop once they are
    # out; on a loop serving others in a worker thread, beside the requests it sent; on a busy
    # loop at once.
    fast_disk = attrs.evolve(
        FAST,
        inline_persist_below=math.inf,
        quiet_loop_tasks=quiet_loop_tasks,
        busy_loop_tasks=busy_loop_tasks,
    )
    async with cluster(tmp_path, fast_disk) as c:
        leader = await c.leader()
        for seq in (1, 2, 3):
            await c.drivers[leader].submit(b"x", client_id="k", seq=seq, timeout=WAIT)
        await c.converged(3)
        for node in IDS:
            stats = c.drivers[node].statistics()
            assert stats.persists > 0
            if node == leader and leader_inline == "some":
                assert stats.inline_persists < stats.persists
            else:
                assert stats.inline_persists == stats.persists


async def test_a_quiet_leader_whose_requests_do_not_go_out_persists_in_a_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The transport never reports the AppendRequests written (a stalled link): after
    # send_wait the fsync goes to a worker thread, and commits go on.
    async def stalled(self: MemoryTransport) -> None:
        await trio.sleep_forever()

    monkeypatch.setattr(MemoryTransport, "wait_sent", stalled)
    config = attrs.evolve(FAST, inline_persist_below=math.inf, send_wait=0.01)
    async with cluster(tmp_path, config) as c:
        leader = await c.leader()
        for seq in (1, 2):
            assert (
                await c.drivers[leader].submit(b"x", client_id="k", seq=seq, timeout=WAIT)
                == str(seq).encode()
            )
        await c.converged(2)
        stats = c.drivers[leader].statistics()
        assert stats.inline_persists < stats.persists


async def test_a_submission_past_its_deadline_times_out_and_leaves_nothing_pending(
    tmp_path: Path,
) -> None:
    # The proposal cannot commit (the leader is cut off, and without CheckQuorum it keeps
    # leading): the deadline heap, not a cancel scope, ends the wait.
    config = attrs.evolve(FAST, raft=RaftConfig(election_ticks=10, check_quorum=False))
    async with cluster(tmp_path, config) as c:
        leader = await c.leader()
        for node in IDS:
            if node != leader:
                c.net.cut(leader, node)
        with trio.fail_after(WAIT), pytest.raises(SubmitTimeout):
            await c.drivers[leader].submit(b"x", client_id="k", seq=1, timeout=0.2)
        assert c.drivers[leader].statistics().pending == 0
