"""The client commands (place, ps, nodes, rm): tables, arguments, and the HTTP path against a
fake API (``httpx.MockTransport``). ``top`` and ``place --wait``: test_cli_top, test_cli_wait."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
from collections.abc import Callable

import httpx
import pytest

from skulk.__main__ import main
from skulk.cli import CLIENT_COMMANDS, add_client_commands, run_client_command
from skulk.cli._commands import place_body, resolve_instance
from skulk.cli._tables import (
    age,
    instances_table,
    layers,
    memory,
    nodes_table,
    plan_table,
    render_table,
    runner_failures,
    shards_table,
    size,
)

GiB = 1024**3

INSTANCE_A = {
    "id": "3f2a9c1e0b7d",
    "model": "skulk-demo",
    "sharding": "single",
    "status": "placed",
    "shards": [
        {
            "rank": 0,
            "node": "node-aaaa",
            "layers": [0, 4],
            "runner": {"phase": "ready", "failure": None},
        }
    ],
}
INSTANCE_B = {
    "id": "3f9b00c1d2e3",
    "model": "org/big-model",
    "sharding": "pipeline",
    "status": "failed",
    "shards": [
        {
            "rank": 0,
            "node": "node-aaaa",
            "layers": [0, 16],
            "runner": {"phase": "ready", "failure": None},
        },
        {
            "rank": 1,
            "node": "node-bbbb",
            "layers": [16, 32],
            "address": "10.0.0.2:53416",
            "runner": {"phase": "failed", "failure": "out of memory loading layer 20"},
        },
    ],
}
NODES: list[dict[str, object]] = [
    {
        "node_id": "node-aaaa",
        "status": "up",
        "epoch": 2,
        "seq": 40,
        "age_s": 0.4,
        "hostname": "alpha",
        "platform": "linux-x86_64",
        "memory_total_bytes": 16 * GiB,
        "memory_available_bytes": 10 * GiB + GiB // 2,
        "mlx_version": "0.29.0",
        "mlx_backends": ["cpu"],
        "cpu_count": 8,
        "load_1m": 0.5,
        "listen_addresses": ["ws://10.0.0.1:52416"],
        "api_address": "http://10.0.0.1:52415",
        "sampled_at": 1.7e9,
    },
    {"node_id": "node-cccc", "status": None, "age_s": 75.0, "memory_total_bytes": 8 * GiB},
    {"node_id": "node-dddd", "status": "down"},
]
PLAN = {
    "model": "org/big-model",
    "sharding": "pipeline",
    "shards": [
        {
            "rank": 0,
            "node": "node-aaaa",
            "layers": [0, 16],
            "need_bytes": 3 * GiB,
            "available_bytes": 10 * GiB,
        },
        {
            "rank": 1,
            "node": "node-bbbb",
            "layers": [16, 32],
            "need_bytes": 512 * 1024**2,
            "address": "10.0.0.2:53417",
        },
    ],
}


# --- tables (pure) -------------------------------------------------------------------------


def test_render_table_aligns_columns_without_trailing_spaces() -> None:
    table = render_table(("A", "LONG HEADER", "C"), [("xxxx", "y", ""), ("z", "w", "last")])
    assert table.splitlines() == [
        "A     LONG HEADER  C",
        "xxxx  y",
        "z     w            last",
    ]


def test_instances_table_lists_nodes_and_phases_in_rank_order() -> None:
    assert instances_table([INSTANCE_A, INSTANCE_B]).splitlines() == [
        "INSTANCE      MODEL          SHARDING  STATUS  READY  NODES                PHASES",
        "3f2a9c1e0b7d  skulk-demo     single    placed  1/1    node-aaaa            ready",
        "3f9b00c1d2e3  org/big-model  pipeline  failed  1/2    node-aaaa,node-bbbb  ready,failed",
    ]


def test_instances_table_with_no_instances_is_the_header_alone() -> None:
    assert instances_table([]) == "INSTANCE  MODEL  SHARDING  STATUS  READY  NODES  PHASES"


def test_instances_table_tolerates_missing_fields() -> None:
    lines = instances_table([{"id": "abc"}]).splitlines()
    assert lines[1].split() == ["abc", "-", "-", "-", "-", "-", "-"]


def test_runner_failures_name_instance_rank_node_and_reason() -> None:
    assert runner_failures([INSTANCE_A, INSTANCE_B]) == [
        "3f9b00c1d2e3 rank 1 on node-bbbb: failed: out of memory loading layer 20"
    ]


def test_nodes_table_shows_status_memory_load_and_age() -> None:
    assert nodes_table(NODES).splitlines() == [
        "NODE       STATUS  HOST   API                    MEMORY FREE/TOTAL  CPUS  LOAD  AGE",
        "node-aaaa  up      alpha  http://10.0.0.1:52415  10.5/16.0 GiB      8     0.50  0.4s",
        "node-cccc  -       -      -                      -/8.0 GiB          -     -     1m",
        "node-dddd  down    -      -                      -                  -     -     -",
    ]


def test_plan_and_shard_tables() -> None:
    assert plan_table(PLAN).splitlines() == [
        "RANK  NODE       LAYERS  ADDRESS         NEED       FREE",
        "0     node-aaaa  0:16    -               3.0 GiB    10.0 GiB",
        "1     node-bbbb  16:32   10.0.0.2:53417  512.0 MiB  -",
    ]
    assert shards_table(INSTANCE_B).splitlines() == [
        "RANK  NODE       LAYERS  ADDRESS         RUNNER",
        "0     node-aaaa  0:16    -               ready",
        "1     node-bbbb  16:32   10.0.0.2:53416  failed",
    ]
    fetching = {"shards": [{"rank": 0, "runner": {"phase": "fetching", "bytes_done": 30,
                                                  "bytes_total": 120}}]}  # fmt: skip
    assert shards_table(fetching).splitlines()[1].split()[-2:] == ["fetching", "25%"]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1536, "1.5 KiB"),
        (5 * GiB, "5.0 GiB"),
        (3 * 1024**5, "3072.0 TiB"),
        (-1, "-"),
        (None, "-"),
        (True, "-"),
        ("12", "-"),
    ],
)
def test_size(value: object, shown: str) -> None:
    assert size(value) == shown


@pytest.mark.parametrize(
    ("value", "shown"),
    [(0, "0.0s"), (9.94, "9.9s"), (12.7, "12s"), (125, "2m"), (7300, "2h"), (200000, "2d")],
)
def test_age(value: float, shown: str) -> None:
    assert age(value) == shown


def test_memory_and_layers_edge_cases() -> None:
    assert memory(512 * 1024**2, 2 * GiB) == "512.0 MiB/2.0 GiB"
    assert memory(None, None) == "-"
    assert layers([3, 9]) == "3:9"
    assert layers([3]) == "-" and layers(None) == "-" and layers([True, 2]) == "-"
    assert age(None) == "-" and age(-1) == "-"


# --- arguments -----------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="skulk")
    add_client_commands(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_client_commands_are_the_eight() -> None:
    assert set(CLIENT_COMMANDS) == {
        "place", "ps", "nodes", "rm", "top", "pull", "models", "rm-model"
    }  # fmt: skip


def test_place_arguments_become_the_placement_body() -> None:
    args = parse(
        "place",
        "org/m",
        "--sharding",
        "pipeline",
        "--nodes",
        "a, b",
        "--nodes",
        "c",
        "--exclude",
        "d",
        "--min-nodes",
        "2",
        "--max-nodes",
        "3",
        "--dry-run",
    )
    assert place_body(args) == {
        "model": "org/m",
        "sharding": "pipeline",
        "nodes": ["a", "b", "c"],
        "excluded_nodes": ["d"],
        "min_nodes": 2,
        "max_nodes": 3,
        "dry_run": True,
    }


def test_place_sends_only_the_options_given() -> None:
    assert place_body(parse("place", "skulk-demo")) == {"model": "skulk-demo"}


def test_common_options_on_every_command() -> None:
    for command in ("ps", "nodes"):
        args = parse(command, "--api", "http://h:1", "--json", "--timeout", "2.5")
        assert (args.api, args.json, args.timeout) == ("http://h:1", True, 2.5)
    args = parse("rm", "abc")
    # No --timeout: each request gets 30 s (place --wait waits 600 s in all: test_cli_wait).
    assert (args.instance, args.api, args.json, args.timeout) == ("abc", None, False, None)
    assert parse("ps", "-q").quiet


@pytest.mark.parametrize(
    "argv",
    [
        ("place",),
        ("place", "m", "--sharding", "diagonal"),
        ("place", "m", "--min-nodes", "0"),
        ("place", "m", "--max-nodes", "two"),
        ("place", "m", "--nodes", ","),
        ("ps", "--timeout", "0"),
        ("rm",),
    ],
)
def test_bad_arguments_are_usage_errors(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse(*argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_resolve_instance_by_id_or_unique_prefix() -> None:
    ids = ["3f2a9c1e0b7d", "3f9b00c1d2e3", "aa"]
    assert resolve_instance("3f2a", ids) == "3f2a9c1e0b7d"
    assert resolve_instance("aa", ["aa", "aab"]) == "aa"  # an exact id wins over prefixes
    assert resolve_instance("zz", ids) == "zz"  # the server answers unknown_instance


# --- the HTTP path, against a fake API -----------------------------------------------------

Handler = Callable[[httpx.Request], httpx.Response]


class FakeApi:
    """A fake node API: routes ``(method, path)`` to answers and records the requests."""

    def __init__(self, routes: dict[tuple[str, str], httpx.Response | Handler]) -> None:
        self.routes = routes
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.raw_path.decode().partition("?")[0]  # %2F stays escaped
        answer = self.routes.get((request.method, path))
        if answer is None:
            return envelope(404, "not_found", f"no route {request.method} {path}")
        return answer(request) if callable(answer) else answer

    def run(self, *argv: str, env: dict[str, str] | None = None) -> int:
        transport = httpx.MockTransport(self)
        return run_client_command(parse(*argv), transport=transport, env=env or {})

    def bodies(self) -> list[object]:
        return [json.loads(r.content) if r.content else None for r in self.requests]


def envelope(status: int, code: str, message: str) -> httpx.Response:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return httpx.Response(status, json={"error": error})


def refuse(request: httpx.Request) -> httpx.Response:
    raise httpx.ConnectError("[Errno 111] Connection refused", request=request)


def test_ps_prints_the_table_and_failures(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(
        {
            ("GET", "/v1/instances"): httpx.Response(
                200, json={"instances": [INSTANCE_A, INSTANCE_B]}
            )
        }
    )
    assert api.run("ps") == 0
    out = capsys.readouterr()
    assert out.out == (
        instances_table([INSTANCE_A, INSTANCE_B])
        + "\n\n3f9b00c1d2e3 rank 1 on node-bbbb: failed: out of memory loading layer 20\n"
    )
    assert out.err == ""
    assert str(api.requests[0].url) == "http://127.0.0.1:52415/v1/instances"


def test_ps_quiet_prints_ids(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(
        {
            ("GET", "/v1/instances"): httpx.Response(
                200, json={"instances": [INSTANCE_A, INSTANCE_B]}
            )
        }
    )
    assert api.run("ps", "-q") == 0
    assert capsys.readouterr().out == "3f2a9c1e0b7d\n3f9b00c1d2e3\n"


def test_ps_json_prints_the_servers_answer(capsys: pytest.CaptureFixture[str]) -> None:
    body = {"instances": [INSTANCE_A], "extra": {"kept": True}}
    api = FakeApi({("GET", "/v1/instances"): httpx.Response(200, json=body)})
    assert api.run("ps", "--json") == 0
    out = capsys.readouterr().out
    assert json.loads(out) == body
    assert out.startswith('{\n  "instances"')  # pretty


def test_api_comes_from_the_flag_then_the_environment(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({("GET", "/v1/cluster/nodes"): httpx.Response(200, json={"nodes": []})})
    assert api.run("nodes", env={"SKULK_API": "http://10.1.2.3:9000/"}) == 0
    assert api.run("nodes", "--api", "10.9.9.9:8080", env={"SKULK_API": "http://x:1"}) == 0
    assert [str(r.url) for r in api.requests] == [
        "http://10.1.2.3:9000/v1/cluster/nodes",
        "http://10.9.9.9:8080/v1/cluster/nodes",
    ]


def test_nodes_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({("GET", "/v1/cluster/nodes"): httpx.Response(200, json={"nodes": NODES})})
    assert api.run("nodes") == 0
    assert capsys.readouterr().out == nodes_table(NODES) + "\n"


def test_place_posts_the_body_and_prints_the_instance(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({("POST", "/v1/placements"): httpx.Response(201, json={"instance": INSTANCE_B})})
    assert (
        api.run(
            "place", "org/big-model", "--sharding", "pipeline", "--nodes", "node-aaaa,node-bbbb"
        )
        == 0
    )
    assert api.bodies() == [
        {"model": "org/big-model", "sharding": "pipeline", "nodes": ["node-aaaa", "node-bbbb"]}
    ]
    assert capsys.readouterr().out == (
        "placed 3f9b00c1d2e3: org/big-model (pipeline)\n" + shards_table(INSTANCE_B) + "\n"
    )


def test_place_answered_with_the_id_alone(capsys: pytest.CaptureFixture[str]) -> None:
    answer = httpx.Response(201, json={"instance": {"id": "77aa"}})
    api = FakeApi({("POST", "/v1/placements"): answer})
    assert api.run("place", "skulk-demo") == 0
    assert capsys.readouterr().out == "placed 77aa\n"


def test_place_dry_run_prints_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({("POST", "/v1/placements"): httpx.Response(200, json={"plan": PLAN})})
    assert api.run("place", "org/big-model", "--dry-run") == 0
    assert api.bodies() == [{"model": "org/big-model", "dry_run": True}]
    assert capsys.readouterr().out == (
        "dry run: org/big-model (pipeline) would go on 2 nodes; nothing was placed\n"
        + plan_table(PLAN)
        + "\n"
    )


def test_a_refusal_is_one_line_on_stderr_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    message = "node node-aaaa has 1.0 GiB free, the shard needs 3.0 GiB"
    api = FakeApi({("POST", "/v1/placements"): envelope(409, "not_enough_memory", message)})
    assert api.run("place", "org/big-model") == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err == f"skulk: not_enough_memory: {message}\n"


def test_a_refusal_with_json_prints_nothing_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({("GET", "/v1/instances"): envelope(503, "no_quorum", "no quorum")})
    assert api.run("ps", "--json") == 1
    out = capsys.readouterr()
    assert (out.out, out.err) == ("", "skulk: no_quorum: no quorum\n")


def test_an_error_that_is_not_the_envelope(capsys: pytest.CaptureFixture[str]) -> None:
    answer = httpx.Response(502, text="<html><body>Bad   gateway\n</body></html>")
    api = FakeApi({("GET", "/v1/instances"): answer})
    assert api.run("ps") == 1
    assert capsys.readouterr().err == "skulk: http_502: <html><body>Bad gateway </body></html>\n"


def test_an_answer_that_is_not_json(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({("GET", "/v1/instances"): httpx.Response(200, text="hello")})
    assert api.run("ps") == 1
    err = capsys.readouterr().err
    assert err.startswith("skulk: bad_response: http://127.0.0.1:52415/v1/instances: ")
    api = FakeApi({("GET", "/v1/cluster/nodes"): httpx.Response(200, json={"nodes": 3})})
    assert api.run("nodes") == 1
    assert "no 'nodes' list" in capsys.readouterr().err


def test_connection_refused_names_the_url_and_serve(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi({("GET", "/v1/instances"): refuse})
    assert api.run("ps", "--api", "http://127.0.0.1:9") == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.count("\n") == 1
    assert out.err.startswith(
        "skulk: cannot reach the Skulk API at http://127.0.0.1:9 (connection refused)"
    )
    assert "python -m skulk serve" in out.err


def test_a_read_timeout_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    api = FakeApi({("POST", "/v1/placements"): slow})
    assert api.run("place", "m", "--timeout", "4") == 2
    err = capsys.readouterr().err
    assert (
        err
        == "skulk: no answer from the Skulk API at http://127.0.0.1:52415 (read timeout after 4s)\n"
    )


def test_rm_by_unique_prefix(capsys: pytest.CaptureFixture[str]) -> None:
    listed = httpx.Response(200, json={"instances": [INSTANCE_A, INSTANCE_B]})
    api = FakeApi(
        {
            ("GET", "/v1/instances"): listed,
            ("DELETE", "/v1/instances/3f2a9c1e0b7d"): httpx.Response(
                200, json={"deleted": "3f2a9c1e0b7d"}
            ),
        }
    )
    assert api.run("rm", "3f2") == 0
    assert [(r.method, r.url.path) for r in api.requests] == [
        ("GET", "/v1/instances"),
        ("DELETE", "/v1/instances/3f2a9c1e0b7d"),
    ]
    assert capsys.readouterr().out == "deleted 3f2a9c1e0b7d\n"


def test_rm_json(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(
        {
            ("GET", "/v1/instances"): httpx.Response(200, json={"instances": [INSTANCE_A]}),
            ("DELETE", "/v1/instances/3f2a9c1e0b7d"): httpx.Response(
                200, json={"deleted": "3f2a9c1e0b7d"}
            ),
        }
    )
    assert api.run("rm", "3f2a9c1e0b7d", "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"deleted": "3f2a9c1e0b7d"}


def test_rm_ambiguous_prefix_lists_the_candidates(capsys: pytest.CaptureFixture[str]) -> None:
    listed = httpx.Response(200, json={"instances": [INSTANCE_B, INSTANCE_A]})
    api = FakeApi({("GET", "/v1/instances"): listed})
    assert api.run("rm", "3f") == 1
    assert [r.method for r in api.requests] == ["GET"]  # nothing deleted
    assert capsys.readouterr().err == (
        "skulk: ambiguous_instance: '3f' is the start of 2 instance ids: "
        "3f2a9c1e0b7d, 3f9b00c1d2e3\n"
    )


def test_rm_unknown_instance_is_the_servers_404(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(
        {
            ("GET", "/v1/instances"): httpx.Response(200, json={"instances": [INSTANCE_A]}),
            ("DELETE", "/v1/instances/zz%2F1"): envelope(
                404, "unknown_instance", "no instance 'zz/1'"
            ),
        }
    )
    assert api.run("rm", "zz/1") == 1
    assert capsys.readouterr().err == "skulk: unknown_instance: no instance 'zz/1'\n"


# --- python -m skulk -----------------------------------------------------------------------


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_main_runs_a_client_command_without_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    assert main(["ps", "--api", url, "--timeout", "5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"skulk: cannot reach the Skulk API at {url} (connection refused)")
    assert "Traceback" not in err


def test_client_commands_do_not_import_the_server() -> None:
    code = (
        "import sys\n"
        "from skulk.__main__ import main\n"
        f"main(['nodes', '--api', 'http://127.0.0.1:{closed_port()}'])\n"
        "heavy = ('skulk.config', 'skulk.serve', 'skulk.runner', 'skulk.api', 'mlx', 'quart')\n"
        "print(sorted(m for m in heavy if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "[]", result.stderr


def test_ctrl_c_while_waiting_is_exit_130_without_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def interrupted(request: httpx.Request) -> httpx.Response:
        raise KeyboardInterrupt

    api = FakeApi({("POST", "/v1/placements"): interrupted})
    assert api.run("place", "m") == 130
    assert capsys.readouterr().err == "skulk: interrupted\n"
