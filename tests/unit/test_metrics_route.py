"""``GET /metrics`` of an app in process (the API edge's fake service behind a real Router):
the counts match the requests sent, errors count by reason (429s too), client-chosen model
names never become label values, the key is needed when keys are set, and the scrape-time
families read what the node's parts report."""

from __future__ import annotations

from typing import Any

import attrs
import pytest
from prometheus_client.parser import text_string_to_metric_families

from skulk.api._metric_sources import (
    consensus_families,
    link_families,
    raft_transport_families,
    service_families,
    state_families,
)
from skulk.api._state_cost import StateCostSource
from skulk.cluster import ClusterMachine, apply, canonical_bytes
from skulk.control._control import placement_cause
from skulk.federation import LinkView, PeerState
from skulk.routing import Admission, NodeUnreachable, Overloaded, RemoteUnavailable
from skulk.routing._router import failure_reason
from skulk.wire.cluster import NodeStatusChanged, PlaceInstance, ReportRunner, Shard
from skulk.wire.runner import EngineStats, GenerationEnd, Usage
from skulk.worker import ModelStatus, ModelUnavailable, RequestFailure, ServiceStatistics
from tests.unit.test_api_edge import MODEL, USER, FakeNode, FakeService, app_for, call

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


async def scrape(client: Any, headers: dict[str, str] | None = None) -> Samples:
    response = await call(client, "GET", "/metrics", headers=headers or {})
    assert response.status_code == 200
    assert response.mimetype == "text/plain"
    return parse((await response.get_data()).decode())


def at(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


LOCAL = {"model": MODEL, "instance": "i1", "route": "local"}


async def test_counts_match_the_requests_sent_and_errors_count_by_reason() -> None:
    done = GenerationEnd("length", Usage(prompt_tokens=7, completion_tokens=3))
    fake = FakeService(("Hel", "lo", done))
    fake.by_text["crash"] = [RequestFailure("prompt_too_long", "too long"), done]
    admission = Admission(max_in_flight=1)
    async with app_for(fake, admission).test_app() as test_app:
        client = test_app.test_client()
        for stream in (False, True, False):
            body = {"model": MODEL, "messages": USER, "stream": stream}
            response = await call(client, "POST", "/v1/chat/completions", body)
            assert response.status_code == 200
            await response.get_data()
        crash = [{"role": "user", "content": "crash"}]
        response = await call(client, "POST", "/v1/chat/completions",
                              {"model": MODEL, "messages": crash})  # fmt: skip
        assert response.status_code == 400
        with admission.admit("i1"):  # the only place is taken: 429
            response = await call(client, "POST", "/v1/chat/completions",
                                  {"model": MODEL, "messages": USER})  # fmt: skip
            assert response.status_code == 429
        for model in ("no/such-model-1", "no/such-model-2"):
            response = await call(client, "POST", "/v1/chat/completions",
                                  {"model": model, "messages": USER})  # fmt: skip
            assert response.status_code == 404
        got = await scrape(client)
    assert at(got, "skulk:prompt_tokens_total", **LOCAL) == 21
    assert at(got, "skulk:generation_tokens_total", **LOCAL) == 9
    assert at(got, "skulk:request_success_total", **LOCAL, finish_reason="length") == 3
    assert at(got, "skulk:request_errors_total", **LOCAL, reason="prompt_too_long") == 1
    assert at(got, "skulk:request_errors_total", **LOCAL, reason="overloaded") == 1
    unknown = {"model": "", "instance": "", "route": "none", "reason": "model_not_found"}
    assert at(got, "skulk:request_errors_total", **unknown) == 2
    assert not any("no/such" in str(labels) for _, labels in got)
    per_instance = {"model": MODEL, "instance": "i1"}
    assert at(got, "skulk:time_to_first_token_seconds_count", **per_instance) == 3
    assert at(got, "skulk:e2e_request_latency_seconds_count", **per_instance) == 3
    assert at(got, "skulk:inter_token_latency_seconds_count", **per_instance) == 6


async def test_metrics_needs_the_key_when_keys_are_set() -> None:
    key = "sk-metrics-test-0123456789abcdef"
    async with app_for(FakeService(), api_keys=(key,)).test_app() as test_app:
        client = test_app.test_client()
        assert (await call(client, "GET", "/metrics")).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert (await call(client, "GET", "/metrics", headers=wrong)).status_code == 401
        got = await scrape(client, {"Authorization": f"Bearer {key}"})
        assert ("python_info", frozenset()) not in got  # python_info has labels
        assert any(name == "python_info" for name, _ in got)


async def test_a_node_part_without_statistics_costs_only_its_own_families() -> None:
    """The edge's fake service has no ``statistics()``: its source fails, logged, and the
    scrape still answers with everything else."""
    async with app_for(FakeService()).test_app() as test_app:
        got = await scrape(test_app.test_client())
    assert any(name == "process_cpu_seconds_total" for name, _ in got)
    assert not any(name.startswith("skulk:num_requests") for name, _ in got)


# ---- the scrape-time families ----------------------------------------------------------------


@attrs.define
class FakeRunnerStats:
    rss_bytes: int | None = 1000


class FakeRunner:
    phase = "ready"

    def __init__(self, engine: EngineStats | None) -> None:
        self.engine = engine

    def statistics(self) -> FakeRunnerStats:
        return FakeRunnerStats()

    def engine_statistics(self) -> EngineStats | None:
        return self.engine


class ServingFake(FakeService):
    def __init__(self, engine: EngineStats | None) -> None:
        super().__init__()
        self.runner = FakeRunner(engine)

    def statistics(self) -> ServiceStatistics:
        return ServiceStatistics(3, {"runner_crashed": 2}, 120, 40)

    def recent_runners(self) -> tuple[FakeRunner]:  # type: ignore[override]
        return (self.runner,)


def family_samples(families: Any) -> Samples:
    return {(s.name, frozenset(s.labels.items())): s.value for f in families for s in f.samples}


def test_service_families_read_engine_stats_and_service_counters() -> None:
    engine = EngineStats(
        speculation_verify_steps=4, speculation_plain_steps=9, speculation_drafted=12,
        speculation_accepted=5, prefix_hits=2, prefix_reused_tokens=40, prefix_bytes=4096,
        prefix_entries=1, kv_capacity_bytes=1000, kv_reserved_bytes=250, running=2, queued=1,
    )  # fmt: skip
    node = FakeNode(ServingFake(engine))
    got = family_samples(service_families(node))  # type: ignore[arg-type]
    mi = {"model": MODEL, "instance": "i1"}
    assert at(got, "skulk:num_requests_running", **mi) == 2
    assert at(got, "skulk:num_requests_waiting", **mi) == 1
    assert at(got, "skulk:kv_cache_usage_perc", **mi) == 0.25
    assert at(got, "skulk:prefix_cache_queries_total", **mi) == 120
    assert at(got, "skulk:prefix_cache_hits_total", **mi) == 40
    assert at(got, "skulk:spec_decode_num_draft_tokens_total", **mi) == 12
    assert at(got, "skulk:spec_decode_num_accepted_tokens_total", **mi) == 5
    assert at(got, "skulk:spec_decode_num_drafts_total", **mi) == 4
    assert at(got, "skulk:runner_starts_total", **mi) == 3
    assert at(got, "skulk:runner_exits_total", **mi, reason="runner_crashed") == 2
    assert at(got, "skulk:instance_state", **mi, state="ready") == 1
    assert at(got, "skulk:runner_rss_bytes", **mi) == 1000


def test_service_families_without_engine_stats_leave_the_engine_out() -> None:
    node = FakeNode(ServingFake(None))
    got = family_samples(service_families(node))  # type: ignore[arg-type]
    assert not any(name == "skulk:kv_cache_usage_perc" for name, _ in got)
    assert at(got, "skulk:runner_starts_total", model=MODEL, instance="i1") == 3


@attrs.frozen
class FakeDriverStats:
    healthy: bool = True
    role: str | None = "leader"
    term: int = 4
    commit: int = 17
    applied: int = 16
    last_index: int = 18
    leader_changes: int = 2
    proposals: int = 9
    disk_failures: int = 0
    entries_applied: int = 30
    apply_seconds: float = 0.25
    snapshots: int = 1
    snapshot_seconds: float = 0.5


def test_consensus_families() -> None:
    got = family_samples(consensus_families(FakeDriverStats))
    assert at(got, "skulk:raft_term") == 4
    assert at(got, "skulk:raft_role", role="leader") == 1
    assert at(got, "skulk:raft_role", role="follower") == 0
    assert at(got, "skulk:raft_commit_index") == 17
    assert at(got, "skulk:raft_applied_index") == 16
    assert at(got, "skulk:raft_leader_changes_total") == 2
    assert at(got, "skulk:raft_entries_applied_total") == 30
    assert at(got, "skulk:raft_apply_seconds_total") == 0.25
    assert at(got, "skulk:raft_snapshots_total") == 1
    assert at(got, "skulk:raft_snapshot_seconds_total") == 0.5


@attrs.frozen
class FakeTransportStats:
    bytes_sent: dict[str, int] = attrs.field(factory=lambda: {"append": 900, "heartbeat": 40})


def test_raft_transport_families_count_bytes_by_message_kind() -> None:
    got = family_samples(raft_transport_families(FakeTransportStats))
    assert at(got, "skulk:raft_sent_bytes_total", message="append") == 900
    assert at(got, "skulk:raft_sent_bytes_total", message="heartbeat") == 40


class FakeControl:
    """What :class:`StateCostSource` reads of a :class:`ClusterControl`."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.applied = 5


def test_state_cost_measures_the_state_once_per_applied_index() -> None:
    control = FakeControl(FakeNode(FakeService()).state)
    source = StateCostSource(control)  # type: ignore[arg-type]
    got = family_samples(source())
    assert at(got, "skulk:cluster_state_bytes") == len(canonical_bytes(control.state))
    image = ClusterMachine().snapshot(control.state)
    assert at(got, "skulk:cluster_snapshot_bytes") == len(image)
    assert (seconds := at(got, "skulk:cluster_snapshot_seconds")) is not None and seconds >= 0
    first = source.measure()
    assert source.measure() is first  # nothing applied since: not measured again
    bigger, _ = apply(control.state, ReportRunner("i1", 0, "n1", "failed", "runner_crashed", 2))
    control.state, control.applied = bigger, 6
    assert source.measure() is not first and source.measure().applied == 6


def test_link_families_name_the_peer_or_its_address() -> None:
    views = (
        LinkView("n2", "ws://b:1", PeerState.UP, 1.5, 100, 200, 1, 2, None, True),
        LinkView(None, "ws://c:1", PeerState.CONNECTING, None, 0, 0, 0, 0, "refused", None),
    )
    got = family_samples(link_families(lambda: views))
    assert at(got, "skulk:link_state", peer="n2", state="up") == 1
    assert at(got, "skulk:link_state", peer="n2", state="down") == 0
    assert at(got, "skulk:link_state", peer="ws://c:1", state="connecting") == 1
    assert at(got, "skulk:link_rtt_seconds", peer="n2") == 0.0015
    assert at(got, "skulk:link_rtt_seconds", peer="ws://c:1") is None
    assert at(got, "skulk:link_received_bytes_total", peer="n2") == 100
    assert at(got, "skulk:link_sent_bytes_total", peer="n2") == 200


def test_state_families_count_nodes_instances_and_runners() -> None:
    state = FakeNode(FakeService()).state
    got = family_samples(state_families(state))
    assert at(got, "skulk:cluster_nodes", status="up") == 1
    assert at(got, "skulk:cluster_instances", model=MODEL, sharding="single",
              status=state.instances[0].status) == 1  # fmt: skip


def test_placement_cause_names_why_an_instance_was_placed() -> None:
    state = FakeNode(FakeService()).state
    move = PlaceInstance("i2", MODEL, "single", (Shard(0, "n1", 0, 2),), 1, replaces="i1")
    assert placement_cause(state, attrs.evolve(move, replaces=None)) == ("placement", "new")
    assert placement_cause(state, move) == ("replacement", "other")
    assert placement_cause(state, attrs.evolve(move, replaces="gone")) == ("replacement", "other")
    failed, _ = apply(state, ReportRunner("i1", 0, "n1", "failed", "runner_crashed", 2))
    assert placement_cause(failed, move) == ("replacement", "runner_crashed")
    down, _ = apply(failed, NodeStatusChanged("n1", "down", 3))
    assert placement_cause(down, move) == ("replacement", "node_down")


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (RequestFailure("runner_crashed", "x"), "runner_crashed"),
        (NodeUnreachable("n2", "lost"), "node_unreachable"),
        (Overloaded("i1"), "overloaded"),
        (RemoteUnavailable("n2", "i1", "loading"), "not_ready"),
        (ModelUnavailable(ModelStatus(MODEL, "loading")), "not_ready"),
        (GeneratorExit(), "abandoned"),
        (KeyboardInterrupt(), "cancelled"),
        (ValueError("a bug"), "internal"),
    ],
)
def test_failure_reasons_are_typed(exc: BaseException, reason: str) -> None:
    assert failure_reason(exc) == reason
