"""The commands the simulated leaders propose: a random, realistic mix of cluster commands.

A client's submission reaches a node; if that node leads, it decides the command there and
then, the way a Skulk leader decides: from *its own* applied State (which may lag what is
committed) and with *its own* clock for every ``at`` (the tick, in milliseconds, plus a
per-node skew). A retry at another leader is decided anew -- same ``(client, seq)``, possibly
another command -- and the sessions apply whichever lands first, once.

Most commands are what a leader would sensibly commit (an ``UpsertNode`` for a node that came
back, a placement on nodes that are ``up``, a report from the rank's own node, the deletion of
an instance that exists); some are deliberately wrong, so that ``apply`` must reject them
(placement on a ``down`` node or an unknown model, deleting an unknown instance, a report
from the wrong node or for a rank that does not exist, a bad card or config, removing a node
that still runs shards). Others go wrong on their own: the State moves between the leader's
decision and the command's commit (a node declared ``down`` in between, an instance deleted
by another client), which is what the placement invariant is there to watch.

Node statuses follow the simulation now and then: a node the simulation has crashed, paused
or degraded is declared ``down`` by a later ``NodeStatusChanged``, and a running one ``up``
again, interleaved with the network and disk faults. Randomness comes from the generator's own
``random.Random``.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

import attrs

from skulk.cluster import State, encode_command
from skulk.wire.cluster import (
    Architecture,
    ClusterCommand,
    ClusterConfig,
    DeleteInstance,
    DemoSource,
    ModelCard,
    NodeStatus,
    NodeStatusChanged,
    PlaceInstance,
    RegisterModel,
    RemoveNode,
    ReportRunner,
    RunnerPhase,
    SetConfig,
    SetInstanceStatus,
    Shard,
    Sharding,
    UpsertNode,
)

EPOCH_MS = 1_700_000_000_000
"""The leaders' clocks read this at tick 0 (plus their skew)."""
TICK_MS = 10
EXTRA_NODES = ("w1", "w2")
"""Cluster members of the State that are not Raft nodes of the simulation."""
GHOST = "ghost"
"""A node id no command ever adds."""
MAX_INSTANCES = 6
"""Past this many instances, placements give way to deletions (keeps snapshots small)."""

MODELS = (
    ModelCard("tiny", DemoSource(1), Architecture("llama", 4, 64, 4, 2, 256), 10_000, 512),
    ModelCard("small", DemoSource(2), Architecture("llama", 8, 128, 8, 4, 512), 80_000, 2048),
    ModelCard("mid", DemoSource(3), Architecture("qwen", 12, 256, 8, 2, 1024), 900_000, 4096),
)

WEIGHTS: tuple[tuple[str, int], ...] = (
    ("upsert", 8),
    ("status", 12),
    ("remove", 4),
    ("register", 5),
    ("place", 26),
    ("delete", 14),
    ("set_status", 5),
    ("report", 24),
    ("config", 2),
)
PHASES: tuple[RunnerPhase, ...] = ("pending", "loading", "ready", "failed", "stopped")


class CommandMaker:
    """Decides the command a leader proposes for a client's ``(client, seq)``.

    ``node_ids`` are the simulation's nodes (each is also a cluster member of the State);
    ``running(node)`` tells whether the simulation runs it now (for status verdicts)."""

    def __init__(
        self, rng: random.Random, node_ids: Sequence[str], running: Callable[[str], bool]
    ) -> None:
        self._rng = rng
        self._sim_nodes = tuple(node_ids)
        self._pool = (*self._sim_nodes, *EXTRA_NODES)
        self._running = running
        self._skew = {n: rng.randint(-40, 40) for n in self._pool}
        kinds, weights = zip(*WEIGHTS, strict=True)
        self._kinds: tuple[str, ...] = kinds
        self._weights: tuple[int, ...] = weights

    def clock(self, leader: str, now: int) -> int:
        """``leader``'s wall clock at tick ``now``, in ms since the epoch."""
        return EPOCH_MS + now * TICK_MS + self._skew.get(leader, 0)

    def make(self, state: State, leader: str, client: str, seq: int, now: int) -> ClusterCommand:
        """The command ``leader`` (whose applied State is ``state``) proposes now."""
        at = self.clock(leader, now)
        rng = self._rng
        if not state.nodes or rng.random() < 0.03:
            return self._upsert(at)
        known = {n.id: n.status for n in state.nodes}
        back = [n for n in self._sim_nodes if known.get(n) != "up" and self._running(n)]
        if back and rng.random() < 0.3:  # the leader's first duty: upsert who it reaches
            return self._upsert(at, rng.choice(back))
        kind = rng.choices(self._kinds, self._weights)[0]
        if kind in ("place", "delete", "set_status", "report") and not state.models:
            kind = "register"
        if kind == "place" and len(state.instances) >= MAX_INSTANCES and rng.random() < 0.8:
            kind = "delete"
        if kind in ("delete", "set_status", "report") and not state.instances:
            kind = "place" if state.models else "register"
        match kind:
            case "upsert":
                return self._upsert(at)
            case "status":
                return self._status(state, at)
            case "remove":
                return self._remove(state)
            case "register":
                return self._register()
            case "place":
                return self._place(state, client, seq, at)
            case "delete":
                return DeleteInstance(self._instance_id(state))
            case "set_status":
                return SetInstanceStatus(
                    self._instance_id(state), rng.choice(("placed", "failed")), at
                )
            case "report":
                return self._report(state, at)
        return self._config()

    def encode(self, state: State, leader: str, client: str, seq: int, now: int) -> bytes:
        """:meth:`make`, as the bytes the leader proposes."""
        return encode_command(self.make(state, leader, client, seq, now))

    # --- each kind ------------------------------------------------------------------------

    def _upsert(self, at: int, node: str | None = None) -> UpsertNode:
        rng = self._rng
        if node is None:
            node = "" if rng.random() < 0.03 else rng.choice(self._pool)
        host = f"10.0.0.{self._pool.index(node) + 1 if node else 0}"
        port = rng.choice((8000, 8001))  # a new port now and then: addresses change
        return UpsertNode(node, f"{host}:{port}", f"{host}:9000", at)

    def _status(self, state: State, at: int) -> NodeStatusChanged:
        rng = self._rng
        if rng.random() < 0.04:
            return NodeStatusChanged(GHOST, "down", at)
        node = rng.choice(self._pool)
        status: NodeStatus
        if node in self._sim_nodes and rng.random() < 0.6:
            status = "up" if self._running(node) else "down"  # the leader's verdict
        else:
            status = rng.choice(("up", "down", "down", "left"))
        return NodeStatusChanged(node, status, at)

    def _remove(self, state: State) -> RemoveNode:
        rng = self._rng
        used = {s.node for i in state.instances for s in i.shards}
        idle = [n.id for n in state.nodes if n.status != "up" and n.id not in used]
        if idle and rng.random() < 0.6:
            return RemoveNode(rng.choice(idle))
        return RemoveNode(rng.choice((*self._pool, GHOST)))

    def _register(self) -> RegisterModel:
        rng = self._rng
        card = rng.choice(MODELS)
        roll = rng.random()
        if roll < 0.05:  # a bad card
            arch = card.architecture
            card = ModelCard(card.id, card.source, Architecture(arch.family, 0, 1, 1, 1, 1), 1, 1)
        elif roll < 0.2:  # a new revision: model_in_use while instances run it
            card = ModelCard(
                card.id, card.source, card.architecture, card.weight_bytes + 1, card.context_length
            )
        return RegisterModel(card)

    def _place(self, state: State, client: str, seq: int, at: int) -> PlaceInstance:
        rng = self._rng
        instance = f"{client}.{seq}"
        if state.instances and rng.random() < 0.04:
            instance = rng.choice(state.instances).id  # duplicate_instance
        card = rng.choice(state.models)
        model = "unknown-model" if rng.random() < 0.04 else card.id
        sharding: Sharding = rng.choice(("single", "single", "pipeline", "pipeline", "tensor"))
        width = 1 if sharding == "single" else rng.randint(2, 3)
        up = [n.id for n in state.nodes if n.status == "up"]
        others = [n.id for n in state.nodes if n.status != "up"]
        nodes = rng.sample(up, min(width, len(up)))
        if others and (not nodes or rng.random() < 0.2):
            bad = rng.choice(others)  # a node this leader knows is not up: node_not_up
            if nodes:
                nodes[rng.randrange(len(nodes))] = bad
            else:
                nodes.append(bad)
        if rng.random() < 0.03:
            nodes.append(GHOST)  # unknown_node
        elif len(nodes) > 1 and rng.random() < 0.03:
            nodes[1] = nodes[0]  # a node twice: bad_shards
        layers = card.architecture.layers
        shards = _shards(sharding, nodes, layers)
        if shards and rng.random() < 0.04:  # a wrong layer range: bad_layers
            last = shards[-1]
            shards[-1] = attrs.evolve(last, end=last.end + 1)
        return PlaceInstance(instance, model, sharding, tuple(shards), at)

    def _instance_id(self, state: State) -> str:
        if self._rng.random() < 0.08:
            return "no-such-instance"
        return self._rng.choice(state.instances).id

    def _report(self, state: State, at: int) -> ReportRunner:
        rng = self._rng
        inst = rng.choice(state.instances)
        shard = rng.choice(inst.shards)
        instance, rank, node = inst.id, shard.rank, shard.node
        roll = rng.random()
        if roll < 0.05:
            instance = "no-such-instance"
        elif roll < 0.1:
            rank = len(inst.shards)  # unknown_rank
        elif roll < 0.2:
            node = rng.choice([n for n in self._pool if n != node])  # wrong_node
        phase = rng.choice(PHASES)
        failure = rng.choice(("oom", "load_error")) if phase == "failed" else None
        if rng.random() < 0.04:  # a failure without 'failed', or 'failed' without one
            failure = None if failure else "oom"
        return ReportRunner(instance, rank, node, phase, failure, at)

    def _config(self) -> SetConfig:
        rng = self._rng
        down = rng.choice((2000, 5000, 8000))
        if rng.random() < 0.2:
            down = -1  # bad_value
        return SetConfig(ClusterConfig(node_down_after_ms=down))


def _shards(sharding: Sharding, nodes: list[str], layers: int) -> list[Shard]:
    if sharding == "single":
        return [Shard(r, n, 0, layers) for r, n in enumerate(nodes[:1])]
    if sharding == "tensor":
        return [Shard(r, n, 0, layers, _address(r)) for r, n in enumerate(nodes)]
    count = len(nodes)
    if count == 0:
        return []
    bounds = [layers * k // count for k in range(count)] + [layers]
    return [Shard(r, n, bounds[r], bounds[r + 1], _address(r)) for r, n in enumerate(nodes)]


def _address(rank: int) -> str:
    return f"127.0.0.1:{7600 + rank}"
