"""Who downloads a Hub model, and the leader's duties when a download fails (pure)."""

from __future__ import annotations

from skulk.cluster import (
    LeaderView,
    Reachable,
    State,
    apply,
    choose_downloader,
    download_commands,
    next_commands,
)
from skulk.wire.cluster import (
    Applied,
    ClusterCommand,
    DownloadFailed,
    NodeStatusChanged,
    StartDownload,
    UpsertNode,
)

C = "c" * 40


def run(*commands: ClusterCommand, state: State | None = None) -> State:
    state = State() if state is None else state
    for command in commands:
        state, result = apply(state, command)
        assert result == Applied(), (command, result)
    return state


def cluster() -> State:
    return run(*(UpsertNode(n, f"http://{n}", f"ws://{n}", at=1) for n in ("a", "b", "c")))


def test_the_node_with_most_room_downloads_the_preferred_among_near_equals() -> None:
    room = {"a": 100, "b": 95, "c": 300}
    usable = {"a", "b", "c"}
    assert choose_downloader(room, 50, usable) == "c"
    assert choose_downloader(room, 50, usable, prefer=("a",)) == "c"  # a has far less room
    room["c"] = 104
    assert choose_downloader(room, 50, usable, prefer=("a",)) == "a"  # within 10 %
    assert choose_downloader(room, 101, usable, prefer=("a",)) == "c"  # a cannot fit it
    assert choose_downloader(room, 50, usable, exclude={"c"}) == "a"
    assert choose_downloader(room, 500, usable) is None
    assert choose_downloader(room, 50, {"b"}) == "b"
    assert choose_downloader({}, 0, usable) is None  # no store readings yet


def test_a_failed_download_is_re_placed_away_from_every_node_that_failed_it() -> None:
    room = {"a": 1000, "b": 900, "c": 800}
    state = run(StartDownload("org/m", "org/m", C, "a", 500, at=2), state=cluster())
    usable = {"a", "b", "c"}
    assert download_commands(state, usable, room, 3) == []  # running: nothing to do
    state = run(DownloadFailed("org/m", "a", "hub_unreachable", "", at=3), state=state)
    assert download_commands(state, usable, room, 4) == [
        StartDownload("org/m", "org/m", C, "b", 500, 4)
    ]
    state = run(StartDownload("org/m", "org/m", C, "b", 500, at=4), state=state)
    state = run(DownloadFailed("org/m", "b", "disk_full", "", at=5), state=state)
    assert download_commands(state, usable, {"a": 1000, "b": 900, "c": 100}, 6) == []  # c too small
    assert download_commands(state, usable, room, 6) == [
        StartDownload("org/m", "org/m", C, "c", 500, 6)
    ]
    state = run(StartDownload("org/m", "org/m", C, "c", 500, at=6), state=state)
    state = run(DownloadFailed("org/m", "c", "hub_unreachable", "", at=7), state=state)
    assert download_commands(state, usable, room, 8) == []  # every node failed: it stays so


def test_a_download_on_a_node_gone_down_fails_and_moves_in_one_round() -> None:
    state = run(StartDownload("org/m", "org/m", C, "a", 500, at=2), state=cluster())
    reachable = {n: Reachable(f"http://{n}", f"ws://{n}") for n in ("b", "c")}
    view = LeaderView(reachable, {"a": 60_000}, {}, store_room={"a": 10**9, "b": 10**6, "c": 10**7})
    commands = next_commands(state, view, 100, iter(()))
    assert NodeStatusChanged("a", "down", 100) in commands
    failed = [c for c in commands if isinstance(c, DownloadFailed)]
    assert [(c.node, c.reason) for c in failed] == [("a", "node_down")]
    assert StartDownload("org/m", "org/m", C, "c", 500, 100) in commands
    for command in commands:  # they apply, in order
        state, result = apply(state, command)
        assert result == Applied(), command
    running = state.download("org/m")
    assert running is not None and running.node == "c"
