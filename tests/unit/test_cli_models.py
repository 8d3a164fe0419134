"""``skulk pull``, ``skulk models`` and ``skulk rm-model`` against a fake API
(``httpx.MockTransport``), and the progress they print."""

from __future__ import annotations

import argparse
import io
import json

import httpx
import pytest

from skulk.cli import add_client_commands
from skulk.cli._args import DEFAULT_PULL_TIMEOUT, DEFAULT_TIMEOUT
from skulk.cli._commands import request_timeout
from skulk.cli._models import done_line, models_table, pull_reporter, status_summary

from .test_cli_client import FakeApi, envelope

GiB = 1024**3
COMMIT = "c" * 40


def status(phase: str, done: int, target: int = 4 * GiB, **extra: object) -> dict[str, object]:
    return {
        "model": "org/m", "phase": phase, "repo": "org/m", "commit": COMMIT,
        "total_bytes": 2 * GiB, "done_bytes": done, "target_bytes": target,
        "downloader": "a", "holders": [], "nodes": ["a", "b"], "transfers": [], **extra,
    }  # fmt: skip


STATUSES = [
    status("checking", 0),
    status("downloading", GiB, 2 * GiB),
    status("downloading", 2 * GiB, 2 * GiB),
    status("spreading", 3 * GiB, holders=["a"]),
    status("done", 4 * GiB, holders=["a", "b"]),
]


def ndjson(lines: list[dict[str, object]], status: int = 200) -> httpx.Response:
    body = "".join(json.dumps(line) + "\n" for line in lines).encode()
    return httpx.Response(status, content=body, headers={"content-type": "application/x-ndjson"})


def test_pull_streams_the_pull_and_prints_the_holders(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({("POST", "/v1/pulls"): ndjson(STATUSES)})
    assert api.run("pull", "org/m@main") == 0
    assert api.bodies() == [{"model": "org/m@main", "stream": True}]
    out, err = capsys.readouterr()
    assert out == f"pulled org/m (org/m@{COMMIT[:12]}, 2.0 GiB); held by a, b\n"
    progress = err.splitlines()  # not a terminal: a line per phase and per tenth
    assert progress[0] == "org/m@main: checking 0 B/4.0 GiB"
    assert "org/m@main: downloading 1.0 GiB/2.0 GiB on a" in progress
    assert progress[-1] == "org/m@main: done 4.0 GiB/4.0 GiB (2/2 nodes hold it)"


def test_a_pull_done_with_nodes_lacking_it_names_them() -> None:
    """The cluster ends a pull whose spreading stalled (a node without room, a failed fetch):
    the done line says which up nodes do not hold the model."""
    stalled = status("done", 3 * GiB, holders=["a"], nodes=["a", "b", "c"])
    line = done_line(stalled)
    assert line.startswith(f"pulled org/m (org/m@{COMMIT[:12]}, 2.0 GiB); held by a; not on b, c")
    assert "not on" not in done_line(status("done", 4 * GiB, holders=["a", "b"]))
    odd = done_line({"phase": "done", "holders": "a", "nodes": [1, None]})
    assert "held by" in odd and "not on 1, None" in odd


def test_pull_json_prints_the_lines_as_sent(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({("POST", "/v1/pulls"): ndjson(STATUSES)})
    assert api.run("pull", "org/m", "--json") == 0
    out = capsys.readouterr().out
    assert [json.loads(line) for line in out.splitlines()] == STATUSES


def test_pull_refused_before_the_stream_is_the_typed_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = FakeApi(
        {("POST", "/v1/pulls"): envelope(404, "repo_not_found", "Hub repo org/x not found")}
    )
    assert api.run("pull", "org/x") == 1
    assert capsys.readouterr().err == "skulk: repo_not_found: Hub repo org/x not found\n"


def test_pull_failed_mid_stream_is_the_typed_error(capsys: pytest.CaptureFixture[str]) -> None:
    failed = {"error": {"message": "no node has room", "type": "server_error", "code": "disk_full"}}
    api = FakeApi({("POST", "/v1/pulls"): ndjson([STATUSES[0], STATUSES[1], failed])})
    assert api.run("pull", "org/m") == 1
    out, err = capsys.readouterr()
    assert out == "" and err.endswith("skulk: disk_full: no node has room\n")


@pytest.mark.parametrize(
    "lines",
    [STATUSES[:3], []],
)
def test_a_stream_that_ends_before_done_is_a_bad_response(
    lines: list[dict[str, object]], capsys: pytest.CaptureFixture[str]
) -> None:
    api = FakeApi({("POST", "/v1/pulls"): ndjson(lines)})
    assert api.run("pull", "org/m") == 1
    assert "the stream ended before the pull was done" in capsys.readouterr().err


def test_a_stream_line_that_is_not_json_is_a_bad_response(
    capsys: pytest.CaptureFixture[str],
) -> None:
    api = FakeApi(
        {("POST", "/v1/pulls"): httpx.Response(200, content=b'{"phase": "checking"}\nnope\n')}
    )
    assert api.run("pull", "org/m") == 1
    assert "a line of the stream is not JSON" in capsys.readouterr().err


def test_pull_with_no_api_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("[Errno 111] Connection refused", request=request)

    api = FakeApi({("POST", "/v1/pulls"): refuse})
    assert api.run("pull", "org/m") == 2
    assert "connection refused" in capsys.readouterr().err


def test_the_bar_on_a_terminal_shows_phase_bytes_and_speed() -> None:
    stream = io.StringIO()
    moving = status(
        "downloading", GiB, 2 * GiB,
        transfers=[{"node": "a", "rate_bps": 50 * 1024**2, "eta_s": 20.0}],
    )  # fmt: skip
    with pull_reporter(stream, "org/m", terminal=True) as report:
        report(moving)
    drawn = stream.getvalue()
    assert "org/m" in drawn and "downloading" in drawn
    assert "50.0 MiB/s, 20s left" in drawn and "1.0/2.0 GiB" in drawn


def test_status_summary_tolerates_odd_statuses() -> None:
    assert status_summary({}) == "-"
    assert status_summary({"phase": "checking", "target_bytes": "x"}) == "checking"


STORE = {
    "node": "a",
    "store": {
        "used_bytes": 3 * GiB, "budget_bytes": 20 * GiB, "available_bytes": 17 * GiB,
        "stored": [
            {"sha256": "1" * 64, "names": ["org/m"], "size": 2 * GiB, "last_used": 940.0,
             "models": ["org/m"], "holders": ["a", "b"]},
            {"sha256": "2" * 64, "names": ["local-dir"], "size": GiB, "last_used": 0,
             "models": [], "holders": []},
        ],
    },
    "nodes": [],
    "models": [
        {"model": "org/m", "manifest_sha256": "1" * 64, "weight_bytes": 2 * GiB,
         "source": {"kind": "hub", "repo": "org/m", "commit": COMMIT}, "holders": ["a", "b"]},
        {"model": "org/n", "manifest_sha256": "3" * 64, "weight_bytes": GiB,
         "source": {"kind": "hub", "repo": "org/n", "commit": COMMIT}, "holders": ["b"]},
    ],
}  # fmt: skip


def test_models_table_lists_cards_then_what_only_this_store_holds() -> None:
    assert models_table(STORE, now=1000.0).splitlines() == [
        "MODEL      SIZE     HOLDERS  HERE  LAST USED  SOURCE",
        "org/m      2.0 GiB  a,b      yes   1m         hub",
        "org/n      1.0 GiB  b        no    -          hub",
        "local-dir  1.0 GiB  -        yes   -          store",
        "",
        "this node (a): 3.0 GiB used, 17.0 GiB available, budget 20.0 GiB",
    ]


def test_models_table_tolerates_an_empty_or_odd_answer() -> None:
    assert models_table({}, now=0.0) == "MODEL  SIZE  HOLDERS  HERE  LAST USED  SOURCE"
    odd = {"models": [1, {"model": None}], "store": {"stored": "x"}}
    assert models_table(odd, now=0.0).splitlines()[1].startswith("-")


def test_models_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({("GET", "/v1/store"): httpx.Response(200, json=STORE)})
    assert api.run("models") == 0
    assert capsys.readouterr().out.startswith("MODEL ")


def test_rm_model_quotes_the_name_and_prints_what_went(capsys: pytest.CaptureFixture[str]) -> None:
    answer = {"node": "a", "removed": {"sha256": "1" * 64, "names": ["org/m"]}}
    api = FakeApi({("DELETE", "/v1/store/org%2Fm"): httpx.Response(200, json=answer)})
    assert api.run("rm-model", "org/m") == 0
    assert capsys.readouterr().out == f"removed org/m ({'1' * 16}) from the store of a\n"


def test_rm_model_in_use_is_the_servers_409(capsys: pytest.CaptureFixture[str]) -> None:
    refused = envelope(409, "model_in_use", "model 'org/m' is in use by instance(s) i1")
    api = FakeApi({("DELETE", "/v1/store/org%2Fm"): refused})
    assert api.run("rm-model", "org/m") == 1
    assert capsys.readouterr().err.startswith("skulk: model_in_use: ")


def test_pull_waits_longer_for_news_than_other_commands_unless_told() -> None:
    parser = argparse.ArgumentParser(prog="skulk")
    add_client_commands(parser.add_subparsers(dest="command", required=True))
    assert request_timeout(parser.parse_args(["pull", "org/m"])) == DEFAULT_PULL_TIMEOUT
    assert request_timeout(parser.parse_args(["pull", "org/m", "--timeout", "5"])) == 5.0
    assert request_timeout(parser.parse_args(["models"])) == DEFAULT_TIMEOUT
