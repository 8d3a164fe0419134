"""Pulling a Hub model into the cluster: the leader's choice of downloader, and the statuses
the asking node follows (with a fake host: the State is changed by the test)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import attrs
import pytest
import trio
import trio.testing

from skulk.cluster import State, apply
from skulk.control import PullFailed, PullStatus, hub_model_id
from skulk.control._control import model_id
from skulk.control._pull import INFO_WAIT_S, decide_pull, pull_statuses
from skulk.hub import HubPlan, HubRef, RepoNotFound
from skulk.wire.cluster import (
    Applied,
    Architecture,
    ClusterCommand,
    ClusterResult,
    ControlCall,
    ControlRefused,
    ControlReply,
    DownloadFailed,
    HubSource,
    ModelCard,
    PullAsk,
    Pulling,
    RegisterModel,
    StartDownload,
    UpsertNode,
)
from skulk.wire.telemetry import ModelTransfer, NodeReadings, StoreReading

C = "c" * 40
SIZE = 1000


def readings(node: str, room: int | None, *transfers: ModelTransfer) -> NodeReadings:
    store = None if room is None else StoreReading(0, None, room)
    return NodeReadings(
        node, node, "linux", 1, 1, "", ("cpu",), 1, 0.0, (), "", 0.0,
        transfers=transfers, store=store,
    )  # fmt: skip


def run(state: State, *commands: ClusterCommand) -> State:
    for command in commands:
        state, result = apply(state, command)
        assert result == Applied(), (command, result)
    return state


def cluster(*nodes: str) -> State:
    return run(State(), *(UpsertNode(n, "", "", at=1) for n in nodes))


class Recorder:
    def __init__(self) -> None:
        self.commands: list[ClusterCommand] = []

    async def __call__(self, command: ClusterCommand) -> ClusterResult:
        self.commands.append(command)
        return Applied()


def ask(prefer: tuple[str, ...] = ()) -> PullAsk:
    return PullAsk("org/m", "org/m", C, SIZE, prefer)


async def test_the_leader_starts_one_download_where_there_is_room() -> None:
    state = cluster("a", "b", "c")
    seen = {"a": readings("a", 5000), "b": readings("b", 5200), "c": readings("c", 10)}
    submit = Recorder()
    reply = await decide_pull(ask(prefer=("a",)), state, {"a", "b", "c"}, seen, submit)
    assert reply == Pulling("org/m", "a", existed=False)  # a asked, within 10 % of b
    (command,) = submit.commands
    assert isinstance(command, StartDownload) and command.node == "a"
    running = run(state, command)
    again = await decide_pull(ask(), running, {"a", "b", "c"}, seen, submit)
    assert again == Pulling("org/m", "a", existed=True) and len(submit.commands) == 1
    # No room anywhere: disk_full with the arithmetic, nothing committed.
    tight = {n: readings(n, 999) for n in "abc"}
    refused = await decide_pull(ask(), state, {"a", "b", "c"}, tight, submit)
    assert isinstance(refused, ControlRefused) and refused.code == "disk_full"
    assert (refused.need, refused.have) == (SIZE, 999)
    pending = await decide_pull(ask(), state, {"a", "b", "c"}, {}, submit)
    assert isinstance(pending, ControlRefused) and pending.code == "placement_info_pending"
    assert len(submit.commands) == 1


async def test_a_retry_after_every_node_failed_tries_them_again() -> None:
    state = cluster("a", "b")
    for node in ("a", "b"):
        state = run(
            state,
            StartDownload("org/m", "org/m", C, node, SIZE, at=2),
            DownloadFailed("org/m", node, "hub_unreachable", "", at=3),
        )
    seen = {n: readings(n, 5000) for n in "ab"}
    submit = Recorder()
    reply = await decide_pull(ask(prefer=("b",)), state, {"a", "b"}, seen, submit)
    assert reply == Pulling("org/m", "b", existed=False)


def test_hub_ids_name_cards_by_repo_and_revision(tmp_path: Path) -> None:
    assert hub_model_id(HubRef("org/m")) == "org/m"
    assert hub_model_id(HubRef("org/m", "main")) == "org/m"
    assert hub_model_id(HubRef("org/m", "v2")) == "org/m@v2"
    assert model_id("org/m@main") == "org/m" and model_id("org/m@v2") == "org/m@v2"
    assert model_id(str(tmp_path)) == tmp_path.name


def card(holders: tuple[str, ...]) -> ModelCard:
    arch = Architecture("llama", 2, 64, 4, 4, 256)
    return ModelCard("org/m", HubSource("org/m", C), arch, SIZE, 2048, "f" * 64, holders)


class Host:
    """A node's view for :func:`pull_statuses`: the State and readings, set by the test."""

    node_id = "a"

    def __init__(self, state: State, seen: Mapping[str, NodeReadings]) -> None:
        self.state = state
        self.applied = 0
        self.seen = dict(seen)
        self.asked: list[ControlCall] = []
        self.checks = 0
        self.fail_check: Exception | None = None
        self._changed = trio.Event()

    def set(self, state: State) -> None:
        self.state, self.applied = state, self.applied + 1
        self._changed.set()
        self._changed = trio.Event()

    async def wait_change(self, seen: int) -> None:
        while self.applied == seen:
            await self._changed.wait()

    async def ask(self, call: ControlCall) -> ControlReply:
        self.asked.append(call)
        assert isinstance(call, PullAsk)
        command = StartDownload(call.model, call.repo, call.commit, "b", call.total_bytes, 5)
        self.set(run(self.state, command))
        return Pulling(call.model, "b", existed=False)

    async def check_hub(self, name: str) -> HubPlan:
        self.checks += 1
        if self.fail_check is not None:
            raise self.fail_check
        return HubPlan(HubRef("org/m"), C, (), "llama", "http://hub", None)

    def readings(self) -> Mapping[str, NodeReadings]:
        return self.seen


def transfer(source: str, done: int) -> ModelTransfer:
    return ModelTransfer("org/m", source, done, SIZE, "w.safetensors", done, SIZE, 1.0, 1.0, 0)


async def test_a_pull_follows_the_download_then_the_spread_to_done(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = Host(cluster("a", "b", "c"), {n: readings(n, 5000) for n in "abc"})
    statuses: list[PullStatus] = []
    async with trio.open_nursery() as nursery:

        async def follow() -> None:
            async for status in pull_statuses(host, "org/m"):
                statuses.append(status)

        nursery.start_soon(follow)
        await trio.sleep(1)
        assert statuses[0].phase == "checking" and host.checks == 1
        assert isinstance(host.asked[0], PullAsk) and host.asked[0].prefer == ("a",)
        host.seen["b"] = readings("b", 5000, transfer("hub", 400))
        await trio.sleep(1)
        last = statuses[-1]
        assert (last.phase, last.downloader, last.done_bytes) == ("downloading", "b", 400)
        host.seen["b"] = readings("b", 5000)
        host.set(run(host.state, RegisterModel(card(("b",)))))
        host.seen["c"] = readings("c", 5000, transfer("peers", 300))
        await trio.sleep(1)
        last = statuses[-1]
        assert last.phase == "spreading" and last.nodes == ("a", "b", "c")
        assert (last.done_bytes, last.target_bytes) == (SIZE + 300, 3 * SIZE)
        host.set(run(host.state, RegisterModel(card(("a", "b", "c")))))
        await trio.sleep(1)
    assert statuses[-1].phase == "done" and statuses[-1].holders == ("a", "b", "c")
    assert statuses[-1].done_bytes == statuses[-1].target_bytes == 3 * SIZE
    assert host.checks == 1


async def test_a_pull_ends_typed_when_the_check_or_every_download_fails(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = Host(cluster("a", "b"), {n: readings(n, 5000) for n in "ab"})
    host.fail_check = RepoNotFound("org/m")
    with pytest.raises(RepoNotFound):
        async for _ in pull_statuses(host, "org/m"):
            pass
    assert host.asked == []  # nothing asked of the leader
    host.fail_check = None
    with pytest.raises(PullFailed) as failed:
        async for status in pull_statuses(host, "org/m"):
            if status.phase == "downloading" and host.state.download("org/m"):
                host.set(run(host.state, DownloadFailed("org/m", "b", "hash_mismatch", "x", 6)))
    assert failed.value.reason == "hash_mismatch"


async def test_a_model_already_held_everywhere_is_done_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = Host(run(cluster("a", "b"), RegisterModel(card(("a", "b")))), {})
    phases = [s.phase async for s in pull_statuses(host, "org/m")]
    assert phases == ["checking", "done"] and host.checks == 0 and host.asked == []
    assert attrs.has(PullStatus)


class SlowLeader(Host):
    """A leader with no store reading for the first ``pending`` asks (a cluster just started)."""

    def __init__(self, state: State, pending: int) -> None:
        super().__init__(state, {})
        self.pending = pending

    async def ask(self, call: ControlCall) -> ControlReply:
        if self.pending:
            self.pending -= 1
            self.asked.append(call)
            return ControlRefused("placement_info_pending", "no store reading yet")
        return await super().ask(call)


async def test_a_pull_asks_again_while_the_leader_has_no_store_reading(
    autojump_clock: trio.testing.MockClock,
) -> None:
    host = SlowLeader(cluster("a", "b"), pending=3)
    statuses = pull_statuses(host, "org/m")
    phases = [(await statuses.__anext__()).phase for _ in range(5)]
    await statuses.aclose()
    assert phases == ["checking"] * 4 + ["downloading"]
    assert len(host.asked) == 4 and host.checks == 1  # checked once, asked until answered
    assert host.state.download("org/m") is not None
    never = SlowLeader(cluster("a", "b"), pending=10**6)
    start = trio.current_time()
    with pytest.raises(PullFailed) as failed:
        async for _ in pull_statuses(never, "org/m"):
            pass
    assert failed.value.reason == "placement_info_pending"
    assert trio.current_time() - start >= INFO_WAIT_S  # the mock clock's time
    assert len(never.asked) > 1 and never.state.downloads == ()
