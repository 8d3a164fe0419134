"""The cluster routes in process (Quart-Trio test client) over a leader whose fake log commits
with the real ``apply()``: placement bodies are checked field by field, pipeline placements
answer their compute addresses, instances show each runner's phase, failure and fetch
progress, and the cluster timeline checks its query and never waits on a silent node."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from types import SimpleNamespace
from typing import Any

import attrs
import pytest
import trio

from skulk.api import create_app
from skulk.api._cluster_routes import instance_json, parse_placement
from skulk.api._openai import ApiError
from skulk.cluster import apply
from skulk.diagnostics import ClusterTimeline
from skulk.hub import Gated, HubUnreachable, RepoNotFound, UnsupportedArchitecture
from skulk.routing import Admission, Router
from skulk.wire.cluster import PlaceInstance, ReportRunner, Shard
from skulk.wire.diagnostics import TimelineEvent
from skulk.wire.telemetry import FetchProgress, NodeReadings

from .test_control_placement import GEMMA, GIB, LLAMA, FakeDriver, cluster, make, readings


class Silent:
    async def call(self, method: str, body: bytes, timeout: float) -> bytes:  # noqa: ASYNC109
        await trio.sleep_forever()
        raise AssertionError("unreachable")


class FakeGossip:
    """The telemetry view the app reads: always ``seen`` as it is now."""

    def __init__(self, seen: Mapping[str, NodeReadings]) -> None:
        self.seen = seen

    @property
    def store(self) -> Any:
        return SimpleNamespace(view={n: SimpleNamespace(readings=r) for n, r in self.seen.items()})


def app_for(driver: FakeDriver, control: Any, seen: Mapping[str, NodeReadings]) -> Any:
    router = Router(
        "a",
        lambda: driver.state,
        lambda i: None,
        lambda peer: False,
        None,  # type: ignore[arg-type]
        Admission(),
    )
    gossip = FakeGossip(seen)
    events = [TimelineEvent(2.0, "a", "m", "i1", 0, 1, "phase", "ready"),
              TimelineEvent(1.0, "a", "m", "i1", 0, 1, "phase", "spawning")]  # fmt: skip
    timeline = ClusterTimeline("a", lambda: events, lambda: ["a", "b"],
                               {"b": Silent()}.get, timeout=0.2)  # fmt: skip
    local = SimpleNamespace(services={})
    return create_app(router, local, control=control, gossip=gossip, timeline=timeline)  # type: ignore[arg-type]


@pytest.fixture
async def setup() -> AsyncIterator[tuple[Any, FakeDriver, dict[str, NodeReadings]]]:
    seen = {n: readings(n, 2 * GIB) for n in "abc"}
    control, driver = make(cluster(LLAMA, GEMMA), seen)
    async with app_for(driver, control, seen).test_app() as test_app:
        yield test_app.test_client(), driver, seen


async def post(client: Any, body: object) -> Any:
    response = await client.post(
        "/v1/placements", data=json.dumps(body), headers={"content-type": "application/json"}
    )
    return response.status_code, await response.get_json()


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m", "sharding": "ring"}, "sharding"),
        ({"model": "m", "sharding": 3}, "sharding"),
        ({"model": "m", "min_nodes": 2}, "min_nodes"),
        ({"model": "m", "max_nodes": 3}, "max_nodes"),
        ({"model": "m", "sharding": "pipeline", "min_nodes": 0}, "min_nodes"),
        ({"model": "m", "sharding": "pipeline", "min_nodes": 1}, "min_nodes"),
        ({"model": "m", "sharding": "tensor", "nodes": ["a"]}, "min_nodes"),
        ({"model": "m", "sharding": "pipeline", "min_nodes": True}, "min_nodes"),
        ({"model": "m", "sharding": "tensor", "min_nodes": 3, "max_nodes": 2}, "max_nodes"),
        ({"model": "m", "sharding": "pipeline", "nodes": ["a", "a"]}, "nodes"),
        ({"model": "m", "sharding": "pipeline", "nodes": "a"}, "nodes"),
        ({"model": "m", "sharding": "pipeline", "nodes": ["a"], "min_nodes": 2}, "min_nodes"),
        ({"model": "m", "nodes": ["a"], "excluded_nodes": ["a"]}, "excluded_nodes"),
        ({"model": "m", "sharding": "pipeline", "ranks": 2}, "ranks"),
    ],
)
def test_bad_placement_bodies_name_the_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(ApiError) as error:
        parse_placement(body)
    assert error.value.status == 400 and error.value.param == param


async def test_a_pipeline_placement_answers_its_compute_addresses(setup: Any) -> None:
    client, _, _ = setup
    status, dry = await post(client, {"model": "m", "sharding": "pipeline", "dry_run": True})
    assert status == 200, dry
    shards = dry["plan"]["shards"]
    assert len(shards) == 2 and all(s["address"].endswith(":7000") for s in shards)
    status, placed = await post(client, {"model": "m", "sharding": "pipeline"})
    assert status == 201, placed
    got = placed["instance"]["shards"]
    assert [s["address"] for s in got] == [s["address"] for s in shards]
    assert [s["layers"] for s in got] == [[0, 2], [2, 4]]
    used = got[0]["node"]  # 1 GiB left there: not enough for g (1.2 GiB + the floor)
    status, single = await post(client, {"model": "g", "nodes": [used], "dry_run": True})
    assert status == 409 and single["error"]["code"] == "not_enough_memory"
    assert "need" in single["error"]["message"] and "have" in single["error"]["message"]


async def test_tensor_refusals_carry_the_arithmetic(setup: Any) -> None:
    client, _, _ = setup
    status, body = await post(client, {"model": "g", "sharding": "tensor", "min_nodes": 2})
    assert status == 400 and body["error"]["code"] == "unsupported_sharding"
    assert "gemma" in body["error"]["message"]
    status, body = await post(
        client, {"model": "m", "sharding": "tensor", "min_nodes": 3, "max_nodes": 3}
    )
    assert status == 400 and body["error"]["code"] == "unsupported_sharding"
    assert "4 heads and 2 kv heads do not divide over 3 ranks" in body["error"]["message"]


def test_instances_show_phase_failure_address_and_fetch_progress() -> None:
    state = cluster(LLAMA)
    shards = (Shard(0, "a", 0, 2, "h:1"), Shard(1, "b", 2, 4, "h:2"))
    state, _ = apply(state, PlaceInstance("p", "m", "pipeline", shards, 0))
    state, _ = apply(state, ReportRunner("p", 0, "a", "fetching", None, 1))
    state, _ = apply(state, ReportRunner("p", 1, "b", "failed", "group_not_joined", 2))
    fetches = (FetchProgress("p", 0, 300, 1000), FetchProgress("other", 0, 1, 2))
    seen = {"a": attrs.evolve(readings("a", GIB), fetches=fetches), "b": readings("b", GIB)}
    body = instance_json(state, state.instances[0], seen)
    runners = [(s["address"], s["runner"]) for s in body["shards"]]  # type: ignore[attr-defined]
    assert runners == [
        ("h:1", {"phase": "fetching", "failure": None, "bytes_done": 300, "bytes_total": 1000}),
        ("h:2", {"phase": "failed", "failure": "group_not_joined", "bytes_done": None,
                 "bytes_total": None}),
    ]  # fmt: skip
    assert instance_json(state, state.instances[0])["shards"][0]["runner"]["bytes_done"] is None  # type: ignore[index]


async def test_instances_route_reads_fetch_progress_from_telemetry(setup: Any) -> None:
    client, driver, seen = setup
    status, placed = await post(client, {"model": "m", "sharding": "pipeline"})
    assert status == 201
    instance = placed["instance"]["id"]
    node = placed["instance"]["shards"][0]["node"]
    driver.state, _ = apply(driver.state, ReportRunner(instance, 0, node, "fetching", None, 5))
    seen[node] = attrs.evolve(seen[node], fetches=(FetchProgress(instance, 0, 5, 10),))
    response = await client.get("/v1/instances")
    shards = (await response.get_json())["instances"][0]["shards"]
    assert shards[0]["runner"] == {
        "phase": "fetching", "failure": None, "bytes_done": 5, "bytes_total": 10
    }  # fmt: skip
    assert shards[1]["runner"]["bytes_done"] is None  # pending: no progress shown


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("limit=0", "limit"),
        ("limit=abc", "limit"),
        ("limit=2001", "limit"),
        ("limit=-1", "limit"),
        ("limit=1&limit=2", "limit"),
        ("since=-1", "since"),
        ("since=nan", "since"),
        ("since=inf", "since"),
        ("since=yesterday", "since"),
        ("until=5", "until"),
    ],
)
async def test_timeline_query_errors_name_the_parameter(setup: Any, query: str, param: str) -> None:
    client, _, _ = setup
    response = await client.get(f"/v1/diagnostics/cluster/timeline?{query}")
    assert response.status_code == 400
    assert (await response.get_json())["error"]["param"] == param


async def test_timeline_lists_a_silent_node_and_answers_anyway(setup: Any) -> None:
    client, _, _ = setup
    with trio.fail_after(5):  # the silent node costs its 0.2 s deadline, no more
        response = await client.get("/v1/diagnostics/cluster/timeline?limit=5&since=0.5")
    assert response.status_code == 200
    body = await response.get_json()
    assert [(e["node"], e["detail"]) for e in body["events"]] == [
        ("a", "spawning"), ("a", "ready")
    ]  # fmt: skip
    assert set(body["events"][0]) >= {"at", "node", "model", "instance", "rank", "incarnation"}
    assert body["answered"] == ["a"]
    assert body["unanswered"] == [{"node": "b", "reason": "timeout"}]
    limited = await (await client.get("/v1/diagnostics/cluster/timeline?limit=1")).get_json()
    assert [e["detail"] for e in limited["events"]] == ["ready"] and limited["dropped"] == 1


class PullFailed(Exception):
    """As skulk.control.PullFailed: a pull that could not finish, with a typed reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@pytest.mark.parametrize(
    ("error", "status", "code"),
    [
        (RepoNotFound("org/m"), 404, "repo_not_found"),
        (Gated("org/m", 401, had_token=False), 401, "gated"),
        (UnsupportedArchitecture("org/m", "bert"), 422, "unsupported_architecture"),
        (HubUnreachable("org/m", "http://hub", 3, "refused"), 502, "hub_unreachable"),
        (PullFailed("disk_full", "no node has room for 3 GiB"), 507, "disk_full"),
    ],
)
async def test_placing_a_hub_id_whose_pull_fails_is_its_typed_status(
    error: Exception, status: int, code: str
) -> None:
    """``POST /v1/placements`` of a Hub id pulls it first (``register_model``); a failed pull
    is the pull's typed error naming the model, never a 500, and nothing is placed."""
    seen = {n: readings(n, 2 * GIB) for n in "abc"}
    control, driver = make(cluster(LLAMA, GEMMA), seen)
    asked: list[str] = []

    async def register_model(name: str) -> str:
        asked.append(name)
        raise error

    control.register_model = register_model  # type: ignore[method-assign]
    before = driver.state
    async with app_for(driver, control, seen).test_app() as test_app:
        got, body = await post(test_app.test_client(), {"model": "org/m"})
    assert (got, body["error"]["code"]) == (status, code)
    if status < 500:
        assert body["error"]["param"] == "model"
    assert body["error"]["message"] == str(error)
    assert asked == ["org/m"] and driver.state == before
