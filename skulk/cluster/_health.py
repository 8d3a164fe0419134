"""A node's derived health: a level and the reasons for it, each with what to do (pure).

``GET /v1/cluster/nodes`` shows one per node. :func:`node_health` reads the node's gossiped
readings (``None`` when this node holds none: never received, or expired), how long ago they were
last refreshed here (``age_s``) and the cluster State; it reads no clock. Every reason has a
``code``, a ``level``, a ``message`` (what is wrong, with the numbers) and a ``remedy`` (what an
operator should do). The node's level is the worst of its reasons' levels, ``ok`` with none.

=====================  =========  ==============================================================
code                   level      when
=====================  =========  ==============================================================
``down``               error      the State holds the node ``down`` (the leader could not reach it
                                  for ``--node-down-after``), or no fresh telemetry for that long
                                  (:func:`down_after_s`), or none at all. A down node has no other
                                  reason (its readings are stale).
``late_heartbeats``    warn       its telemetry is :data:`LATE_AFTER_S` seconds old or more (but
                                  not yet down): it is overloaded, or its links are lossy.
``disk_low``           warn/error less free disk under its models directory than the largest model
                                  of the cluster takes (warn) or than :data:`DISK_ERROR_BYTES`
                                  (error: fetches and the Raft log fail soon).
``runner_cooldown``    warn       a runner of this node crash-looped and rests before its next try.
``fetch_failed``       warn/error a weight fetch failed in the last 10 minutes (error when the
                                  disk was full: it fails again until space is freed).
``memory_low``         warn       the node cannot take any placed model: its memory (free, plus
                                  what its own instances hold) is less than the smallest share
                                  any placed instance needs per node.
=====================  =========  ==============================================================
"""

from __future__ import annotations

import math
from typing import Literal

import attrs

from ..wire.cluster import ClusterConfig
from ..wire.telemetry import FetchFailure, NodeReadings
from ._placement import PlacementPolicy, _need, held_bytes, model_needs
from ._state import State

Level = Literal["ok", "warn", "error"]
ReasonLevel = Literal["warn", "error"]

#: Telemetry this old (seconds since it was last refreshed here) is late: nodes publish every
#: second, so three missed rounds in a row say the node or its links struggle.
LATE_AFTER_S = 3.0
#: Below this much free disk under the models directory a node is in error (fetches fail, and
#: the Raft log may not be written).
DISK_ERROR_BYTES = 1 << 30
#: Failures that a retry elsewhere does not fix by itself: shown as errors.
_FETCH_ERRORS = frozenset({"disk_full"})

_RANK: dict[Level, int] = {"ok": 0, "warn": 1, "error": 2}


@attrs.frozen
class HealthReason:
    code: str
    level: ReasonLevel
    message: str
    remedy: str


@attrs.frozen
class NodeHealth:
    """``level`` is the worst of ``reasons``' levels (``ok`` with none)."""

    level: Level
    reasons: tuple[HealthReason, ...]

    @property
    def down(self) -> bool:
        return any(r.code == "down" for r in self.reasons)

    def to_json(self) -> dict[str, object]:
        return {"level": self.level, "reasons": [attrs.asdict(r) for r in self.reasons]}


def worst(reasons: tuple[HealthReason, ...]) -> NodeHealth:
    """The health that ``reasons`` make: the worst level of them, ``ok`` with none."""
    level: Level = "ok"
    for r in reasons:
        if _RANK[r.level] > _RANK[level]:
            level = r.level
    return NodeHealth(level, reasons)


def down_after_s(config: ClusterConfig) -> float:
    """The down-after deadline: the cluster's ``node_down_after_ms`` (``--node-down-after``,
    default 5 s), in seconds. Telemetry this old makes a node ``down``."""
    return config.node_down_after_ms / 1000


def node_health(
    node_id: str,
    readings: NodeReadings | None,
    age_s: float | None,
    state: State,
    *,
    late_after_s: float = LATE_AFTER_S,
) -> NodeHealth:
    """The health of ``node_id`` (see the module doc). ``age_s`` is ``None`` when unknown."""
    down = _down(node_id, readings, age_s, state)
    if down is not None:
        return worst((down,))
    assert readings is not None
    reasons: list[HealthReason] = []
    if age_s is not None and age_s >= late_after_s:
        reasons.append(
            HealthReason(
                "late_heartbeats",
                "warn",
                f"its telemetry is {age_s:.1f} s old (nodes publish every second; it is down "
                f"at {down_after_s(state.config):g} s)",
                "check the node's load and its links (GET /v1/cluster/links on it): an "
                "overloaded host or a lossy network delays its gossip",
            )
        )
    reasons += _disk(readings, state)
    reasons += _cooldowns(readings)
    reasons += _fetches(readings.fetch_failures, readings)
    reasons += _memory(node_id, readings, state)
    return worst(tuple(reasons))


def _down(
    node_id: str, readings: NodeReadings | None, age_s: float | None, state: State
) -> HealthReason | None:
    node = state.node(node_id)
    deadline = down_after_s(state.config)
    remedy = (
        f"start the node again (skulk serve with the same --home; it rejoins by itself), or, if "
        f"it is gone for good, remove it: DELETE /v1/cluster/nodes/{node_id}"
    )
    if node is not None and node.status == "down":
        return HealthReason(
            "down",
            "error",
            "the cluster committed it down: the leader could not reach it for "
            f"--node-down-after ({deadline:g} s); its instances were moved",
            remedy,
        )
    if readings is None:
        return HealthReason(
            "down",
            "error",
            "no telemetry from it" + ("" if age_s is None else f" for {age_s:.1f} s"),
            remedy,
        )
    if age_s is not None and age_s >= deadline:
        return HealthReason(
            "down",
            "error",
            f"no fresh telemetry from it for {age_s:.1f} s (down after {deadline:g} s, "
            "--node-down-after)",
            remedy,
        )
    return None


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.2f} GiB"


def _disk(readings: NodeReadings, state: State) -> list[HealthReason]:
    disk = readings.disk
    if disk is None:
        return []
    remedy = (
        f"free disk space under {disk.path} (delete models this node no longer serves), or "
        "start the node with a --home on a larger disk"
    )
    if disk.free_bytes < DISK_ERROR_BYTES:
        return [
            HealthReason(
                "disk_low",
                "error",
                f"only {_gib(disk.free_bytes)} free under {disk.path}: weight fetches and the "
                "Raft log will fail",
                remedy,
            )
        ]
    largest = max(state.models, key=lambda m: m.weight_bytes, default=None)
    if largest is not None and disk.free_bytes < largest.weight_bytes:
        return [
            HealthReason(
                "disk_low",
                "warn",
                f"{_gib(disk.free_bytes)} free under {disk.path}, less than model "
                f"{largest.id} takes ({_gib(largest.weight_bytes)}): it cannot be fetched here",
                remedy,
            )
        ]
    return []


def _cooldowns(readings: NodeReadings) -> list[HealthReason]:
    return [
        HealthReason(
            "runner_cooldown",
            "warn",
            f"the runner of instance {r.instance} (model {r.model}, rank {r.rank}) crash-looped"
            f" ({r.failure or 'failed'}); next try in {r.retry_in_s:.0f} s",
            "read its failure and output in GET /v1/diagnostics/node on that node; fix the "
            "cause (memory, the model files, --kv-cache-memory), then POST "
            "/v1/diagnostics/node/retry there to try again at once",
        )
        for r in readings.serving
        if r.retry_in_s is not None
    ]


def _fetch_remedy(failure: FetchFailure, readings: NodeReadings) -> str:
    match failure.reason:
        case "disk_full":
            where = readings.disk.path if readings.disk is not None else "the models directory"
            return (
                f"free disk space under {where}, or start the node with a --home on a larger "
                "disk; then place the model again"
            )
        case "no_holder_reachable":
            return (
                "check that a node holding the model is up and linked to this one "
                "(GET /v1/cluster/links), or copy the model into this node's models directory"
            )
        case "manifest_mismatch":
            return (
                "the holders' files differ from the model's card: restore the model's files on "
                "a holder, or add the model again"
            )
        case "no_manifest":
            return (
                "copy the model into this node's models directory, or place it only on nodes "
                "that hold it (--nodes)"
            )
        case _:
            return (
                "check the links to the nodes holding the model (GET /v1/cluster/links) and "
                "place the model again"
            )


def _fetches(failures: tuple[FetchFailure, ...], readings: NodeReadings) -> list[HealthReason]:
    latest: dict[tuple[str, str], FetchFailure] = {}
    for f in failures:  # oldest first: one reason per (model, failure), the newest of them
        latest[(f.model, f.reason)] = f
    return [
        HealthReason(
            "fetch_failed",
            "error" if f.reason in _FETCH_ERRORS else "warn",
            f"fetching model {f.model} for instance {f.instance} (rank {f.rank}) failed: "
            f"{f.reason}: {f.message}",
            _fetch_remedy(f, readings),
        )
        for f in latest.values()
    ]


def _memory(node_id: str, readings: NodeReadings, state: State) -> list[HealthReason]:
    """``memory_low`` when no placed instance's per-node share would fit here."""
    if not state.instances:
        return []
    policy = PlacementPolicy.from_config(state.config)
    held = 0
    smallest: tuple[int, str] | None = None
    for instance in state.instances:
        card = state.model(instance.model)
        if card is None:
            continue
        held += held_bytes(card, instance).get(node_id, 0)
        need = _need(model_needs(card), 1 / max(1, len(instance.shards)), policy)
        if smallest is None or need < smallest[0]:
            smallest = (need, card.id)
    if smallest is None:
        return []
    room = readings.memory_available_bytes + math.ceil(held * policy.overhead)
    if room >= smallest[0]:
        return []
    return [
        HealthReason(
            "memory_low",
            "warn",
            f"{_gib(room)} of memory for models here (of {_gib(readings.memory_total_bytes)}); "
            f"the smallest share of any placed instance needs {_gib(smallest[0])} "
            f"(model {smallest[1]}): no placed model fits this node",
            "free memory on the host (other processes), raise --memory-limit if it is set, or "
            "split models over more nodes (--sharding pipeline) so that each share is smaller",
        )
    ]
