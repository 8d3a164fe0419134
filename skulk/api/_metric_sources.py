"""The metric families read from a node's parts when Prometheus scrapes (no cost between
scrapes): each function turns one part's ``statistics()`` (or view) into families.

Names are vLLM's with the ``skulk:`` prefix where the meaning is the same
(``num_requests_running``, ``kv_cache_usage_perc``, ``prefix_cache_*``, ``spec_decode_*``),
else ``skulk:`` names of our own. docs/operations.md ("Monitoring") lists them all.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Protocol

import trio
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from skulk.api._node_routes import LocalServices
from skulk.cluster import State
from skulk.consensus import Role
from skulk.control import ClusterControl
from skulk.federation import LinkView, PeerState
from skulk.routing import Admission, RemoteRouting
from skulk.telemetry import TelemetryGossip
from skulk.transfer import WeightClient, WeightServer

Rows = Sequence[tuple[Sequence[str], float]]


def gauge(name: str, doc: str, labels: Sequence[str], rows: Rows) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


def counter(name: str, doc: str, labels: Sequence[str], rows: Rows) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric(list(values), value)
    return family


def service_families(local: LocalServices) -> Iterator[Metric]:
    """Per instance this node runs (labels ``model``, ``instance``): the engine's
    :class:`~skulk.wire.runner.EngineStats` (rank 0's, from its last heartbeat), the prefix
    cache's queries and hits (prompt tokens of the finished requests, and those the cache
    supplied), runner starts and exits by reason, and the service's state."""
    running, waiting, kv_perc, kv_capacity, drafts, drafted, accepted = ([] for _ in range(7))
    queries, hits, entries, cached_bytes, starts, exits, states, rss = ([] for _ in range(8))
    for instance, service in sorted(local.services.items()):
        key = (service.model_id, instance)
        stats = service.statistics()
        queries.append((key, float(stats.prompt_tokens)))
        hits.append((key, float(stats.cached_tokens)))
        starts.append((key, float(stats.starts)))
        exits += [((*key, reason), float(n)) for reason, n in sorted(stats.exits.items())]
        states.append(((*key, service.status().state), 1.0))
        runners = service.recent_runners()
        runner = runners[-1] if runners else None
        if runner is None or runner.phase in ("stopped", "failed"):
            continue
        if (memory := runner.statistics().rss_bytes) is not None:
            rss.append((key, float(memory)))
        engine = runner.engine_statistics()
        if engine is None:
            continue
        running.append((key, float(engine.running)))
        waiting.append((key, float(engine.queued)))
        kv_capacity.append((key, float(engine.kv_capacity_bytes)))
        if engine.kv_capacity_bytes > 0:
            kv_perc.append((key, engine.kv_reserved_bytes / engine.kv_capacity_bytes))
        drafts.append((key, float(engine.speculation_verify_steps)))
        drafted.append((key, float(engine.speculation_drafted)))
        accepted.append((key, float(engine.speculation_accepted)))
        entries.append((key, float(engine.prefix_entries)))
        cached_bytes.append((key, float(engine.prefix_bytes)))
    mi = ("model", "instance")
    yield gauge("skulk:num_requests_running", "Requests the engine runs now.", mi, running)
    yield gauge("skulk:num_requests_waiting", "Requests waiting for KV room.", mi, waiting)
    yield gauge(
        "skulk:kv_cache_usage_perc",
        "KV budget the admitted requests reserve (1 means all of it).",
        mi,
        kv_perc,
    )
    yield gauge("skulk:kv_cache_capacity_bytes", "The engine's KV budget.", mi, kv_capacity)
    yield counter(
        "skulk:prefix_cache_queries",
        "Prompt tokens of the requests finished here (looked up in the prefix cache).",
        mi,
        queries,
    )
    yield counter(
        "skulk:prefix_cache_hits",
        "Prompt tokens the prefix cache supplied (not computed).",
        mi,
        hits,
    )
    yield gauge("skulk:prefix_cache_entries", "Prompts the prefix cache keeps.", mi, entries)
    yield gauge("skulk:prefix_cache_bytes", "KV bytes the prefix cache keeps.", mi, cached_bytes)
    yield counter(
        "skulk:spec_decode_num_drafts",
        "Forward passes that checked an n-gram draft (this runner's).",
        mi,
        drafts,
    )
    yield counter(
        "skulk:spec_decode_num_draft_tokens", "Draft tokens checked (this runner's).", mi, drafted
    )
    yield counter(
        "skulk:spec_decode_num_accepted_tokens",
        "Draft tokens kept (this runner's).",
        mi,
        accepted,
    )
    yield counter("skulk:runner_starts", "Runners started for the instance here.", mi, starts)
    yield counter(
        "skulk:runner_exits",
        "Runners that ended, by failure reason.",
        (*mi, "reason"),
        exits,
    )
    yield gauge(
        "skulk:instance_state",
        "1 for the state of each instance this node runs (ready, loading, failed, ...).",
        (*mi, "state"),
        states,
    )
    yield gauge("skulk:runner_rss_bytes", "The runner's resident memory.", mi, rss)


class DriverStats(Protocol):
    """What :func:`consensus_families` reads of a Raft driver's statistics."""

    @property
    def healthy(self) -> bool: ...
    @property
    def role(self) -> str | None: ...
    @property
    def term(self) -> int: ...
    @property
    def commit(self) -> int: ...
    @property
    def applied(self) -> int: ...
    @property
    def last_index(self) -> int: ...
    @property
    def leader_changes(self) -> int: ...
    @property
    def proposals(self) -> int: ...
    @property
    def disk_failures(self) -> int: ...
    @property
    def entries_applied(self) -> int: ...
    @property
    def apply_seconds(self) -> float: ...
    @property
    def snapshots(self) -> int: ...
    @property
    def snapshot_seconds(self) -> float: ...


def consensus_families(statistics: Callable[[], DriverStats]) -> Iterator[Metric]:
    """This node's Raft: term, role, indexes, leader changes, health."""
    s = statistics()
    yield gauge("skulk:raft_term", "The Raft term this node is in.", (), [((), float(s.term))])
    yield gauge(
        "skulk:raft_role",
        "1 for this node's Raft role.",
        ("role",),
        [((r.value,), float(s.role == r.value)) for r in Role],
    )
    yield gauge(
        "skulk:raft_commit_index", "The highest log index known committed.", (), [((), s.commit)]
    )
    yield gauge(
        "skulk:raft_applied_index", "The highest log index applied here.", (), [((), s.applied)]
    )
    yield gauge("skulk:raft_last_index", "The last index of the log.", (), [((), s.last_index)])
    yield counter(
        "skulk:raft_leader_changes",
        "Leaders this node came to know (one per term with a leader).",
        (),
        [((), float(s.leader_changes))],
    )
    yield counter(
        "skulk:raft_proposals", "Entries this node proposed.", (), [((), float(s.proposals))]
    )
    yield counter(
        "skulk:raft_disk_failures",
        "Raft storage failures.",
        (),
        [((), float(s.disk_failures))],
    )
    yield counter(
        "skulk:raft_entries_applied",
        "Committed entries applied to the State here.",
        (),
        [((), float(s.entries_applied))],
    )
    yield counter(
        "skulk:raft_apply_seconds",
        "Seconds applying committed entries to the State took here.",
        (),
        [((), s.apply_seconds)],
    )
    yield counter("skulk:raft_snapshots", "Log compactions here.", (), [((), float(s.snapshots))])
    yield counter(
        "skulk:raft_snapshot_seconds",
        "Seconds making the snapshot images of those compactions took.",
        (),
        [((), s.snapshot_seconds)],
    )
    yield gauge(
        "skulk:raft_healthy",
        "1 while this node's Raft storage works.",
        (),
        [((), float(s.healthy))],
    )


class TransportStats(Protocol):
    """What :func:`raft_transport_families` reads of the Raft transport's statistics."""

    @property
    def bytes_sent(self) -> Mapping[str, int]: ...


def raft_transport_families(statistics: Callable[[], TransportStats]) -> Iterator[Metric]:
    """Bytes of the Raft messages this node queued on its links, by message kind (``append``:
    AppendEntries carrying entries; ``heartbeat``: without; ``append_reply``, ``vote``,
    ``snapshot``, ``timeout_now``)."""
    yield counter(
        "skulk:raft_sent_bytes",
        "Bytes of the Raft messages this node sent, by message kind.",
        ("message",),
        [((kind,), float(n)) for kind, n in sorted(statistics().bytes_sent.items())],
    )


def link_families(links: Callable[[], Sequence[LinkView]]) -> Iterator[Metric]:
    """Per peer (label ``peer``: its node id, or its address before a handshake): link state,
    round-trip time and bytes of the current link."""
    states, rtt, received, sent = [], [], [], []
    for view in links():
        peer = (view.peer_id or view.address,)
        states += [((*peer, s.value), float(view.state is s)) for s in PeerState]
        if view.rtt_ms is not None:
            rtt.append((peer, view.rtt_ms / 1000))
        received.append((peer, float(view.bytes_in)))
        sent.append((peer, float(view.bytes_out)))
    yield gauge("skulk:link_state", "1 for each peer's link state.", ("peer", "state"), states)
    yield gauge("skulk:link_rtt_seconds", "The latest ping's round trip.", ("peer",), rtt)
    yield counter("skulk:link_received_bytes", "Bytes received on the link.", ("peer",), received)
    yield counter("skulk:link_sent_bytes", "Bytes sent on the link.", ("peer",), sent)


def gossip_families(gossip: TelemetryGossip) -> Iterator[Metric]:
    """Per node this node has telemetry of: seconds since a newer version of it arrived."""
    now = trio.current_time()
    store = gossip.store
    ages = []
    for node in sorted(store.view):
        refreshed = store.refreshed_at(node)
        if refreshed is not None:
            ages.append(((node,), max(0.0, now - refreshed)))
    yield gauge(
        "skulk:gossip_age_seconds",
        "Seconds since this node got fresh telemetry of each node.",
        ("node",),
        ages,
    )
    stats = gossip.statistics()
    yield counter("skulk:gossip_rounds", "Gossip rounds.", (), [((), float(stats.rounds))])
    yield counter(
        "skulk:gossip_sent_bytes",
        "Bytes of the telemetry frames this node sent: digests and pushes (entries).",
        ("frame",),
        [(("digest",), float(stats.digest_bytes_sent)), (("push",), float(stats.push_bytes_sent))],
    )


def state_families(state: State) -> Iterator[Metric]:
    """The applied cluster State as this node sees it: nodes by status, instances and runners
    (every node shows the same; aggregate with ``max``, not ``sum``)."""
    nodes: dict[tuple[str], float] = {}
    for n in state.nodes:
        nodes[(n.status,)] = nodes.get((n.status,), 0.0) + 1
    instances: dict[tuple[str, str, str], float] = {}
    for i in state.instances:
        k = (i.model, i.sharding, i.status)
        instances[k] = instances.get(k, 0.0) + 1
    runners: dict[tuple[str, str], float] = {}
    for r in state.runners:
        k2 = (r.node, r.phase)
        runners[k2] = runners.get(k2, 0.0) + 1
    yield gauge("skulk:cluster_nodes", "Nodes by status.", ("status",), sorted(nodes.items()))
    yield gauge(
        "skulk:cluster_instances",
        "Instances by model, sharding and status.",
        ("model", "sharding", "status"),
        sorted(instances.items()),
    )
    yield gauge(
        "skulk:cluster_runners",
        "Runners (ranks) by node and phase.",
        ("node", "phase"),
        sorted(runners.items()),
    )


def control_families(control: ClusterControl) -> Iterator[Metric]:
    """The State's families, and the placements this node committed by kind and reason."""
    yield from state_families(control.state)
    yield counter(
        "skulk:placements",
        "Instances this node placed while it led: kind placement (reason new) or replacement "
        "(reason node_down, the failed runner's reason, or other).",
        ("kind", "reason"),
        [(key, float(n)) for key, n in sorted(control.placements.items())],
    )


def routing_families(routing: RemoteRouting, admission: Admission) -> Iterator[Metric]:
    """Requests this node serves for other nodes, and its admission bound."""
    r, a = routing.statistics(), admission.statistics()
    yield counter(
        "skulk:routed_requests_served",
        "Requests other nodes routed here and this node admitted.",
        (),
        [((), float(r.served))],
    )
    yield counter(
        "skulk:routed_requests_refused",
        "Routed requests this node refused (not here, not ready, overloaded).",
        (),
        [((), float(r.refused))],
    )
    yield counter(
        "skulk:routed_requests_abandoned",
        "Routed requests cancelled because their caller stopped or was lost.",
        (),
        [((), float(r.abandoned))],
    )
    yield gauge(
        "skulk:routed_requests_serving",
        "Requests this node serves for other nodes now.",
        (),
        [((), float(r.serving))],
    )
    yield counter(
        "skulk:admission_refused",
        "Requests (local or routed here) refused at the admission bound (429).",
        (),
        [((), float(a.refused))],
    )
    yield gauge(
        "skulk:admission_in_flight",
        "Requests holding an admission place, by instance.",
        ("instance",),
        [((i,), float(n)) for i, n in sorted(a.in_flight.items())],
    )


def transfer_families(client: WeightClient, server: WeightServer) -> Iterator[Metric]:
    """Weight transfers: bytes fetched from peers, and sent to them."""
    c, s = client.statistics(), server.statistics()
    yield counter(
        "skulk:weight_fetch_bytes",
        "Weight bytes this node fetched from peers.",
        (),
        [((), float(c.bytes_received))],
    )
    yield counter(
        "skulk:weight_fetch_pieces_corrupt",
        "Fetched pieces that failed their hash.",
        (),
        [((), float(c.pieces_corrupt))],
    )
    yield gauge("skulk:weight_fetches", "Fetches running now.", (), [((), float(c.fetching))])
    yield counter(
        "skulk:weight_serve_bytes",
        "Weight bytes this node sent to peers.",
        (),
        [((), float(s.bytes_sent))],
    )
