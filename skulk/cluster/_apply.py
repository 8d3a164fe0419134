"""``apply(state, command)``: the pure, total transition function of the cluster State.

Every command in every State answers either a new State and :class:`Applied`, or the *same*
State and a :class:`Rejected` naming why (``reason``, a stable snake_case name; ``detail`` for
humans). It never raises, and reads nothing but its arguments: no clock (timestamps are the
leader's, inside the command), no telemetry, no randomness, no iteration over unordered
collections. Replicas that apply the same commands in the same order therefore hold equal
States. ``specs/cluster.md`` is the normative list of checks and invariants.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable
from typing import Literal, TypeVar

import attrs

from ..wire import Codec, WireError
from ..wire.cluster import (
    Applied,
    ClusterCommand,
    ClusterConfig,
    ClusterResult,
    DeleteInstance,
    Download,
    DownloadFailed,
    ModelCard,
    NodeStatusChanged,
    PlaceInstance,
    RegisterModel,
    Rejected,
    RejectReason,
    ReleaseModel,
    RemoveNode,
    ReportRunner,
    SetConfig,
    SetInstanceStatus,
    StartDownload,
    UpsertNode,
)
from ._state import KEY_MAX_LENGTH, KEYS_KEPT, Instance, KeyedAsk, Node, Runner, State

T = TypeVar("T")
APPLIED = Applied()


class _Refusal(Exception):
    """Internal: raised by a check, turned into :class:`Rejected` by :func:`apply`."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(detail)
        self.reason: RejectReason = reason
        self.detail = detail


COMMAND_CODEC: Codec[ClusterCommand] = Codec(ClusterCommand)


def apply(state: State, command: ClusterCommand) -> tuple[State, ClusterResult]:
    """The State after ``command`` and the command's result (see the module doc).

    A command that could not cross the wire (an int outside CBOR's range, a wrong type: only
    possible for one built in-process) is ``Rejected("bad_value")``, so every State ``apply``
    returns can be snapshotted and hashed."""
    try:
        COMMAND_CODEC.unstructure(command)
    except WireError as exc:
        return state, Rejected("bad_value", str(exc)[:200])
    try:
        return _apply(state, command), APPLIED
    except _Refusal as refusal:
        return state, Rejected(refusal.reason, refusal.detail)


def _apply(state: State, command: ClusterCommand) -> State:
    match command:
        case UpsertNode(node, api, federation, at):
            _require(bool(node), "bad_value", "empty node id")
            return attrs.evolve(
                state, nodes=_put(state.nodes, Node(node, api, federation, "up", at), _id)
            )
        case NodeStatusChanged(node, status, at):
            known = _known_node(state, node)
            if known.status == status:
                return state
            changed = attrs.evolve(known, status=status, changed_at=at)
            return attrs.evolve(state, nodes=_put(state.nodes, changed, _id))
        case RemoveNode(node):
            _known_node(state, node)
            users = [i.id for i in state.instances if any(s.node == node for s in i.shards)]
            _require(not users, "node_in_use", f"node {node!r} runs shards of {users}")
            return attrs.evolve(
                state,
                nodes=tuple(n for n in state.nodes if n.id != node),
                downloads=tuple(d for d in state.downloads if d.node != node),
            )
        case RegisterModel(card):
            _check_card(card)
            old = state.model(card.id)
            if old == card:
                return state
            if old is not None and attrs.evolve(old, holders=card.holders) == card:
                holders = tuple(sorted({*old.holders, *card.holders}))  # another holder
                return attrs.evolve(
                    state, models=_put(state.models, attrs.evolve(old, holders=holders), _id)
                )
            in_use = old is not None and any(i.model == card.id for i in state.instances)
            _require(not in_use, "model_in_use", f"instances of {card.id!r} exist")
            return attrs.evolve(  # a download of the model is done
                state,
                models=_put(state.models, card, _id),
                downloads=tuple(d for d in state.downloads if d.model != card.id),
            )
        case PlaceInstance():
            return _place(state, command)
        case DeleteInstance(instance, key):
            if key is not None and _seen_key(state, key, "delete", instance):
                return state  # a retried deletion: answered as the first was
            _known_instance(state, instance)
            return _remember(_delete(state, instance), key, "delete", instance)
        case SetInstanceStatus(instance, instance_status, at):
            placed = _known_instance(state, instance)
            if placed.status == instance_status:
                return state
            updated = attrs.evolve(placed, status=instance_status, changed_at=at)
            return attrs.evolve(state, instances=_put(state.instances, updated, _id))
        case ReportRunner():
            return _report(state, command)
        case ReleaseModel(model, node):
            held = state.model(model)
            _require(held is not None, "unknown_model", f"no model {model!r}")
            assert held is not None
            if node not in held.holders:
                return state
            holders = tuple(h for h in held.holders if h != node)
            return attrs.evolve(
                state, models=_put(state.models, attrs.evolve(held, holders=holders), _id)
            )
        case StartDownload():
            return _start_download(state, command)
        case DownloadFailed(model, node, reason, detail, at):
            entry = next((d for d in state.downloads_of(model) if d.node == node), None)
            _require(entry is not None, "unknown_download", f"{node!r} downloads no {model!r}")
            assert entry is not None
            _require(bool(reason), "bad_value", "empty reason")
            if entry.status == "failed":
                return state  # a repeat
            failed = attrs.evolve(
                entry, status="failed", changed_at=at, reason=reason, detail=detail
            )
            return attrs.evolve(state, downloads=_put(state.downloads, failed, _download_key))
        case SetConfig(config):
            _check_config(config)
            return attrs.evolve(state, config=config)
    raise _Refusal("bad_value", f"not a cluster command: {type(command).__name__}")


def _place(state: State, command: PlaceInstance) -> State:
    _require(bool(command.instance), "bad_value", "empty instance id")
    if command.key is not None and _seen_key(state, command.key, "place", None):
        return state  # a retried placement: its instance was committed already
    _require(
        state.instance(command.instance) is None,
        "duplicate_instance",
        f"instance {command.instance!r} exists",
    )
    card = state.model(command.model)
    _require(card is not None, "unknown_model", f"no model {command.model!r}")
    assert card is not None  # for mypy: _require refused otherwise
    shards = command.shards
    _require(bool(shards), "bad_shards", "no shards")
    ranks = [s.rank for s in shards]
    _require(ranks == list(range(len(shards))), "bad_shards", f"ranks {ranks} are not 0..n-1")
    nodes = [s.node for s in shards]
    _require(len(set(nodes)) == len(nodes), "bad_shards", f"a node holds two ranks: {nodes}")
    for shard in shards:
        node = _known_node(state, shard.node)
        _require(node.status == "up", "node_not_up", f"node {node.id!r} is {node.status}")
    _check_layers(command, card.architecture.layers)
    addresses = [s.address for s in shards]
    if command.sharding == "single":
        _require(addresses == [""], "bad_shards", "a single instance has no compute address")
    else:
        _require(len(shards) >= 2, "bad_shards", f"a {command.sharding} instance has 2+ ranks")
        _require(
            all(addresses) and len(set(addresses)) == len(addresses),
            "bad_shards",
            f"every rank needs its own compute address: {addresses}",
        )
    if command.replaces is not None:  # a move: the old instance goes in the same step
        _known_instance(state, command.replaces)
        state = _delete(state, command.replaces)
    instance = Instance(
        command.instance, command.model, command.sharding, shards, "placed", command.at
    )
    runners = (Runner(instance.id, s.rank, s.node, "pending", None, command.at) for s in shards)
    placed = attrs.evolve(
        state,
        instances=_put(state.instances, instance, _id),
        runners=tuple(sorted((*state.runners, *runners), key=_runner_key)),
    )
    return _remember(placed, command.key, "place", instance.id)


def _seen_key(state: State, key: str, kind: str, instance: str | None) -> bool:
    """Whether ``key`` (checked) was committed already with a ``kind`` of ``instance`` (any
    instance: ``None``); ``key_reused`` when it was committed with something else."""
    _require(
        0 < len(key) <= KEY_MAX_LENGTH and key.isprintable() and key.isascii(),
        "bad_value",
        f"an idempotency key is 1-{KEY_MAX_LENGTH} printable ASCII characters",
    )
    seen = state.keyed(key)
    if seen is None:
        return False
    _require(
        seen.kind == kind and instance in (None, seen.instance),
        "key_reused",
        f"idempotency key {key!r} was used for a {seen.kind} of {seen.instance!r}",
    )
    return True


def _remember(
    state: State, key: str | None, kind: Literal["place", "delete"], instance: str
) -> State:
    """``state`` remembering ``key`` (if any) for a ``kind`` of ``instance``, forgetting the
    oldest key beyond :data:`KEYS_KEPT`."""
    if key is None:
        return state
    order = max((k.order for k in state.keys), default=0) + 1
    keys = [*state.keys, KeyedAsk(key, kind, instance, order)]
    if len(keys) > KEYS_KEPT:
        oldest = min(keys, key=lambda k: k.order)
        keys.remove(oldest)
    return attrs.evolve(state, keys=tuple(sorted(keys, key=lambda k: k.key)))


def _start_download(state: State, command: StartDownload) -> State:
    _require(bool(command.model) and bool(command.repo), "bad_value", "empty model or repo")
    _require(command.total_bytes >= 0, "bad_value", "total_bytes must be >= 0")
    _require(state.model(command.model) is None, "model_exists", f"{command.model!r} has a card")
    running = state.download(command.model)
    _require(
        running is None or running.node == command.node,
        "duplicate_download",
        f"{command.model!r} is downloading on {running.node if running else ''!r}",
    )
    if running is not None:
        return state  # a repeat
    node = _known_node(state, command.node)
    _require(node.status == "up", "node_not_up", f"node {node.id!r} is {node.status}")
    entry = Download(
        command.model,
        command.repo,
        command.commit,
        command.node,
        command.total_bytes,
        "downloading",
        command.at,
    )
    return attrs.evolve(state, downloads=_put(state.downloads, entry, _download_key))


def _delete(state: State, instance: str) -> State:
    return attrs.evolve(
        state,
        instances=tuple(i for i in state.instances if i.id != instance),
        runners=tuple(r for r in state.runners if r.instance != instance),
    )


def _check_layers(command: PlaceInstance, layers: int) -> None:
    """``single``: one shard, all layers; ``pipeline``: contiguous non-empty ranges covering
    ``[0, layers)`` in rank order; ``tensor``: every rank holds ``[0, layers)``."""
    ranges = [(s.start, s.end) for s in command.shards]
    if command.sharding == "single":
        _require(len(ranges) == 1, "bad_shards", f"single sharding has {len(ranges)} shards")
        expected = [(0, layers)]
    elif command.sharding == "tensor":
        expected = [(0, layers)] * len(ranges)
    else:
        bounds = [r[0] for r in ranges] + [layers]
        expected = list(itertools.pairwise(bounds))
        if any(start >= end for start, end in ranges):
            expected = []  # an empty or inverted range never matches
    _require(
        ranges == expected,
        "bad_layers",
        f"{command.sharding} shards {ranges} do not cover layers [0, {layers})",
    )


def _report(state: State, command: ReportRunner) -> State:
    instance = _known_instance(state, command.instance)
    shard = next((s for s in instance.shards if s.rank == command.rank), None)
    _require(shard is not None, "unknown_rank", f"{instance.id!r} has no rank {command.rank}")
    assert shard is not None
    _require(
        shard.node == command.node,
        "wrong_node",
        f"rank {command.rank} of {instance.id!r} runs on {shard.node!r}, not {command.node!r}",
    )
    _require(
        (command.phase == "failed") == (command.failure is not None),
        "bad_value",
        "a failure reason goes with phase 'failed', and only with it",
    )
    runner = Runner(
        instance.id, command.rank, command.node, command.phase, command.failure, command.at
    )
    return attrs.evolve(state, runners=_put(state.runners, runner, _runner_key))


def _check_card(card: ModelCard) -> None:
    arch = card.architecture
    positive = {
        "layers": arch.layers,
        "hidden_size": arch.hidden_size,
        "heads": arch.heads,
        "kv_heads": arch.kv_heads,
        "vocab": arch.vocab,
        "context_length": card.context_length,
    }
    bad = sorted(name for name, value in positive.items() if value < 1)
    _require(bool(card.id), "bad_value", "empty model id")
    _require(list(card.holders) == sorted(set(card.holders)), "bad_value", "holders unsorted")
    _require(not bad, "bad_value", f"must be >= 1: {bad}")
    _require(card.weight_bytes >= 0, "bad_value", "weight_bytes must be >= 0")


def _check_config(config: ClusterConfig) -> None:
    values = attrs.asdict(config)
    bad = sorted(name for name, value in values.items() if value < 0)
    _require(not bad, "bad_value", f"must be >= 0: {bad}")


def _known_node(state: State, node_id: str) -> Node:
    node = state.node(node_id)
    _require(node is not None, "unknown_node", f"no node {node_id!r}")
    assert node is not None
    return node


def _known_instance(state: State, instance_id: str) -> Instance:
    instance = state.instance(instance_id)
    _require(instance is not None, "unknown_instance", f"no instance {instance_id!r}")
    assert instance is not None
    return instance


def _require(ok: bool, reason: RejectReason, detail: str) -> None:
    if not ok:
        raise _Refusal(reason, detail)


def _id(item: Node | ModelCard | Instance) -> str:
    return item.id


def _download_key(download: Download) -> tuple[str, str]:
    return download.model, download.node


def _runner_key(runner: Runner) -> tuple[str, int]:
    return runner.instance, runner.rank


def _put(items: tuple[T, ...], item: T, key: Callable[[T], Hashable]) -> tuple[T, ...]:
    """``items`` with ``item`` replacing the one with its key (or added), sorted by key."""
    k = key(item)
    kept = [i for i in items if key(i) != k]
    return tuple(sorted((*kept, item), key=key))  # type: ignore[arg-type]
