"""This node's own routes: ``/health``, ``/v1/diagnostics/node`` (and its ``retry``), and the
views of the mesh and consensus it is part of (``/v1/cluster/links``, ``/v1/cluster/raft``,
``/v1/cluster/nodes``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import attrs
from quart import Response
from quart_trio import QuartTrio

from skulk.api._errors import ApiError
from skulk.api._http_errors import json_response
from skulk.api._node_health import add_health
from skulk.cluster import State
from skulk.consensus import ConsensusService
from skulk.control import ClusterControl
from skulk.federation import Mesh
from skulk.routing import Router
from skulk.runner import Runner
from skulk.telemetry import TelemetryGossip
from skulk.wire.runner import EngineStats
from skulk.worker import ModelService, ModelStatus


class LocalServices(Protocol):
    """The model services this node runs, by instance id (:class:`~skulk.worker.Reconciler`)."""

    @property
    def services(self) -> Mapping[str, ModelService]: ...


def install_node_routes(
    app: QuartTrio,
    router: Router,
    local: LocalServices,
    consensus: ConsensusService[State] | None,
) -> None:
    """Add ``/health`` and the node's diagnostics to ``app``: ``local`` are the instances this
    node runs; ``router`` knows the models ready anywhere."""

    def only_service() -> ModelService | None:
        """The one instance this node runs, if it runs exactly one (the usual single node)."""
        services = list(local.services.values())
        return services[0] if len(services) == 1 else None

    @app.get("/health")
    async def health() -> Response:
        body: dict[str, object] = {"node": router.node_id}
        services = dict(local.services)
        if (one := only_service()) is not None:
            body.update(_service_health(one.status()))
        body["instances"] = {i: svc.status().state for i, svc in sorted(services.items())}
        # Healthy while this node can serve something: a local instance is ready, or some
        # model is ready anywhere (routed there). One instance loading or failed beside a
        # ready one does not take the node out of a load balancer.
        healthy = any(svc.status().ready for svc in services.values()) or any(
            m.status == "ready" for m in router.models()
        )
        status = "ok" if healthy else (one.status().state if one else "no_ready_model")
        body["status"] = status
        if consensus is not None:
            raft = consensus.status_json()
            body["consensus"] = {k: raft[k] for k in ("healthy", "unavailable", "role", "leader")}
            if not raft["healthy"]:  # e.g. its disk is full: it takes no part in decisions
                healthy = False
                body["status"] = "consensus_unavailable"
        return json_response(body, 200 if healthy else 503)

    @app.get("/v1/diagnostics/node")
    async def diagnostics() -> Response:
        services = dict(local.services)
        body: dict[str, object] = {}
        if (one := only_service()) is not None:
            body["model"] = attrs.asdict(one.status())
        body["instances"] = {i: attrs.asdict(svc.status()) for i, svc in sorted(services.items())}
        body["runners"] = [
            _runner_diagnostics(r) for svc in services.values() for r in svc.recent_runners()
        ]
        return json_response(body, 200)

    @app.post("/v1/diagnostics/node/retry")
    async def retry() -> Response:
        """An operator's "try the failed models here again now" (ends crash-loop cool-downs)."""
        retried = [i for i, svc in sorted(local.services.items()) if svc.retry_now()]
        if not retried:
            raise ApiError(
                409,
                "no model on this node is failed: there is nothing to retry",
                type="invalid_request_error",
                code="not_failed",
            )
        return json_response({"retrying": True, "instances": retried}, 202)


def install_mesh_routes(
    app: QuartTrio,
    cluster: Mesh | None,
    gossip: TelemetryGossip | None,
    consensus: ConsensusService[State] | None,
    control: ClusterControl | None,
) -> None:
    """Add the views of the mesh (links), consensus (raft) and the nodes (gossiped readings
    beside their committed status) to ``app``."""

    @app.get("/v1/cluster/links")
    async def cluster_links() -> Response:
        return json_response(cluster.links_json() if cluster is not None else {"links": []}, 200)

    @app.get("/v1/cluster/raft")
    async def cluster_raft() -> Response:
        if consensus is None:
            return json_response({"error": {"message": "consensus is not running"}}, 503)
        return json_response(consensus.status_json(), 200)

    @app.get("/v1/cluster/nodes")
    async def cluster_nodes() -> Response:
        """Every node: gossiped readings, its committed status in the State, its derived
        health and the runners it serves."""
        rows = gossip.nodes_json()["nodes"] if gossip is not None else []
        assert isinstance(rows, list)
        state = control.state if control is not None else None
        seen = set()
        for row in rows:
            node = state.node(row["node_id"]) if state is not None else None
            row["status"] = node.status if node is not None else None
            seen.add(row["node_id"])
        for node in state.nodes if state is not None else ():
            if node.id not in seen:  # in the State, no readings (down for a while)
                age = gossip.last_seen_age(node.id) if gossip is not None else None
                rows.append({"node_id": node.id, "status": node.status, "age_s": age})
        view = gossip.store.view if gossip is not None else {}
        return json_response({"nodes": add_health(rows, view, state or State())}, 200)


def _service_health(s: ModelStatus) -> dict[str, object]:
    """The health fields of one model service."""
    body: dict[str, object] = {
        "model": s.model_id,
        "state": s.state,
        "progress": {"loaded": s.loaded, "total": s.total},
        "restarts": s.restarts,
    }
    if s.failure_reason:
        body["failure"] = {"reason": s.failure_reason, "message": s.failure_message}
    body["breaker"] = {
        "state": s.breaker,
        "crash_loops": s.crash_loop_trips,
        "retry_in": s.retry_in,
    }
    return body


def _runner_diagnostics(runner: Runner) -> dict[str, object]:
    """A runner's state, deadlines and flight-recorder timeline, for operators."""
    failure = runner.failure
    return {
        **attrs.asdict(runner.statistics()),
        "failure": None
        if failure is None
        else {"reason": failure.reason, "message": failure.message, "tail": list(failure.tail)},
        "deadlines": runner.config.deadlines(),
        "engine": _engine_diagnostics(runner.engine_statistics()),
        "events": [attrs.asdict(e) for e in runner.flight_events()],
    }


def _engine_diagnostics(stats: EngineStats | None) -> dict[str, object] | None:
    """The runner's engine counters, with the speculation acceptance rate (``None`` while
    nothing was drafted); ``None`` until the runner sent some (of a sharded instance, rank 0
    sends them)."""
    if stats is None:
        return None
    return {**attrs.asdict(stats), "acceptance_rate": stats.acceptance_rate}
