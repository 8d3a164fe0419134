"""The cluster's control routes: placements, instances, the State, node removal.

``POST /v1/placements``, ``GET /v1/instances``, ``GET|DELETE /v1/instances/{id}``,
``GET /v1/cluster/state``, ``DELETE /v1/cluster/nodes/{id}``. Placements and removals are
decided by the leader (:meth:`ClusterControl.ask`); any node's API takes them. Refusals are
the error envelope with ``code`` set to the failure's name (``docs/api.md`` lists them).
A placement or deletion may carry an ``Idempotency-Key`` header: the key is committed with it in
the State, and a retry with the same key answers as the first did (one instance placed).
Instances show each rank's runner phase and failure from the State and, while a rank fetches
its weights, the progress its node gossips in telemetry.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

import attrs
import trio
from quart import Response, request
from quart_trio import QuartTrio

from skulk.api._errors import INVALID_REQUEST, SERVER, ApiError
from skulk.api._http_errors import json_response
from skulk.api._pull_format import pull_error
from skulk.api._schema import Schema, honoured
from skulk.cluster import KEY_MAX_LENGTH, Instance, State
from skulk.control import ClusterControl, ControlUnavailable
from skulk.wire.cluster import (
    ControlRefused,
    ControlReply,
    DeleteInstance,
    NodeRemoved,
    Placed,
    PlacementAsk,
    Planned,
    Rejected,
    RemoveNodeAsk,
)
from skulk.wire.telemetry import NodeReadings

Readings = Callable[[], Mapping[str, NodeReadings]]
"""The telemetry snapshot: node id → its latest readings."""

#: The status a refusal is answered with, by code (others: 409, a conflict with the State).
REFUSAL_STATUS = {
    "unknown_model": 404,
    "unknown_node": 404,
    "unknown_instance": 404,
    "placement_info_pending": 503,
    "no_quorum": 503,
    "unavailable": 503,
    "not_leader": 503,
    "bad_value": 400,
    "unsupported_sharding": 400,
    "key_reused": 422,
}

_SHARDINGS = ("single", "pipeline", "tensor")
_NODE_IDS: Schema = {
    "type": "array",
    "items": {"type": "string", "minLength": 1},
    "maxItems": 1024,
    "uniqueItems": True,
}
_NODE_COUNT: Schema = {"type": "integer", "minimum": 1, "maximum": 1024}
#: The fields of a placement, with the JSON Schema of what each accepts (the OpenAPI document's).
_PLACEMENT_FIELDS: dict[str, Schema] = {
    "model": honoured(
        "Required: a model name or path this node can resolve, or a Hub id ORG/REPO[@REVISION] "
        "(pulled into the cluster first).",
        type="string",
        minLength=1,
    ),
    "sharding": honoured("Default single.", enum=list(_SHARDINGS)),
    "nodes": honoured("Pin the instance to these nodes.", **_NODE_IDS),
    "excluded_nodes": honoured("Never these nodes (not one pinned in nodes).", **_NODE_IDS),
    "min_nodes": honoured(
        "Pipeline and tensor: the fewest ranks (at least 2; default the pinned nodes, or 2); "
        "single: 1 only.",
        **_NODE_COUNT,
    ),
    "max_nodes": honoured(
        "Pipeline and tensor: the most ranks (default every candidate); single: 1 only.",
        anyOf=[_NODE_COUNT, {"type": "null"}],
    ),
    "dry_run": honoured("Plan only: nothing is committed (200 with the plan).", type="boolean"),
}
#: How long a placement committed by the leader may take to reach this node's State.
SEE_COMMIT_TIMEOUT = 5.0


def instance_json(
    state: State, instance: Instance, readings: Mapping[str, NodeReadings] | None = None
) -> dict[str, object]:
    """One instance as ``GET /v1/instances`` shows it: per rank its node, layers, compute
    address and runner (phase and failure reason from the State; ``bytes_done`` and
    ``bytes_total`` from its node's ``readings`` while the phase is ``fetching``, else null)."""
    runners = {(r.rank): r for r in state.runners if r.instance == instance.id}

    def runner(rank: int, node: str) -> dict[str, object]:
        found = runners.get(rank)
        phase = found.phase if found is not None else "pending"
        done: int | None = None
        total: int | None = None
        node_readings = (readings or {}).get(node)
        if phase == "fetching" and node_readings is not None:
            for fetch in node_readings.fetches:
                if (fetch.instance, fetch.rank) == (instance.id, rank):
                    done, total = fetch.bytes_done, fetch.bytes_total
        return {
            "phase": phase,
            "failure": found.failure if found is not None else None,
            "bytes_done": done,
            "bytes_total": total,
        }

    return {
        "id": instance.id,
        "model": instance.model,
        "sharding": instance.sharding,
        "status": instance.status,
        "shards": [
            {
                "rank": s.rank,
                "node": s.node,
                "layers": [s.start, s.end],
                "address": s.address or None,
                "runner": runner(s.rank, s.node),
            }
            for s in instance.shards
        ],
    }


def refusal_error(refused: ControlRefused) -> ApiError:
    """The leader's refusal as an HTTP error: a 4xx (``invalid_request_error``) for what the
    request asked, a 503 (``server_error``, ``Retry-After: 1``) for the cluster's own
    trouble — no quorum, a leader changing, a leader whose Raft storage failed
    (``unavailable``), placement info not gossiped yet — which a retry may get past."""
    status = REFUSAL_STATUS.get(refused.code, 409)
    err = ApiError(
        status,
        refused.message,
        type=SERVER if status >= 500 else INVALID_REQUEST,
        code=refused.code,
    )
    if status == 503:
        err.headers = {"Retry-After": "1"}
    return err


def unavailable(exc: ControlUnavailable) -> ApiError:
    err = ApiError.unavailable(exc.message, code=exc.code)
    err.headers = {"Retry-After": "1"}
    return err


def idempotency_key(value: str | None) -> str | None:
    """The ``Idempotency-Key`` header's key (``None``: no header): 1 to
    :data:`~skulk.cluster.KEY_MAX_LENGTH` printable ASCII characters, bare or as a quoted
    string (``"..."``, as the IETF draft writes it); :class:`ApiError` (400) otherwise."""
    if value is None:
        return None
    key = value.strip()
    if len(key) >= 2 and key[0] == key[-1] == '"':
        key = key[1:-1]
    if not (0 < len(key) <= KEY_MAX_LENGTH and key.isascii() and key.isprintable()):
        raise ApiError.invalid(
            "Idempotency-Key",
            f"Idempotency-Key must be 1-{KEY_MAX_LENGTH} printable ASCII characters",
        )
    return key


def parse_placement(body: object) -> PlacementAsk:
    """A ``POST /v1/placements`` body; :class:`ApiError` (400 naming the field) otherwise."""
    if not isinstance(body, dict):
        raise ApiError.bad_body()
    for key in body:
        if key not in _PLACEMENT_FIELDS:
            raise ApiError.unknown_parameter(str(key))
    model = body.get("model")
    if model is None:
        raise ApiError.missing("model")
    if not isinstance(model, str) or not model:
        raise ApiError.invalid_type("model", "a non-empty string", model)
    sharding = body.get("sharding", "single")
    if sharding not in _SHARDINGS:
        raise ApiError.invalid("sharding", "sharding must be single, pipeline or tensor")
    nodes = _names(body, "nodes")
    excluded = _names(body, "excluded_nodes")
    # A sharded instance spans two nodes at least; pinned nodes are all used unless told.
    sharded_default = len(set(nodes)) if nodes else 2
    min_nodes = _count(body, "min_nodes", 1 if sharding == "single" else sharded_default)
    if sharding != "single" and min_nodes < 2:
        raise ApiError.invalid("min_nodes", f"a {sharding} instance needs min_nodes >= 2")
    max_nodes = body.get("max_nodes")
    if max_nodes is not None:
        max_nodes = _count(body, "max_nodes", 1)
        if max_nodes < min_nodes:
            raise ApiError.invalid("max_nodes", "max_nodes must be at least min_nodes")
    if sharding == "single":
        for key in ("min_nodes", "max_nodes"):
            if body.get(key) not in (None, 1):
                raise ApiError.invalid(
                    key, f"a single instance runs on one node: {key} applies to pipeline and tensor"
                )
    if overlap := sorted(set(nodes) & set(excluded)):
        raise ApiError.invalid(
            "excluded_nodes", f"excluded_nodes names pinned nodes: {', '.join(overlap)}"
        )
    if nodes and len(set(nodes)) < min_nodes:
        raise ApiError.invalid(
            "min_nodes", f"min_nodes is {min_nodes} but nodes pins only {len(set(nodes))} node(s)"
        )
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise ApiError.invalid_type("dry_run", "a boolean", dry_run)
    return PlacementAsk(
        model, sharding, nodes, excluded, min_nodes, max_nodes, dry_run, if_absent=False
    )


def _names(body: dict[str, object], key: str) -> tuple[str, ...]:
    value = body.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ApiError.invalid_type(key, "an array of node ids", value)
    if len(value) > 1024:
        raise ApiError.invalid(key, f"{key} lists more than 1024 nodes")
    if len(set(value)) < len(value):
        raise ApiError.invalid(key, f"{key} names a node twice")
    return tuple(value)


def _count(body: dict[str, object], key: str, default: int) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ApiError.invalid_type(key, "an integer", value)
    if not 1 <= value <= 1024:
        raise ApiError.invalid(key, f"{key} must be between 1 and 1024")
    return value


def install_cluster_routes(
    app: QuartTrio,
    control: ClusterControl,
    body_of: Callable[[], Awaitable[object]],
    readings: Readings | None = None,
) -> None:
    """Add the control routes to ``app`` (``body_of``: the app's checked JSON body reader;
    ``readings``: the telemetry snapshot, for fetch progress)."""

    def snapshot() -> Mapping[str, NodeReadings]:
        return readings() if readings is not None else {}

    async def ask(call: PlacementAsk | RemoveNodeAsk) -> ControlReply:
        try:
            return await control.ask(call)
        except ControlUnavailable as exc:
            raise unavailable(exc) from None

    async def see(instance_id: str, key: str | None) -> Instance | None:
        """The instance once this node's State has it (a follower applies a moment later);
        None at once when the State holds ``key`` but no such instance (a retry of a
        placement whose instance is gone since)."""
        with trio.move_on_after(SEE_COMMIT_TIMEOUT):
            while (found := control.state.instance(instance_id)) is None:
                if key is not None and control.state.keyed(key) is not None:
                    return None
                await control.wait_change(control.applied)
            return found
        return None

    @app.post("/v1/placements")
    async def placements() -> Response:
        key = idempotency_key(request.headers.get("Idempotency-Key"))
        placement = attrs.evolve(parse_placement(await body_of()), key=key)
        try:  # a model this node has but the cluster does not know yet: register it first
            registered = await control.register_model(placement.model)
        except ControlUnavailable as exc:
            raise unavailable(exc) from None
        except LookupError as exc:
            raise ApiError(
                404, str(exc), type="invalid_request_error", param="model", code="unknown_model"
            ) from None
        except ValueError as exc:
            raise ApiError.invalid("model", str(exc), code="unsupported_model") from None
        except Exception as exc:  # a Hub id whose pull failed: its typed status (repo_not_found
            if (failed := pull_error(exc)) is None:  # 404, gated 401, disk_full 507, ...)
                raise
            raise failed from None
        reply = await ask(attrs.evolve(placement, model=registered))
        if isinstance(reply, Planned):
            plan = {
                "model": reply.model,
                "sharding": reply.sharding,
                "shards": [
                    {
                        "rank": s.rank,
                        "node": s.node,
                        "layers": [s.start, s.end],
                        "need_bytes": s.need_bytes,
                        "available_bytes": s.available_bytes,
                        "address": s.address or None,
                    }
                    for s in reply.shards
                ],
            }
            return json_response({"plan": plan}, 200)
        if isinstance(reply, Placed):
            instance = await see(reply.instance, key)
            if instance is None:
                return json_response({"instance": {"id": reply.instance}}, 201)
            body = {"instance": instance_json(control.state, instance, snapshot())}
            return json_response(body, 201)
        assert isinstance(reply, ControlRefused)
        raise refusal_error(reply)

    @app.get("/v1/instances")
    async def instances() -> Response:
        state, seen = control.state, snapshot()
        body = {"instances": [instance_json(state, i, seen) for i in state.instances]}
        return json_response(body, 200)

    @app.get("/v1/instances/<instance_id>")
    async def instance(instance_id: str) -> Response:
        state = control.state
        found = state.instance(instance_id)
        if found is None:
            raise ApiError.not_found(f"no instance {instance_id!r}", code="unknown_instance")
        return json_response(instance_json(state, found, snapshot()), 200)

    @app.delete("/v1/instances/<instance_id>")
    async def delete_instance(instance_id: str) -> Response:
        key = idempotency_key(request.headers.get("Idempotency-Key"))
        try:
            result = await control.submit(DeleteInstance(instance_id, key))
        except ControlUnavailable as exc:
            raise unavailable(exc) from None
        if isinstance(result, Rejected):
            raise refusal_error(ControlRefused(result.reason, result.detail))
        return json_response({"deleted": instance_id}, 200)

    @app.get("/v1/cluster/state")
    async def cluster_state() -> Response:
        body = attrs.asdict(control.state)
        body["applied"] = control.applied
        return json_response(body, 200)

    @app.delete("/v1/cluster/nodes/<node_id>")
    async def remove_node(node_id: str) -> Response:
        reply = await ask(RemoveNodeAsk(node_id))
        if isinstance(reply, NodeRemoved):
            return json_response({"removed": reply.node}, 200)
        assert isinstance(reply, ControlRefused)
        raise refusal_error(reply)
