"""``place --wait``: runner phases → the bar's fraction, ready, failure or time-out (pure, with
a fake clock), the reporters (bar on a terminal, lines elsewhere), and the command against a
fake API."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import httpx
import pytest

from skulk.cli import run_client_command
from skulk.cli._wait import (
    Follower,
    PlacementFailed,
    WaitTimedOut,
    WaitView,
    follow,
    instance_view,
    rank_fraction,
)
from skulk.cli._wait_report import wait_reporter
from tests.unit.test_cli_client import FakeApi, envelope, parse

ID = "3f2a9c1e0b7d"


def shard(rank: int, phase: str, **runner: object) -> dict[str, object]:
    return {
        "rank": rank,
        "node": f"node-{rank}",
        "layers": [rank * 2, rank * 2 + 2],
        "runner": {"phase": phase, "failure": None, **runner},
    }


def instance(*shards: dict[str, object], status: str = "placed") -> dict[str, object]:
    return {
        "id": ID,
        "model": "skulk-demo",
        "sharding": "pipeline" if len(shards) > 1 else "single",
        "status": status,
        "shards": list(shards),
    }


@pytest.mark.parametrize(
    ("runner", "fraction"),
    [
        ({"phase": "pending"}, 0.0),
        ({"phase": "fetching"}, 0.05),
        ({"phase": "fetching", "bytes_done": 50, "bytes_total": 100}, 0.35),
        ({"phase": "fetching", "bytes_done": 500, "bytes_total": 100}, 0.65),
        ({"phase": "fetching", "bytes_done": 5, "bytes_total": 0}, 0.05),
        ({"phase": "connecting"}, 0.70),
        ({"phase": "loading"}, 0.80),
        ({"phase": "ready"}, 1.0),
        ({"phase": "something new"}, 0.0),
        ({}, 0.0),
    ],
)
def test_rank_fraction_by_phase(runner: dict[str, object], fraction: float) -> None:
    assert rank_fraction({"runner": runner}) == pytest.approx(fraction)
    assert rank_fraction({"runner": "nope"}) == 0.0


def test_an_instance_is_ready_when_every_rank_is() -> None:
    view = instance_view(instance(shard(0, "ready"), shard(1, "ready")))
    assert view == WaitView(True, None, 1.0, "rank 0 ready, rank 1 ready")
    halfway = instance_view(instance(shard(0, "ready"), shard(1, "pending")))
    assert not halfway.ready and halfway.failure is None
    assert halfway.fraction == pytest.approx(0.5)
    assert halfway.summary == "rank 0 ready, rank 1 pending"
    fetching = instance_view(instance(shard(0, "fetching", bytes_done=1, bytes_total=4)))
    assert fetching.summary == "rank 0 fetching 25%"
    assert fetching.fraction == pytest.approx(0.2)


def test_a_failed_rank_or_instance_is_a_failure_with_its_reason() -> None:
    crashed = instance(shard(0, "ready"), shard(1, "failed", failure="out of memory"))
    assert instance_view(crashed).failure == "rank 1 on node-1 failed: out of memory"
    stopped = instance(shard(0, "stopped"))
    assert instance_view(stopped).failure == "rank 0 on node-0 stopped"
    given_up = instance(shard(0, "pending"), status="failed")
    assert instance_view(given_up).failure == "the instance failed (no nodes left to place it on)"
    # A ready runner of a failed instance is not ready.
    assert not instance_view(instance(shard(0, "ready"), status="failed")).ready


def test_no_shards_yet_is_on_its_way() -> None:
    view = instance_view({"id": ID, "status": "placed"})
    assert (view.ready, view.failure, view.fraction) == (False, None, 0.0)


def test_an_instance_not_seen_yet_is_waited_for_but_one_gone_has_failed() -> None:
    follower = Follower(ID)
    assert follower.observe(None) == WaitView(False, None, 0.0, "not yet in this node's State")
    assert not follower.observe(instance(shard(0, "loading"))).ready
    gone = follower.observe(None)
    assert gone.failure is not None and "gone" in gone.failure


class Clock:
    """A fake clock that each sleep moves on."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def polls(*answers: dict[str, object] | None) -> Iterator[dict[str, object] | None]:
    yield from answers
    while True:  # then the last one, for ever
        yield answers[-1]


def test_follow_reports_every_view_until_ready() -> None:
    answers = polls(
        None,
        instance(shard(0, "pending")),
        instance(shard(0, "fetching", bytes_done=1, bytes_total=2)),
        instance(shard(0, "loading")),
        instance(shard(0, "ready")),
    )
    seen: list[WaitView] = []
    clock = Clock()
    last = follow(
        lambda: next(answers), ID, timeout=60, report=seen.append, clock=clock, sleep=clock.sleep
    )
    assert last.ready
    assert [v.summary for v in seen] == [
        "not yet in this node's State",
        "rank 0 pending",
        "rank 0 fetching 50%",
        "rank 0 loading",
        "rank 0 ready",
    ]
    fractions = [v.fraction for v in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert clock.slept == [0.5] * 4


def test_follow_raises_the_failure() -> None:
    answers = polls(instance(shard(0, "loading")), instance(shard(0, "failed", failure="boom")))
    clock = Clock()
    with pytest.raises(PlacementFailed) as failed:
        follow(lambda: next(answers), ID, timeout=60, report=lambda v: None, clock=clock,
               sleep=clock.sleep)  # fmt: skip
    assert failed.value.exit_status == 1
    assert failed.value.describe() == f"placement_failed: {ID}: rank 0 on node-0 failed: boom"


def test_follow_times_out_with_where_it_was() -> None:
    answers = polls(instance(shard(0, "loading")))
    clock = Clock()
    with pytest.raises(WaitTimedOut) as late:
        follow(lambda: next(answers), ID, timeout=2, report=lambda v: None, clock=clock,
               sleep=clock.sleep)  # fmt: skip
    assert late.value.exit_status == 3
    assert clock.now == 102.0 and clock.slept == [0.5] * 4  # never sleeps past the deadline
    assert late.value.describe().startswith(
        f"wait_timeout: {ID} not ready within 2s (last seen: rank 0 loading)"
    )


def test_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    with wait_reporter(out, ID) as report:
        for phase in ("pending", "pending", "loading", "ready"):
            report(instance_view(instance(shard(0, phase))))
    assert out.getvalue().splitlines() == [
        f"{ID}: rank 0 pending",
        f"{ID}: rank 0 loading",
        f"{ID}: rank 0 ready",
    ]


def test_a_bar_on_a_terminal() -> None:
    out = io.StringIO()
    with wait_reporter(out, ID, terminal=True) as report:
        report(instance_view(instance(shard(0, "loading"))))
        report(instance_view(instance(shard(0, "ready"))))
    drawn = out.getvalue()
    assert "\x1b[" in drawn  # drawn with escape codes
    assert "100%" in drawn and "rank 0 ready" in drawn and ID in drawn


class Sequence:
    """``GET /v1/instances/ID`` answers, one per poll (the last one repeated)."""

    def __init__(self, *answers: httpx.Response) -> None:
        self.answers = list(answers)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


def placed(body: dict[str, object]) -> httpx.Response:
    return httpx.Response(201, json={"instance": body})


def wait_for(api: FakeApi, *argv: str, clock: Clock | None = None) -> int:
    clock = clock or Clock()
    return run_client_command(
        parse("place", "skulk-demo", "--wait", *argv),
        transport=httpx.MockTransport(api),
        env={},
        clock=clock,
        sleep=clock.sleep,
    )


def test_place_wait_prints_ready_and_the_shards(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(
        {
            ("POST", "/v1/placements"): placed({"id": ID}),  # not yet applied where asked
            ("GET", f"/v1/instances/{ID}"): Sequence(
                envelope(404, "unknown_instance", "no instance"),
                httpx.Response(200, json=instance(shard(0, "fetching"))),
                httpx.Response(200, json=instance(shard(0, "ready"))),
            ),
        }
    )
    assert wait_for(api) == 0
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    assert out[0] == f"ready {ID}: skulk-demo (single)"
    assert out[2].split() == ["0", "node-0", "0:2", "-", "ready"]
    assert captured.err.splitlines() == [
        f"placed {ID}; waiting for it to be ready",
        f"{ID}: not yet in this node's State",
        f"{ID}: rank 0 fetching",
        f"{ID}: rank 0 ready",
    ]
    assert [r.url.path for r in api.requests].count(f"/v1/instances/{ID}") == 3


def test_place_wait_json_prints_the_ready_instance(capsys: pytest.CaptureFixture[str]) -> None:
    ready = instance(shard(0, "ready"))
    api = FakeApi(
        {
            ("POST", "/v1/placements"): placed(instance(shard(0, "pending"))),
            ("GET", f"/v1/instances/{ID}"): httpx.Response(200, json=ready),
        }
    )
    assert wait_for(api, "--json") == 0
    assert json.loads(capsys.readouterr().out) == {"instance": ready}


def test_place_wait_exits_1_with_the_failure(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(
        {
            ("POST", "/v1/placements"): placed({"id": ID}),
            ("GET", f"/v1/instances/{ID}"): httpx.Response(
                200, json=instance(shard(0, "failed", failure="load_timeout"))
            ),
        }
    )
    assert wait_for(api) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.splitlines()[-1] == (
        f"skulk: placement_failed: {ID}: rank 0 on node-0 failed: load_timeout"
    )


def test_place_wait_exits_1_when_the_instance_goes(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(
        {
            ("POST", "/v1/placements"): placed({"id": ID}),
            ("GET", f"/v1/instances/{ID}"): Sequence(
                httpx.Response(200, json=instance(shard(0, "loading"))),
                envelope(404, "unknown_instance", "no instance"),
            ),
        }
    )
    assert wait_for(api) == 1
    assert "re-placed under a new id" in capsys.readouterr().err


def test_place_wait_times_out_with_exit_3(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(
        {
            ("POST", "/v1/placements"): placed({"id": ID}),
            ("GET", f"/v1/instances/{ID}"): httpx.Response(200, json=instance(shard(0, "loading"))),
        }
    )
    clock = Clock()
    assert wait_for(api, "--timeout", "5", clock=clock) == 3
    assert clock.now == 105.0
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"skulk: wait_timeout: {ID} not ready within 5s (last seen: rank 0 loading); "
        "it may still get there: see `skulk ps`"
    )


def test_place_wait_other_errors_are_the_servers(capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(
        {
            ("POST", "/v1/placements"): placed({"id": ID}),
            ("GET", f"/v1/instances/{ID}"): envelope(401, "invalid_api_key", "no key"),
        }
    )
    assert wait_for(api) == 1
    assert capsys.readouterr().err.splitlines()[-1].startswith("skulk: invalid_api_key: no key")
    refused = FakeApi({("POST", "/v1/placements"): envelope(409, "no_capacity", "full")})
    assert wait_for(refused) == 1
    assert capsys.readouterr().err == "skulk: no_capacity: full\n"


def test_place_wait_dry_run_waits_for_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    plan = {"model": "skulk-demo", "sharding": "single", "shards": [shard(0, "pending")]}
    api = FakeApi({("POST", "/v1/placements"): httpx.Response(200, json={"plan": plan})})
    assert wait_for(api, "--dry-run") == 0
    assert capsys.readouterr().out.startswith("dry run: skulk-demo (single) would go on 1 node")
    assert len(api.requests) == 1


def test_request_deadlines_under_wait() -> None:
    from skulk.cli._commands import request_timeout, wait_timeout

    assert (request_timeout(parse("place", "m")), wait_timeout(parse("place", "m"))) == (30, 600)
    waiting = parse("place", "m", "--wait", "--timeout", "5")
    assert (request_timeout(waiting), wait_timeout(waiting)) == (5, 5)
    long = parse("place", "m", "--wait", "--timeout", "900")
    assert (request_timeout(long), wait_timeout(long)) == (30, 900)
    assert request_timeout(parse("ps", "--timeout", "2")) == 2
