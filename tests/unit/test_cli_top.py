"""``skulk top``: the frame drawn from the API's JSON (pure), with and without the nodes'
``serving`` and ``health`` fields, and the command against a fake API."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping

import httpx
import pytest
from rich.console import Console

from skulk.cli import ApiClient, run_client_command
from skulk.cli._top import (
    UNKNOWN_HEALTH,
    health,
    instance_phase,
    instance_row,
    kv_use,
    node_row,
    rate,
    seconds,
    serving_by_instance,
    top_frame,
)
from skulk.cli._top_loop import run_top
from tests.unit.test_cli_client import FakeApi, envelope, parse

GiB = 1024**3

PIPELINE = {
    "id": "3f2a9c1e0b7d",
    "model": "skulk-demo",
    "sharding": "pipeline",
    "status": "placed",
    "shards": [
        {"rank": 0, "node": "node-aaaa", "layers": [0, 2], "runner": {"phase": "ready"}},
        {"rank": 1, "node": "node-bbbb", "layers": [2, 4], "runner": {"phase": "ready"}},
    ],
}
LOADING = {
    "id": "77aa00bb11cc",
    "model": "org/other",
    "sharding": "single",
    "status": "placed",
    "shards": [
        {
            "rank": 0,
            "node": "node-bbbb",
            "layers": [0, 8],
            "runner": {"phase": "fetching", "bytes_done": 30, "bytes_total": 120},
        }
    ],
}


def serving(instance: str, rank: int, **fields: object) -> dict[str, object]:
    entry: dict[str, object] = {
        "instance_id": instance,
        "model": "skulk-demo",
        "rank": rank,
        "phase": "ready",
        "running": 0,
        "waiting": 0,
        "kv_used_bytes": 0,
        "kv_capacity_bytes": GiB,
        "tokens_per_s": 0.0,
        "ttft_p50_s": None,
    }
    entry.update(fields)
    return entry


NODE_A: dict[str, object] = {
    "node_id": "node-aaaa",
    "status": "up",
    "age_s": 0.4,
    "memory_total_bytes": 16 * GiB,
    "memory_available_bytes": 10 * GiB,
    "load_1m": 1.5,
    "health": {
        "level": "warn",
        "reasons": [
            {"code": "disk_low", "level": "warn", "message": "2.0 GiB free", "remedy": "free it"},
            {"code": "late_heartbeats", "level": "warn", "message": "late", "remedy": "look"},
        ],
    },
    "serving": [
        serving(
            "3f2a9c1e0b7d",
            0,
            running=3,
            waiting=2,
            kv_used_bytes=GiB // 4,
            tokens_per_s=41.25,
            ttft_p50_s=0.035,
        )
    ],
}
NODE_B: dict[str, object] = {
    "node_id": "node-bbbb",
    "status": "up",
    "age_s": 12.0,
    "memory_total_bytes": 8 * GiB,
    "memory_available_bytes": 2 * GiB,
    "load_1m": 0.25,
    "health": {"level": "ok", "reasons": []},
    # Rank 1 of the pipeline sees the same requests: its counts must not be added.
    "serving": [serving("3f2a9c1e0b7d", 1, running=3, waiting=2, kv_used_bytes=GiB // 4)],
}
# A node as a server without issue 21's fields sends it (and one known only from the State).
BARE_NODE: dict[str, object] = {
    "node_id": "node-aaaa",
    "status": "up",
    "age_s": 0.4,
    "memory_total_bytes": 16 * GiB,
    "memory_available_bytes": 10 * GiB,
    "load_1m": 1.5,
}
STATE_ONLY: dict[str, object] = {"node_id": "node-cccc", "status": "down", "age_s": None}


def draw(instances: list[Mapping[str, object]], nodes: list[Mapping[str, object]]) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(top_frame(instances, nodes))
    return console.export_text()


def line_with(frame: str, needle: str) -> list[str]:
    """The cells (split on runs of two spaces) of the one line holding ``needle``."""
    [line] = [row for row in frame.splitlines() if needle in row]
    return [cell.strip() for cell in line.split("  ") if cell.strip()]


def test_an_instance_row_aggregates_its_ranks_serving_entries() -> None:
    grouped = serving_by_instance([NODE_B, NODE_A])
    assert [e["rank"] for e in grouped["3f2a9c1e0b7d"]] == [0, 1]
    row = instance_row(PIPELINE, grouped["3f2a9c1e0b7d"])
    assert row == (
        "3f2a9c1e0b7d",
        "skulk-demo",
        "pipeline",
        "ready",
        "node-aaaa,node-bbbb",
        "3/2",  # rank 0's counts, not 6/4
        "41.2",
        "25% of 2.0 GiB",  # 0.5 of 2 GiB over both ranks
        "35 ms",
    )


def test_an_instance_without_serving_entries_shows_dashes() -> None:
    row = instance_row(LOADING, [])
    assert row[3] == "fetching 25%"
    assert row[5:] == ("-", "-", "-", "-")


def test_instance_phase_is_one_word_when_ranks_agree() -> None:
    mixed = {**PIPELINE, "shards": [PIPELINE["shards"][0], LOADING["shards"][0]]}
    assert instance_phase(PIPELINE) == "ready"
    assert instance_phase(mixed) == "ready,fetching 25%"
    assert instance_phase({**PIPELINE, "status": "failed"}) == "failed"
    assert instance_phase({"status": "placed"}) == "placed"


def test_a_node_row_shows_memory_health_and_first_reason() -> None:
    assert node_row(NODE_A) == (
        "node-aaaa",
        "up",
        "warn",
        "6.0 GiB",
        "10.0 GiB",
        "1.50",
        "0.4s",
        "disk_low: 2.0 GiB free (+1 more)",
    )
    assert node_row(NODE_B)[2:4] == ("ok", "6.0 GiB")
    assert node_row(NODE_B)[-1] == "-"


def test_a_node_without_health_shows_a_question_mark() -> None:
    assert node_row(BARE_NODE)[2] == UNKNOWN_HEALTH == "?"
    assert node_row({**BARE_NODE, "load_1m": float("nan")})[5] == "-"
    assert node_row(STATE_ONLY) == ("node-cccc", "down", "?", "-", "-", "-", "-", "-")


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, ("?", "-")),
        ("error", ("?", "-")),
        ({"level": "ok", "reasons": []}, ("ok", "-")),
        ({"level": "error", "reasons": [{"code": "down"}]}, ("error", "down")),
        ({"level": 3, "reasons": "nope"}, ("?", "-")),
        ({"reasons": [{"code": "x", "message": "m"}]}, ("?", "x: m")),
    ],
)
def test_health_tolerates_any_shape(value: object, shown: tuple[str, str]) -> None:
    assert health(value) == shown


def test_malformed_serving_entries_are_skipped_or_dashed() -> None:
    nodes: list[Mapping[str, object]] = [
        {"node_id": "n1", "serving": "not a list"},
        {"node_id": "n2", "serving": [1, None, {"rank": 0}, {"instance_id": 7, "rank": 0}]},
        {
            "node_id": "n3",
            "serving": [
                serving("3f2a9c1e0b7d", "zero", running="3"),  # type: ignore[arg-type]
                serving(
                    "3f2a9c1e0b7d",
                    0,
                    running=True,
                    waiting=None,
                    tokens_per_s="fast",
                    ttft_p50_s=float("nan"),
                    kv_used_bytes=-1.5,
                    kv_capacity_bytes=None,
                ),
            ],
        },
    ]
    grouped = serving_by_instance(nodes)
    assert list(grouped) == ["3f2a9c1e0b7d"]
    assert [e["rank"] for e in grouped["3f2a9c1e0b7d"]] == [0, "zero"]  # bad ranks last
    row = instance_row(PIPELINE, grouped["3f2a9c1e0b7d"])
    # Rank 0's mistyped numbers show dashes; the KV sum takes the well-typed ones it has.
    assert row[5:] == ("-", "-", "0% of 1.0 GiB", "-")
    frame = draw([PIPELINE], nodes)  # draws without raising
    assert "3f2a9c1e0b7d" in frame


def test_latency_and_kv_formats() -> None:
    odd = (None, -1, "1", True, float("nan"), float("inf"))
    assert [seconds(v) for v in (0.0354, 1.234, *odd)] == ["35 ms", "1.23 s"] + ["-"] * 6
    assert [rate(v) for v in (12.34, 0, *odd)] == ["12.3", "0.0"] + ["-"] * 6
    assert kv_use(0, GiB) == "0% of 1.0 GiB"
    assert kv_use(2 * GiB, GiB) == "100% of 1.0 GiB"
    assert kv_use(1, 0) == "-"


def test_the_frame_with_serving_and_health() -> None:
    frame = draw([LOADING, PIPELINE], [NODE_B, NODE_A])
    assert "Instances (2)" in frame and "Nodes (2)" in frame
    assert line_with(frame, "3f2a9c1e0b7d")[5:] == ["3/2", "41.2", "25% of 2.0 GiB", "35 ms"]
    assert line_with(frame, "77aa00bb11cc")[3] == "fetching 25%"
    assert line_with(frame, "disk_low")[:3] == ["node-aaaa", "up", "warn"]
    assert line_with(frame, "12s")[:3] == ["node-bbbb", "up", "ok"]
    # Sorted by id whatever order the server sent.
    assert frame.index("3f2a9c1e0b7d") < frame.index("77aa00bb11cc")
    starts = [line.split()[0] for line in frame.splitlines() if line.startswith("node-")]
    assert starts == ["node-aaaa", "node-bbbb"]


def test_the_frame_without_serving_and_health() -> None:
    frame = draw([PIPELINE], [BARE_NODE, STATE_ONLY])
    assert line_with(frame, "3f2a9c1e0b7d")[5:] == ["-", "-", "-", "-"]
    assert line_with(frame, "1.50")[2] == "?"
    assert line_with(frame, "node-cccc") == ["node-cccc", "down", "?", "-", "-", "-", "-", "-"]


def test_the_frame_of_an_empty_cluster() -> None:
    frame = draw([], [])
    assert "Instances (0)" in frame and "Nodes (0)" in frame


def answers(instances: object, nodes: object) -> FakeApi:
    return FakeApi(
        {
            ("GET", "/v1/instances"): httpx.Response(200, json={"instances": instances}),
            ("GET", "/v1/cluster/nodes"): httpx.Response(200, json={"nodes": nodes}),
        }
    )


def test_top_once_prints_one_frame(capsys: pytest.CaptureFixture[str]) -> None:
    api = answers([PIPELINE], [NODE_A, NODE_B])
    assert api.run("top", "--once") == 0
    out = capsys.readouterr().out
    assert out.startswith("skulk top  http://127.0.0.1:52415  ")
    assert line_with(out, "3f2a9c1e0b7d")[5] == "3/2"
    assert "\x1b[" not in out  # not a terminal: no escape codes
    assert [r.url.path for r in api.requests] == ["/v1/instances", "/v1/cluster/nodes"]


def test_top_once_on_a_pipe_cuts_nothing_whatever_columns_says(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status = run_client_command(
        parse("top", "--once"),
        transport=httpx.MockTransport(answers([PIPELINE], [NODE_A, NODE_B])),
        env={"COLUMNS": "80"},
    )
    assert status == 0
    out = capsys.readouterr().out
    assert "…" not in out
    assert line_with(out, "3f2a9c1e0b7d")[7] == "25% of 2.0 GiB"


def test_top_json_prints_both_answers(capsys: pytest.CaptureFixture[str]) -> None:
    assert answers([PIPELINE], [BARE_NODE]).run("top", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"instances": [PIPELINE], "nodes": [BARE_NODE]}


def test_top_once_errors_like_the_other_commands(capsys: pytest.CaptureFixture[str]) -> None:
    refused = FakeApi({("GET", "/v1/instances"): envelope(401, "invalid_api_key", "no key")})
    assert refused.run("top", "--once") == 1
    assert capsys.readouterr().err.startswith("skulk: invalid_api_key: no key")
    assert answers({"not": "a list"}, []).run("top", "--once") == 1
    assert "no 'instances' list" in capsys.readouterr().err


def test_the_live_view_keeps_going_when_the_api_stops_answering(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Three frames: the cluster, then an error frame (the API went away), then the cluster
    again; Ctrl-C (raised by the fourth sleep) ends it with exit 0."""
    calls = {"n": 0}

    def instances(request: httpx.Request) -> httpx.Response:
        calls["n"] += 1
        if calls["n"] == 2:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        return httpx.Response(200, json={"instances": [PIPELINE]})

    api = FakeApi(
        {
            ("GET", "/v1/instances"): instances,
            ("GET", "/v1/cluster/nodes"): httpx.Response(200, json={"nodes": [NODE_A]}),
        }
    )
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 3:
            raise KeyboardInterrupt

    screen = io.StringIO()
    terminal = Console(file=screen, force_terminal=True, width=200)
    with ApiClient("http://node:1", transport=httpx.MockTransport(api)) as client:
        status = run_top(
            client, once=False, as_json=False, environ={}, sleep=sleep, console=terminal
        )
    assert status == 0 and sleeps == [1.0, 1.0, 1.0]
    assert calls["n"] == 3
    drawn = screen.getvalue()
    error = drawn.index("cannot reach the Skulk API at http://node:1 (connection refused")
    assert drawn.index("3f2a9c1e0b7d") < error < drawn.rindex("3f2a9c1e0b7d")
    assert "(retrying)" in drawn


def test_top_without_once_on_a_pipe_prints_the_last_frame(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def interrupt(seconds: float) -> None:
        raise KeyboardInterrupt

    api = answers([PIPELINE], [NODE_A])
    status = run_client_command(
        parse("top"), transport=httpx.MockTransport(api), env={}, sleep=interrupt
    )
    assert status == 0
    assert line_with(capsys.readouterr().out, "3f2a9c1e0b7d")[5] == "3/2"
