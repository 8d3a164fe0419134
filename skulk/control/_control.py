"""This node's handle on the replicated cluster State, and the leader's duties over it.

    control = ClusterControl(node_id, consensus, mesh, readings, card_for=..., ensure_model=M)
    mesh rpc handler: CONTROL_METHOD → control.handle_rpc
    await nursery.start(control.run)
    control.state                      # the State as applied on this node
    await control.wait_change(seen)    # until the applied index moves past ``seen``
    await control.submit(command)      # replicate one command (forwarded to the leader)
    await control.ask(PlacementAsk(...))   # placements and node removals, decided by the leader

* **Asks** (placements, node removals) always run on the leader: the asking node sends them over
  the rpc ``control.call`` to whoever leads (or runs them itself when it leads), and the leader
  runs one ask at a time, planning with its own State, so two placements never plan against the
  same free memory.
* **Leader duties**, every ``duty_interval`` s while this node leads: gather a
  :class:`~skulk.cluster.LeaderView` (reachable nodes from the mesh, their addresses, free
  memory and compute ports from telemetry, how long the others have been unreachable, the
  failures counted against each node per model) and commit what
  :func:`~skulk.cluster.next_commands` says — upserts, ``down`` verdicts, re-placements,
  removals — and take removed nodes out of the Raft membership. A committed re-placement is
  remembered: a ``single`` instance's failed nodes are avoided by the model from then on, and
  each culprit of a pipeline/tensor instance's failure (:func:`~skulk.cluster.culprit_nodes`)
  gets a strike (avoided from its second). Both are forgotten when a new term starts.
* **Sharding**: pipeline and tensor placements get a compute address per rank (from the
  ports each node advertises in telemetry); tensor placements are checked against the model
  families mlx-lm can tensor-shard (:func:`tensor_families`, probed once per family).
* **Ensure** (``ensure_model``): once the cluster has a leader, make sure the model has an
  instance (register its card, then an ``if_absent`` placement), retrying until it has one.
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import attrs
import trio

from skulk.cluster import (
    LeaderView,
    NoCandidateNodes,
    NoComputePort,
    NotEnoughMemory,
    PlacementFailure,
    PlacementInfoPending,
    PlacementPolicy,
    PlacementRequest,
    Plan,
    Reachable,
    State,
    UnknownModel,
    UnsupportedSharding,
    addresses_in_use,
    culprit_nodes,
    decode_result,
    encode_command,
    failed_nodes,
    held_bytes,
    model_needs,
    next_commands,
    node_capacities,
    plan,
)
from skulk.consensus import (
    ConsensusError,
    ConsensusService,
    NoQuorum,
    ProposalRefused,
    SubmitTimeout,
)
from skulk.federation import LinkError, Mesh, PeerState, RpcFailed
from skulk.wire import Codec, WireError
from skulk.wire.cluster import (
    ClusterCommand,
    ClusterResult,
    ControlCall,
    ControlRefused,
    ControlReply,
    ModelCard,
    NodeRemoved,
    NodeStatusChanged,
    Placed,
    PlaceInstance,
    PlacementAsk,
    Planned,
    PlannedShard,
    RegisterModel,
    Rejected,
    RemoveNode,
    RemoveNodeAsk,
    SetConfig,
)
from skulk.wire.telemetry import ComputePorts, NodeReadings

from ._families import tensor_families

log = logging.getLogger("skulk.control")

CONTROL_METHOD = "control.call"
CALL_CODEC: Codec[ControlCall] = Codec(ControlCall)
REPLY_CODEC: Codec[ControlReply] = Codec(ControlReply)


class ControlUnavailable(Exception):
    """The cluster cannot decide now (no leader reachable, no quorum, storage failed):
    ``code`` is ``no_quorum`` or ``unavailable``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def now_ms() -> int:
    """The leader's clock for committed timestamps (ms since the Unix epoch)."""
    return int(time.time() * 1000)


class ClusterControl:
    """See the module doc. ``readings()`` is the telemetry snapshot (node id → readings);
    ``card_for(model)`` makes a model's card on this node (slow: run in a thread)."""

    def __init__(
        self,
        node_id: str,
        consensus: ConsensusService[State],
        mesh: Mesh,
        readings: Callable[[], Mapping[str, NodeReadings]],
        *,
        card_for: Callable[[str], ModelCard],
        ensure_model: str | None = None,
        config_changes: Mapping[str, int] | None = None,
        duty_interval: float = 0.25,
        submit_timeout: float = 5.0,
    ) -> None:
        self.node_id = node_id
        self._consensus = consensus
        self._driver = consensus.driver
        self._mesh = mesh
        self._readings = readings
        self._card_for = card_for
        self.ensure_model = ensure_model
        self._config_changes = dict(config_changes or {})
        self._duty_interval = duty_interval
        self._submit_timeout = submit_timeout
        self._client_id = f"{node_id}/{uuid.uuid4().hex[:12]}"
        self._seq = itertools.count(1)
        self._ask_lock = trio.Lock()
        self._submit_lock = trio.Lock()
        self._avoid: dict[str, frozenset[str]] = {}
        self._strikes: dict[str, dict[str, int]] = {}
        self._last_reachable: dict[str, float] = {}
        self._led_term: int | None = None

    # ---- the State ----

    @property
    def state(self) -> State:
        return self._driver.state

    @property
    def applied(self) -> int:
        return self._driver.applied

    async def wait_change(self, seen: int) -> None:
        """Wait until the applied index is no longer ``seen``."""
        await self._driver.wait_applied(seen)

    async def submit(self, command: ClusterCommand) -> ClusterResult:
        """Replicate ``command``; its result. Raises :class:`ControlUnavailable`.

        One submission at a time per node: Raft sessions apply a client's commands at most
        once and in ``seq`` order (a lower ``seq`` arriving after a higher one is taken for a
        retry and skipped), so concurrent submitters of this node (duties, runner reports, the
        API) must not overtake one another under the one client id."""
        try:
            async with self._submit_lock:
                data = await self._driver.submit(
                    encode_command(command),
                    client_id=self._client_id,
                    seq=next(self._seq),
                    timeout=self._submit_timeout,
                )
        except (NoQuorum, SubmitTimeout) as exc:
            raise ControlUnavailable("no_quorum", f"the cluster cannot commit now: {exc}") from exc
        except ConsensusError as exc:
            code = "unavailable"
            raise ControlUnavailable(code, f"the cluster cannot commit now: {exc}") from exc
        return decode_result(data)

    async def register_model(self, name: str) -> str:
        """Make sure the model ``name`` resolves to on this node has a card in the State; its
        id. Raises :class:`~skulk.models.ModelNotFound` (a ``LookupError``) when this node does
        not have it, ``ValueError`` for a model it cannot describe, :class:`ControlUnavailable`."""
        known = model_id(name)
        if self.state.model(known) is not None:
            return known
        card = await trio.to_thread.run_sync(self._card_for, name)
        if self.state.model(card.id) is None:
            result = await self.submit(RegisterModel(card))
            if isinstance(result, Rejected):
                raise ValueError(f"model {card.id} not registered: {result.detail}")
        return card.id

    # ---- asks, run on the leader ----

    async def ask(self, call: ControlCall) -> ControlReply:
        """Run ``call`` on the leader (here if this node leads). Raises
        :class:`ControlUnavailable` when no leader answers in time."""
        deadline = trio.current_time() + self._submit_timeout
        while True:
            leader = self._driver.leader
            if leader == self.node_id:  # the same deadline as a forwarded ask has
                with trio.move_on_at(deadline):
                    return await self._run_ask(call)
                raise ControlUnavailable("no_quorum", "the leader did not decide in time")
            link = self._mesh.link(leader) if leader is not None else None
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise ControlUnavailable("no_quorum", "no cluster leader answered in time")
            if link is not None:
                try:
                    body = await link.call(CONTROL_METHOD, CALL_CODEC.encode(call), remaining)
                    reply = REPLY_CODEC.decode(body)
                except (LinkError, WireError) as exc:
                    log.debug("control call to %s failed: %s", leader, exc)
                else:
                    if not (isinstance(reply, ControlRefused) and reply.code == "not_leader"):
                        return reply
            with trio.move_on_at(min(deadline, trio.current_time() + 0.1)):
                await self._driver.wait_applied(self._driver.applied)

    async def handle_rpc(self, method: str, body: bytes) -> bytes:
        """The mesh rpc handler for :data:`CONTROL_METHOD`."""
        try:
            call = CALL_CODEC.decode(body)
        except WireError as exc:
            raise RpcFailed("bad_request", str(exc)[:200]) from None
        if self._driver.leader != self.node_id:
            reply: ControlReply = ControlRefused("not_leader", "this node does not lead")
        else:
            try:
                reply = await self._run_ask(call)
            except ControlUnavailable as exc:
                reply = ControlRefused(exc.code, exc.message)
        return REPLY_CODEC.encode(reply)

    async def _run_ask(self, call: ControlCall) -> ControlReply:
        async with self._ask_lock:
            if isinstance(call, RemoveNodeAsk):
                return await self._remove_node(call.node)
            return await self._place(call)

    async def _place(self, ask: PlacementAsk) -> ControlReply:
        state = self.state
        if ask.if_absent:
            existing = next((i for i in state.instances if i.model == ask.model), None)
            if existing is not None:
                return Placed(existing.id, existed=True)
        request = PlacementRequest(
            ask.model, ask.sharding, ask.nodes, ask.excluded_nodes, ask.min_nodes, ask.max_nodes
        )
        card = state.model(ask.model)
        families = None
        if ask.sharding == "tensor" and card is not None:
            families = await tensor_families([card.architecture.family])
        result = plan(
            request,
            {m.id: model_needs(m) for m in state.models},
            node_capacities(state, self._free_bytes(state), self._compute()),
            PlacementPolicy.from_config(state.config, families),
            addresses_in_use(state),
        )
        if not isinstance(result, Plan):
            return _refusal(result)
        if ask.dry_run:
            shards = tuple(
                PlannedShard(s.rank, s.node, *s.layers, s.need_bytes, s.available_bytes, s.address)
                for s in result.shards
            )
            return Planned(result.model, result.sharding, shards)
        instance = uuid.uuid4().hex[:12]
        outcome = await self.submit(result.command(instance, now_ms()))
        if isinstance(outcome, Rejected):
            return ControlRefused(outcome.reason, outcome.detail)
        log.info("placed %s of %s on %s", instance, ask.model, [s.node for s in result.shards])
        return Placed(instance, existed=False)

    async def _remove_node(self, node: str) -> ControlReply:
        if node == self.node_id:
            return ControlRefused("bad_value", "the leader cannot remove itself; stop it first")
        state = self.state
        if state.node(node) is None and node not in self._members():
            return ControlRefused("unknown_node", f"no node {node!r} in the cluster")
        if node in self._reachable_ids():
            return ControlRefused(
                "node_in_use", f"node {node!r} is up and linked; stop it before removing it"
            )
        # Its instances move first (the duties re-place them once it is down); then it goes.
        if state.node(node) is not None:
            if any(s.node == node for i in state.instances for s in i.shards):
                return ControlRefused(
                    "node_in_use",
                    f"node {node!r} still holds instances; they move once it is down "
                    f"({state.config.node_down_after_ms / 1000:g} s after it stopped)",
                )
            result = await self.submit(RemoveNode(node))
            if isinstance(result, Rejected):
                return ControlRefused(result.reason, result.detail)
        try:
            await self._consensus.remove_member(node)
        except (ConsensusError, ProposalRefused) as exc:
            return ControlRefused("unavailable", f"could not remove {node!r} from Raft: {exc}")
        log.warning("node %s removed from the cluster", node)
        return NodeRemoved(node)

    # ---- what the leader sees ----

    def _members(self) -> set[str]:
        conf = self._driver.conf
        return set(conf.members()) if conf is not None else set()

    def _reachable_ids(self) -> set[str]:
        up = {
            v.peer_id
            for v in self._mesh.links()
            if v.peer_id is not None and v.state is PeerState.UP
        }
        return up | {self.node_id}

    def _free_bytes(self, state: State) -> dict[str, int]:
        """Free memory per node from telemetry, less what instances placed there but not yet
        loaded will take (telemetry shows a loaded model's memory as used already)."""
        free = {n: r.memory_available_bytes for n, r in self._readings().items()}
        for instance in state.instances:
            card = state.model(instance.model)
            if card is None:
                continue
            ready = {
                r.node for r in state.runners if r.instance == instance.id and r.phase == "ready"
            }
            for node, held in held_bytes(card, instance).items():
                if node in free and node not in ready:
                    free[node] -= held
        return free

    def _compute(self) -> dict[str, ComputePorts]:
        """Compute ports per node, as advertised in telemetry."""
        return {n: r.compute for n, r in self._readings().items() if r.compute is not None}

    def _view(self, state: State, families: frozenset[str] | None) -> LeaderView:
        now = trio.current_time()
        reachable_ids = self._reachable_ids()
        readings = self._readings()
        reachable: dict[str, Reachable] = {}
        for node in reachable_ids:
            r = readings.get(node)
            if r is not None and r.api_address:
                reachable[node] = Reachable(r.api_address, ",".join(r.listen_addresses))
        for node in reachable_ids:
            self._last_reachable[node] = now
        unreachable: dict[str, int] = {}
        for known in state.nodes:
            if known.id not in reachable_ids:
                since = self._last_reachable.setdefault(known.id, now)
                unreachable[known.id] = int((now - since) * 1000)
        return LeaderView(
            reachable,
            unreachable,
            self._free_bytes(state),
            dict(self._avoid),
            self._compute(),
            {model: dict(counts) for model, counts in self._strikes.items()},
            families,
        )

    # ---- running ----

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._duties)
            if self._config_changes:
                nursery.start_soon(self._set_config)
            if self.ensure_model is not None:
                nursery.start_soon(self._ensure, self.ensure_model)
            task_status.started()

    async def _duties(self) -> None:
        fresh = (uuid.uuid4().hex[:12] for _ in itertools.count())
        while True:
            await trio.sleep(self._duty_interval)
            stats = self._driver.statistics()
            if stats.role != "leader":
                self._led_term = None
                continue
            if self._led_term != stats.term:  # a new leader gives every node a fresh grace
                self._led_term = stats.term
                self._last_reachable.clear()
                self._avoid.clear()
                self._strikes.clear()
            try:
                await self._duty_round(fresh)
            except ControlUnavailable as exc:
                log.debug("leader duties paused: %s", exc)
            except Exception:  # a bug must not take the node (and each next leader) down
                log.exception("leader duty round failed; trying again in 5 s")
                await trio.sleep(5.0)

    async def _duty_round(self, fresh: Iterator[str]) -> None:
        async with self._ask_lock:
            state = self.state
            tensor_models = {i.model for i in state.instances if i.sharding == "tensor"}
            families = await tensor_families(
                m.architecture.family for m in state.models if m.id in tensor_models
            )
            commands = next_commands(state, self._view(state, families), now_ms(), fresh)
            down = {
                c.node for c in commands if isinstance(c, NodeStatusChanged) and c.status != "up"
            }
            for command in commands:
                if self._driver.leader != self.node_id:
                    return  # deposed mid-round: the new leader decides
                result = await self.submit(command)
                if isinstance(result, Rejected):  # the others of the round may still hold
                    log.warning("leader duty %s rejected: %s", type(command).__name__, result)
                    continue
                log.info("leader duty: %s", command)
                if isinstance(command, PlaceInstance):
                    self._remember_failures(state, command, down)
                if isinstance(command, RemoveNode):
                    try:
                        await self._consensus.remove_member(command.node)
                    except (ConsensusError, ProposalRefused) as exc:
                        log.warning("could not remove %s from Raft: %s", command.node, exc)

    def _remember_failures(self, state: State, move: PlaceInstance, down: set[str]) -> None:
        """A committed re-placement (``move``, planned on ``state``; ``down``: the round's
        verdicts): a single instance's failed nodes are kept out of the model's placements
        while this node leads; each culprit of a pipeline/tensor instance gets a strike."""
        old = state.instance(move.replaces) if move.replaces is not None else None
        if old is None:
            return
        if old.sharding == "single":
            bad = failed_nodes(state, old)
            if bad:
                self._avoid[old.model] = self._avoid.get(old.model, frozenset()) | bad
            return
        counts = self._strikes.setdefault(old.model, {})
        for node in sorted(culprit_nodes(state, old, down)):
            counts[node] = counts.get(node, 0) + 1
            log.warning(
                "node %s failed instance %s of %s (%d time(s) while this node leads)",
                node,
                old.id,
                old.model,
                counts[node],
            )

    async def _set_config(self) -> None:
        """Commit this node's cluster-config flags, once this node is in the State (its log
        caught up, so the fields it does not set are the cluster's current ones)."""
        while True:
            if self.state.node(self.node_id) is None:
                await self.wait_change(self.applied)
                continue
            config = attrs.evolve(self.state.config, **self._config_changes)
            if config == self.state.config:
                return
            try:
                result = await self.submit(SetConfig(config))
            except ControlUnavailable:
                await trio.sleep(0.5)
                continue
            except Exception:
                log.exception("cluster config %s not set", self._config_changes)
                return
            if isinstance(result, Rejected):
                log.error("cluster config %s refused: %s", self._config_changes, result.detail)
            return

    async def _ensure(self, model: str) -> None:
        """Make sure ``model`` has an instance: register its card, then place it if absent.
        Waits until this node is in the State (its log caught up), so a model that already has
        an instance costs nothing (no card is made: the demo model is not generated). A
        placement that does not fit yet (memory, no node) is tried again, every 1 s at first,
        doubling up to every 30 s, and said once as a warning."""
        delay, said = 1.0, False
        while True:
            try:
                if self.state.node(self.node_id) is None:
                    await self.wait_change(self.applied)  # placement needs this node known
                    continue
                if any(i.model == model_id(model) for i in self.state.instances):
                    return
                registered = await self.register_model(model)
                reply = await self.ask(
                    PlacementAsk(registered, "single", (), (), 1, None, False, if_absent=True)
                )
            except ControlUnavailable as exc:
                log.debug("ensuring %s: %s", model, exc)
                await trio.sleep(0.5)
                continue
            except Exception as exc:  # the model cannot be read here: say so, do not retry
                log.error("cannot make sure model %s has an instance: %s", model, exc)
                return
            if isinstance(reply, Placed):
                if not reply.existed:
                    log.info("model %s placed as instance %s", registered, reply.instance)
                return
            if not said and not (
                isinstance(reply, ControlRefused) and reply.code == "placement_info_pending"
            ):
                log.warning("model %s cannot be placed yet (trying again): %s", registered, reply)
                said = True
            await trio.sleep(delay)
            delay = min(30.0, delay * 2)


def model_id(name_or_path: str) -> str:
    """The id a ``--model`` value has in the State (a directory's basename, else the name)."""
    path = Path(name_or_path).expanduser()
    return path.name if path.is_dir() else name_or_path


def _refusal(failure: PlacementFailure) -> ControlRefused:
    """A placement failure as the typed refusal the asker gets."""
    match failure:
        case NotEnoughMemory(node=node, need=need, have=have, nodes=nodes):
            message = (
                f"not enough memory on node {node} (using {nodes} node(s)): need {need} bytes, "
                f"have {have} free (an exact fit is refused)"
            )
            return ControlRefused(failure.code, message, node=node, need=need, have=have)
        case UnsupportedSharding(reason=reason):
            return ControlRefused(failure.code, reason)
        case NoComputePort(node=node, first_port=first, last_port=last):
            return ControlRefused(
                failure.code,
                f"node {node} has no free compute port: {first}-{last} are all used by other "
                "instances' ranks on its host (widen its --compute-ports)",
                node=node,
            )
        case UnknownModel(model=model):
            return ControlRefused(failure.code, f"no model {model!r} is registered")
        case NoCandidateNodes(reason=reason):
            return ControlRefused(failure.code, reason)
        case PlacementInfoPending(nodes=nodes):
            waiting = ", ".join(nodes)
            return ControlRefused(
                failure.code,
                f"no memory reading (or, for pipeline/tensor, no compute ports) yet from "
                f"{waiting}; try again in a moment",
            )
