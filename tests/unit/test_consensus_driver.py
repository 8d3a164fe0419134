"""The Raft driver: three real drivers (real storage on tmp_path, real fsync) over an in-process
network, plus the pure pieces it uses (sessions, snapshots, the forwarding codec) and one run
over the real federation mesh on loopback.

Real time with short ticks (the driver's persists do real I/O, inline or in worker threads, so a
mock clock would jump); waits are polls with deadlines, never sleeps as synchronisation.
"""

from __future__ import annotations

import random
import threading
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from skulk.consensus import (
    AppendReply,
    AppendRequest,
    Counter,
    Disk,
    DiskFull,
    DriverConfig,
    Entry,
    EntryKind,
    HardState,
    MemoryNetwork,
    MeshTransport,
    Message,
    NoQuorum,
    NotLeader,
    OsDisk,
    RaftConfig,
    RaftCore,
    RaftDriver,
    Ready,
    Role,
    Sessions,
    SessionState,
    Storage,
    SubmitTimeout,
    Unavailable,
    UnavailableReason,
)
from skulk.consensus._batch import Batch
from skulk.consensus._forwarding import REPLY_CODEC, reply_for, result_of
from skulk.federation import ClusterSecret, Mesh
from skulk.wire import SnapshotCorrupt, pack, unpack, unpack_as

IDS = ("a", "b", "c")
FAST = DriverConfig(tick_seconds=0.02, raft=RaftConfig(election_ticks=10), retry_interval=0.01)
WAIT = 15.0  # generous: a 2-core CI machine under load


class FillableDisk:
    """An :class:`OsDisk` whose appends and fsyncs raise :class:`DiskFull` while ``full``, and
    whose fsyncs wait for ``hold`` while one is set (run persists in worker threads then)."""

    def __init__(self, inner: OsDisk) -> None:
        self.inner = inner
        self.full = False
        self.hold: threading.Event | None = None

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def append(self, name: str, data: bytes) -> None:
        if self.full:
            raise DiskFull(28, "No space left on device (test)", name)
        self.inner.append(name, data)

    def fsync(self, name: str) -> None:
        if self.full:
            raise DiskFull(28, "No space left on device (test)", name)
        if self.hold is not None:
            self.hold.wait(WAIT)
        self.inner.fsync(name)


async def eventually(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:  # noqa: ASYNC109
    """Poll ``check`` until it holds (a deadline, not a sleep as synchronisation)."""
    with trio.move_on_after(timeout):
        while True:
            if check():
                return
            await trio.sleep(0.01)
    raise AssertionError(f"not within {timeout} s: {what}")


@attrs.define
class Cluster:
    root: Path
    nursery: trio.Nursery
    config: DriverConfig
    net: MemoryNetwork = attrs.Factory(MemoryNetwork)
    drivers: dict[str, RaftDriver[int]] = attrs.Factory(dict)
    scopes: dict[str, trio.CancelScope] = attrs.Factory(dict)
    disks: dict[str, FillableDisk] = attrs.Factory(dict)

    async def start(self, node: str) -> RaftDriver[int]:
        def open_storage() -> tuple[Storage, object]:
            disk = self.disks[node] = FillableDisk(OsDisk(self.root / node))
            return Storage.open(disk)  # type: ignore[arg-type]

        driver = RaftDriver(
            node,
            voters=IDS,
            machine=Counter(),
            open_storage=open_storage,  # type: ignore[arg-type]
            transport=self.net.join(node),
            config=self.config,
            rng=random.Random(node),
        )
        scope = trio.CancelScope()

        async def run(*, task_status: trio.TaskStatus[None]) -> None:
            with scope:
                await driver.run(task_status=task_status)

        await self.nursery.start(run)
        self.drivers[node], self.scopes[node] = driver, scope
        return driver

    def kill(self, node: str) -> None:
        self.scopes[node].cancel()
        self.net.leave(node)

    def leaders(self, among: tuple[str, ...] = IDS) -> set[str]:
        return {n for n in among if self.drivers[n].role is Role.LEADER}

    async def leader(self, among: tuple[str, ...] = IDS) -> str:
        def agreed() -> bool:
            seen = {self.drivers[n].leader for n in among}
            return len(seen) == 1 and None not in seen and self.leaders(among) == seen

        await eventually(agreed, f"one leader among {among}")
        (leader,) = self.leaders(among)
        return leader

    async def converged(self, count: int, among: tuple[str, ...] = IDS) -> None:
        await eventually(
            lambda: all(self.drivers[n].state == count for n in among),
            f"every state machine at {count}",
        )


@asynccontextmanager
async def cluster(tmp_path: Path, config: DriverConfig = FAST) -> AsyncIterator[Cluster]:
    async with trio.open_nursery() as nursery:
        c = Cluster(tmp_path, nursery, config)
        for node in IDS:
            await c.start(node)
        yield c
        nursery.cancel_scope.cancel()


# --- a live cluster -------------------------------------------------------------------------


async def test_elects_one_leader_and_replicates(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        assert await c.drivers[leader].submit(b"x", client_id="k", seq=1, timeout=WAIT) == b"1"
        await c.converged(1)
        stats = c.drivers[leader].statistics()
        assert stats.healthy and stats.role == "leader" and stats.persists > 0
        # the no-op and the command were applied, and timed
        assert stats.entries_applied >= 2 and stats.apply_seconds > 0


async def test_follower_forwards_to_the_leader(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        follower = next(n for n in IDS if n != leader)
        result = await c.drivers[follower].submit(b"x", client_id="k", seq=1, timeout=WAIT)
        assert result == b"1"
        assert c.drivers[follower].statistics().forwards >= 1
        assert c.drivers[follower].statistics().proposals == 0
        await c.converged(1)


async def test_not_leader_without_forwarding(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        follower = next(n for n in IDS if n != leader)
        with pytest.raises(NotLeader) as caught:
            await c.drivers[follower].submit(b"x", client_id="k", seq=1, timeout=1, forward=False)
        assert caught.value.leader == leader


async def test_a_retried_seq_applies_once(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        follower = next(n for n in IDS if n != leader)
        first = await c.drivers[leader].submit(b"x", client_id="k", seq=1, timeout=WAIT)
        again = await c.drivers[follower].submit(b"x", client_id="k", seq=1, timeout=WAIT)
        assert first == again == b"1"
        assert await c.drivers[follower].submit(b"x", client_id="k", seq=2, timeout=WAIT) == b"2"
        await c.converged(2)


async def test_leader_killed_a_new_one_takes_over(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        old = await c.leader()
        for seq in (1, 2, 3):
            await c.drivers[old].submit(b"x", client_id="k", seq=seq, timeout=WAIT)
        survivors = tuple(n for n in IDS if n != old)
        known = {n: c.drivers[n].statistics().leader_changes for n in survivors}
        assert all(count >= 1 for count in known.values())  # each came to know ``old``
        c.kill(old)
        new = await c.leader(survivors)
        assert new != old
        for n in survivors:  # and then the new one: a leader change on each
            assert c.drivers[n].statistics().leader_changes > known[n]
        result = await c.drivers[survivors[0]].submit(b"x", client_id="k", seq=4, timeout=WAIT)
        assert result == b"4"
        await c.converged(4, survivors)
        await c.start(old)  # restarts from its own disk and catches up
        await c.converged(4)
        assert c.drivers[old].role is Role.FOLLOWER


async def test_no_quorum_when_a_majority_is_gone(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        await c.leader()
        c.kill("a")
        c.kill("b")
        with trio.fail_after(5):
            with pytest.raises(NoQuorum):
                await c.drivers["c"].submit(b"x", client_id="k", seq=1, timeout=0.5)


async def test_partitioned_leader_times_out_and_the_retry_applies_once(tmp_path: Path) -> None:
    # Without CheckQuorum the cut-off leader keeps leading: its proposal cannot commit.
    config = attrs.evolve(FAST, raft=RaftConfig(election_ticks=10, check_quorum=False))
    async with cluster(tmp_path, config) as c:
        old = await c.leader()
        others = tuple(n for n in IDS if n != old)
        for n in others:
            c.net.cut(old, n)
        with pytest.raises(SubmitTimeout):
            await c.drivers[old].submit(b"x", client_id="k", seq=1, timeout=0.3)
        await c.leader(others)
        c.net.heal()
        result = await c.drivers[others[0]].submit(b"x", client_id="k", seq=1, timeout=WAIT)
        assert result == b"1"
        await c.converged(1)


async def test_overloaded_and_stopped_are_unavailable(tmp_path: Path) -> None:
    config = attrs.evolve(
        FAST, max_pending=1, raft=RaftConfig(election_ticks=10, check_quorum=False)
    )
    async with cluster(tmp_path, config) as c:
        old = await c.leader()
        for n in IDS:
            if n != old:
                c.net.cut(old, n)
        pending_failed = trio.Event()

        async def pending() -> None:
            with pytest.raises(Unavailable) as caught:
                await c.drivers[old].submit(b"x", client_id="k", seq=1, timeout=WAIT)
            assert caught.value.reason is UnavailableReason.STOPPED
            pending_failed.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(pending)
            await eventually(lambda: c.drivers[old].statistics().pending == 1, "one pending")
            with pytest.raises(Unavailable) as caught:
                await c.drivers[old].submit(b"x", client_id="j", seq=1, timeout=1)
            assert caught.value.reason is UnavailableReason.OVERLOADED
            c.kill(old)  # the pending submission fails at once: the driver stopped
        assert pending_failed.is_set()
        stopped = c.drivers[old]
        with pytest.raises(Unavailable) as caught:
            await stopped.submit(b"x", client_id="k", seq=1, timeout=1)
        assert caught.value.reason is UnavailableReason.STOPPED
        assert not stopped.statistics().healthy


async def test_disk_full_reports_unhealthy_then_recovers(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        victim = next(n for n in IDS if n != leader)
        c.disks[victim].full = True
        for seq in (1, 2):  # the victim cannot persist these
            await c.drivers[leader].submit(b"x", client_id="k", seq=seq, timeout=WAIT)
        await eventually(lambda: not c.drivers[victim].healthy, "the victim unhealthy")
        stats = c.drivers[victim].statistics()
        assert stats.unavailable == "disk_full" and stats.disk_failures >= 1
        with pytest.raises(Unavailable) as caught:
            await c.drivers[victim].submit(b"x", client_id="k", seq=3, timeout=1)
        assert caught.value.reason is UnavailableReason.DISK_FULL
        c.disks[victim].full = False
        await eventually(lambda: c.drivers[victim].healthy, "the victim healthy again")
        await c.converged(2)
        assert await c.drivers[victim].submit(b"x", client_id="k", seq=3, timeout=WAIT) == b"3"


async def test_transfer_leadership(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        old = await c.leader()
        await c.drivers[old].submit(b"x", client_id="k", seq=1, timeout=WAIT)
        new = await c.drivers[old].transfer_leadership(timeout=WAIT)
        assert new is not None and new != old
        assert await c.leader() == new
        follower = next(n for n in IDS if n != old)
        assert await c.drivers[follower].transfer_leadership() == c.drivers[follower].leader


async def test_snapshots_compact_and_a_lagging_node_catches_up(tmp_path: Path) -> None:
    async with cluster(tmp_path, attrs.evolve(FAST, snapshot_every=10)) as c:
        leader = await c.leader()
        lagging = next(n for n in IDS if n != leader)
        c.kill(lagging)
        for seq in range(1, 31):
            await c.drivers[leader].submit(b"x", client_id="k", seq=seq, timeout=WAIT)
        await eventually(  # compaction is taken on the next tick after the entries apply
            lambda: c.drivers[leader].statistics().snapshot_index >= 20, "a snapshot past 20"
        )
        stats = c.drivers[leader].statistics()
        assert stats.snapshots >= 1 and stats.snapshot_bytes > 0 and stats.snapshot_seconds > 0
        await c.start(lagging)  # its log ends before the leader's snapshot: InstallSnapshot
        await c.converged(30)
        assert c.drivers[lagging].statistics().snapshot_index >= 20


async def test_a_whole_cluster_restarts_from_disk_and_remembers_sessions(tmp_path: Path) -> None:
    async with cluster(tmp_path) as c:
        leader = await c.leader()
        for seq in (1, 2):
            await c.drivers[leader].submit(b"x", client_id="k", seq=seq, timeout=WAIT)
        await c.converged(2)
        for node in IDS:
            c.kill(node)
        for node in IDS:
            await c.start(node)
        await c.converged(2)  # replayed from each node's own log
        leader = await c.leader()
        again = await c.drivers[leader].submit(b"x", client_id="k", seq=2, timeout=WAIT)
        assert again == b"2"  # the session survived: not applied a second time
        assert await c.drivers[leader].submit(b"x", client_id="k", seq=3, timeout=WAIT) == b"3"


async def test_a_single_voter_commits_alone(tmp_path: Path) -> None:
    net = MemoryNetwork()
    driver = RaftDriver(
        "solo",
        voters=("solo",),
        machine=Counter(),
        open_storage=lambda: Storage.open(OsDisk(tmp_path)),
        transport=net.join("solo"),
        config=FAST,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        assert await driver.wait_leader(WAIT) == "solo"
        assert await driver.submit(b"x", client_id="k", seq=1, timeout=WAIT) == b"1"
        assert driver.statistics().persists >= 1
        nursery.cancel_scope.cancel()


def _solo(
    tmp_path: Path, config: DriverConfig = FAST, net: MemoryNetwork | None = None
) -> RaftDriver[int]:
    return RaftDriver(
        "solo",
        voters=("solo",),
        machine=Counter(),
        open_storage=lambda: Storage.open(OsDisk(tmp_path)),
        transport=(net or MemoryNetwork()).join("solo"),
        config=config,
    )


async def test_an_offered_message_is_stepped_at_once_unless_one_waits_before_it(
    tmp_path: Path,
) -> None:
    net = MemoryNetwork()
    driver = _solo(tmp_path, net=net)
    async with trio.open_nursery() as nursery:
        await nursery.start(driver.run)
        stale = Message("x", "solo", AppendReply(0, True, 0))  # ignored by the core
        await trio.testing.wait_all_tasks_blocked()
        received = driver.statistics().messages_received
        assert driver._offered(stale)
        assert driver.statistics().messages_received == received + 1
        net._deliver(stale)  # handed to the reader task, which has not run yet...
        assert not driver._offered(stale)  # ...so a later message must queue behind it
        await trio.testing.wait_all_tasks_blocked()
        assert driver.statistics().messages_received == received + 2
        assert driver._offered(stale)  # the reader is idle again
        nursery.cancel_scope.cancel()
    assert not driver._offered(stale)  # stopped


async def test_a_core_failure_in_an_offered_step_ends_the_driver(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No ticks during the test: only the offered step can meet the failing core.
    driver = _solo(tmp_path, attrs.evolve(FAST, tick_seconds=3600.0))

    def broken(self: object, inp: object) -> Ready:
        raise RuntimeError("core bug")

    with trio.fail_after(WAIT), pytest.RaisesGroup(RuntimeError, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(driver.run)
            await trio.testing.wait_all_tasks_blocked()  # the reader is idle: offers are taken
            monkeypatch.setattr(RaftCore, "step", broken)
            assert driver._offered(Message("x", "solo", AppendReply(0, True, 0)))
            await trio.sleep_forever()  # the driver's failure ends this nursery


# --- over the federation mesh -----------------------------------------------------------------


async def test_three_drivers_over_the_mesh(tmp_path: Path) -> None:
    secret = ClusterSecret(bytes(range(32)))
    async with trio.open_nursery() as nursery:
        transports: dict[str, MeshTransport] = {}
        meshes: dict[str, Mesh] = {}
        drivers: dict[str, RaftDriver[int]] = {}
        for node in IDS:

            async def rpc(method: str, body: bytes, node: str = node) -> bytes:
                return await transports[node].handle_rpc(method, body)

            meshes[node] = Mesh(node, secret, listen=("127.0.0.1", 0), rpc_handler=rpc)
            transports[node] = MeshTransport(meshes[node], poll_interval=0.02)
        ports = {n: (await nursery.start(m.run))[1] for n, m in meshes.items()}
        for node in IDS:
            for peer in IDS:
                if peer > node:
                    meshes[node].add_peer(f"ws://127.0.0.1:{ports[peer]}")
            await nursery.start(transports[node].run)
            drivers[node] = RaftDriver(
                node,
                voters=IDS,
                machine=Counter(),
                open_storage=lambda node=node: Storage.open(OsDisk(tmp_path / node)),  # type: ignore[misc]
                transport=transports[node],
                config=FAST,
            )
            await nursery.start(drivers[node].run)
        leader = await drivers["a"].wait_leader(WAIT)
        follower = next(n for n in IDS if n != leader)
        assert await drivers[follower].submit(b"x", client_id="k", seq=1, timeout=WAIT) == b"1"
        assert await drivers[follower].submit(b"x", client_id="k", seq=1, timeout=WAIT) == b"1"
        await eventually(lambda: all(d.state == 1 for d in drivers.values()), "replicated")
        stats = transports[follower].statistics()
        assert stats.forwards >= 1 and stats.received > 0 and stats.rejected_in == 0
        assert 0 < stats.taken_at_once <= stats.received  # stepped in the links' tasks
        assert transports[leader].statistics().forwards_served >= 1
        nursery.cancel_scope.cancel()


# --- pure pieces ------------------------------------------------------------------------------


def _append(prev: int, count: int, commit: int = 0, term: int = 2) -> Message:
    entries = tuple(Entry(prev + i, term, EntryKind.COMMAND) for i in range(1, count + 1))
    return Message("a", "b", AppendRequest(term, prev, term, entries, commit))


def test_a_batch_folds_consecutive_appends_to_a_peer_into_one() -> None:
    batch = Batch()
    batch.add(Ready(messages=(_append(4, 2, commit=3), _append(6, 3, commit=5))))
    batch.add(Ready(messages=(_append(9, 0, commit=6),)))  # a heartbeat continuing them
    (message,) = batch.messages
    assert isinstance(message.payload, AppendRequest)
    assert [e.index for e in message.payload.entries] == [5, 6, 7, 8, 9]
    assert (message.payload.prev_index, message.payload.commit) == (4, 6)


def test_a_batch_keeps_appends_that_do_not_continue_apart() -> None:
    batch = Batch()
    gap = _append(8, 1)  # does not start where the first ends
    other_peer = Message("a", "c", _append(6, 1).payload)
    batch.add(Ready(messages=(_append(4, 2), gap, other_peer, _append(9, 1, term=3))))
    assert len(batch.messages) == 4


def test_a_batch_keeps_only_the_latest_acknowledgement() -> None:
    batch = Batch()
    ack = [Message("b", "a", AppendReply(2, True, i)) for i in (5, 7)]
    reject = Message("b", "a", AppendReply(2, False, 3))
    batch.add(Ready(messages=(ack[0], ack[1])))
    assert [m.payload for m in batch.messages] == [ack[1].payload]
    batch.add(Ready(messages=(reject, ack[0])))
    assert len(batch.messages) == 3  # a rejection is never folded


def test_a_batch_needs_a_sync_for_writes_and_votes_not_for_a_commit_index() -> None:
    synced = HardState(2, "a", 5)
    commit_only = Batch()
    commit_only.add(Ready(hard_state=HardState(2, "a", 9)))
    assert not commit_only.needs_sync(synced)
    vote = Batch()
    vote.add(Ready(hard_state=HardState(3, "b", 5)))
    assert vote.needs_sync(synced)
    write = Batch()
    write.add(Ready(entries=(Entry(6, 2, EntryKind.NOOP),)))
    assert write.needs_sync(synced)


def _command(index: int, client: str, seq: int) -> Entry:
    return Entry(index, 1, EntryKind.COMMAND, b"x", client, seq)


def test_sessions_apply_each_seq_once_and_answer_retries() -> None:
    sessions = Sessions(Counter())
    state = sessions.initial()
    state, result = sessions.apply(state, _command(1, "k", 1))
    assert (state.state, result) == (1, b"1")
    state, result = sessions.apply(state, _command(2, "k", 1))  # a retry: cached
    assert (state.state, result) == (1, b"1")
    state, result = sessions.apply(state, _command(3, "k", 2))
    state, result = sessions.apply(state, _command(4, "k", 1))  # older than the last: cached
    assert (state.state, result) == (2, b"2")
    state, _ = sessions.apply(state, Entry(5, 1, EntryKind.NOOP))
    state, result = sessions.apply(state, Entry(6, 1, EntryKind.COMMAND, b"x"))  # anonymous
    assert (state.state, result, sessions.last_seq(state, "k")) == (3, b"3", 2)


def test_sessions_evict_the_least_recently_active_client() -> None:
    sessions = Sessions(Counter(), max_sessions=2)
    state = sessions.initial()
    for index, client in enumerate(("a", "b", "a", "c"), start=1):
        state, _ = sessions.apply(state, _command(index, client, index))
    assert sorted(state.sessions) == ["a", "c"]


def test_session_snapshots_round_trip_and_reject_garbage() -> None:
    sessions = Sessions(Counter())
    state: SessionState[int] = sessions.initial()
    for index in range(1, 4):
        state, _ = sessions.apply(state, _command(index, f"c{index}", 1))
    image = sessions.snapshot(state)
    assert sessions.restore(image) == state
    assert sessions.snapshot(sessions.restore(image)) == image  # canonical
    for bad in (b"", b"not zstd", pack([1, 2]), pack({"state": b"", "sessions": [[1]]})):
        with pytest.raises(SnapshotCorrupt):
            sessions.restore(bad)
    with pytest.raises(SnapshotCorrupt):
        unpack(pack(b"x" * 1000), max_size=100)
    with pytest.raises(SnapshotCorrupt):
        unpack_as(pack(True), int)


@pytest.mark.parametrize(
    "error",
    [
        NotLeader("b"),
        NotLeader(None),
        NoQuorum("x"),
        SubmitTimeout(1.5),
        Unavailable(UnavailableReason.DISK_FULL),
    ],
)
def test_forwarded_errors_round_trip(error: Exception) -> None:
    reply = reply_for(error)
    assert reply is not None
    decoded = REPLY_CODEC.decode(REPLY_CODEC.encode(reply))
    with pytest.raises(type(error)) as caught:
        result_of(decoded, "b", 1.5)
    if isinstance(error, NotLeader):
        assert isinstance(caught.value, NotLeader)
        assert caught.value.leader == error.leader
    if isinstance(error, Unavailable):
        assert isinstance(caught.value, Unavailable)
        assert caught.value.reason is error.reason


def test_fillable_disk_is_a_disk(tmp_path: Path) -> None:
    disk: Disk = FillableDisk(OsDisk(tmp_path))  # type: ignore[assignment]
    disk.append("f", b"x")
    assert disk.read("f") == b"x"
