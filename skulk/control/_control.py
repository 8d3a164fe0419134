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
  same free memory. The leader decides them in ``_asks`` with what it sees (``_sight``).
* **Leader duties**, every ``duty_interval`` s while this node leads (``_duties``): commit what
  :func:`~skulk.cluster.next_commands` says of the State and the leader's view — upserts,
  ``down`` verdicts, re-placements, removals — remembering the nodes that failed each model.
* **Sharding**: pipeline and tensor placements get a compute address per rank (from the
  ports each node advertises in telemetry); tensor placements are checked against the model
  families mlx-lm can tensor-shard (:func:`tensor_families`, probed once per family).
* **Ensure** (``ensure_model``): once the cluster has a leader, make sure the model has an
  instance (register its card, then an ``if_absent`` placement), retrying until it has one.
* **Pulls** (``_pull``): a Hub model is checked here (:meth:`ClusterControl.check_hub`), its
  download decided by the leader (``PullAsk``) and followed to every node
  (:meth:`ClusterControl.pull`); registering a Hub id (``--model ORG/REPO``, a placement of
  one) pulls it first.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping
from functools import partial
from pathlib import Path

import attrs
import trio

from skulk.cluster import State, decode_result, encode_command
from skulk.consensus import ConsensusError, ConsensusService, NoQuorum, SubmitTimeout
from skulk.federation import LinkError, Mesh, RpcFailed
from skulk.hub import HubPlan, check, looks_like_hub_ref, parse_hub_ref
from skulk.wire import WireError
from skulk.wire.cluster import (
    ClusterCommand,
    ClusterResult,
    ControlCall,
    ControlRefused,
    ControlReply,
    ModelCard,
    Placed,
    PlaceInstance,
    PlacementAsk,
    PullAsk,
    RegisterModel,
    Rejected,
    RemoveNodeAsk,
    SetConfig,
)
from skulk.wire.telemetry import NodeReadings

from ._asks import place, remove_node
from ._duties import LeaderDuties
from ._pull import PullFailed, PullStatus, decide_pull, hub_model_id, pull_statuses
from ._rpc import CALL_CODEC, CONTROL_METHOD, REPLY_CODEC, ControlUnavailable
from ._sight import LeaderSight

log = logging.getLogger("skulk.control")


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
        hub_token: str | None = None,
        offline: bool = False,
    ) -> None:
        self.node_id = node_id
        self._consensus = consensus
        self._driver = consensus.driver
        self._mesh = mesh
        self._sight = LeaderSight(node_id, consensus.driver, mesh, readings)
        self._card_for = card_for
        self._hub_token = hub_token
        self._offline = True if offline else None  # None: as HF_HUB_OFFLINE says
        self.ensure_model = ensure_model
        self._config_changes = dict(config_changes or {})
        self._submit_timeout = submit_timeout
        self._client_id = f"{node_id}/{uuid.uuid4().hex[:12]}"
        self._seq = itertools.count(1)
        self._ask_lock = trio.Lock()
        self._submit_lock = trio.Lock()
        self._duties = LeaderDuties(
            self._sight, consensus, self.submit, self._ask_lock, duty_interval
        )
        #: Placements this node committed (as leader: asks, duties), by (kind, reason): see
        #: :func:`placement_cause`.
        self.placements: Counter[tuple[str, str]] = Counter()

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
        cause = placement_cause(self.state, command) if isinstance(command, PlaceInstance) else None
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
        result = decode_result(data)
        if cause is not None and not isinstance(result, Rejected) and _placed(self.state, command):
            self.placements[cause] += 1
        return result

    def readings(self) -> Mapping[str, NodeReadings]:
        """Every node's telemetry readings, as this node sees them."""
        return self._sight.readings()

    async def check_hub(self, name: str) -> HubPlan:
        """Check the Hub model ``name`` (``ORG/REPO[@REVISION]``) from this node, before any
        weight byte moves (a worker thread; every Hub call has a deadline). Raises
        ``ValueError`` for a name that is not a Hub id, :class:`~skulk.hub.HubError`."""
        ref = parse_hub_ref(name)
        return await trio.to_thread.run_sync(
            partial(check, ref, self._hub_token, offline=self._offline)
        )

    def pull(self, name: str) -> AsyncGenerator[PullStatus, None]:
        """Pull the Hub model ``name`` into the cluster: statuses until every node that can
        holds it (see :mod:`skulk.control._pull`)."""
        return pull_statuses(self, name)

    async def register_model(self, name: str) -> str:
        """Make sure the model ``name`` resolves to on this node has a card in the State; its
        id. A Hub id (``ORG/REPO[@REVISION]`` that is not a directory here) is pulled into the
        cluster first (until its download is done: spreading goes on by itself). Raises
        :class:`~skulk.models.ModelNotFound` (a ``LookupError``) when this node does not have
        it, ``ValueError`` for a model it cannot describe, :class:`ControlUnavailable`,
        :class:`~skulk.hub.HubError` and :class:`PullFailed` for a Hub model."""
        known = model_id(name)
        if self.state.model(known) is not None:
            return known
        if is_hub_name(name):
            statuses = self.pull(name)
            try:
                async for status in statuses:
                    if status.phase in ("spreading", "done"):
                        return status.model
            finally:
                await statuses.aclose()
        card = await trio.to_thread.run_sync(self._card_for, name)
        if self.state.model(card.id) is None:
            result = await self.submit(RegisterModel(card))
            if isinstance(result, Rejected):
                raise ValueError(f"model {card.id} not registered: {result.detail}")
        return card.id

    # ---- asks, run on the leader ----

    async def ask(self, call: ControlCall) -> ControlReply:
        """Run ``call`` on the leader (here if this node leads). Raises
        :class:`ControlUnavailable` when no leader answers in time.

        A placement without an idempotency key gets one here, so this method's own retries
        (a lost answer, a leader change) place one instance at most. That also makes a
        placement safe to ask again of the next leader when this one refused it
        ``unavailable`` (its Raft storage failed, say its disk is full: it stops leading, and
        the entry it could not persist may still commit through the others); any other
        call's refusal is answered as it is."""
        if isinstance(call, PlacementAsk) and call.key is None and not call.dry_run:
            call = attrs.evolve(call, key=uuid.uuid4().hex)
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
                    if not (isinstance(reply, ControlRefused) and _ask_again(call, reply)):
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
                return await remove_node(
                    call.node, self.state, self._sight, self.submit, self._consensus
                )
            if isinstance(call, PullAsk):
                state = self.state
                up = {n.id for n in state.nodes if n.status == "up"}
                usable = up & self._sight.reachable_ids()
                return await decide_pull(call, state, usable, self.readings(), self.submit)
            return await place(
                call, self.state, self._sight, self.submit, lambda: self._driver.state
            )

    # ---- the leader's duties (see ``_duties``) ----

    async def _duty_round(self, fresh: Iterator[str]) -> None:
        """One round of the leader's duties, now (the tests drive rounds one by one)."""
        await self._duties.round(fresh)

    @property
    def _strikes(self) -> dict[str, dict[str, int]]:
        return self._duties.strikes

    # ---- running ----

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._duties.run)
            if self._config_changes:
                nursery.start_soon(self._set_config)
            if self.ensure_model is not None:
                nursery.start_soon(self._ensure, self.ensure_model)
            task_status.started()

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
            except PullFailed as exc:  # the leader has no store reading yet: ask again later
                if exc.reason != "placement_info_pending":
                    log.error("cannot make sure model %s has an instance: %s", model, exc)
                    return
                log.debug("ensuring %s: %s", model, exc)
                await trio.sleep(delay)
                delay = min(30.0, delay * 2)
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


def _placed(state: State, command: ClusterCommand) -> bool:
    """Whether applied ``command`` placed its instance (not a keyed retry that changed
    nothing: the key names another instance)."""
    if not isinstance(command, PlaceInstance) or command.key is None:
        return True
    seen = state.keyed(command.key)
    return seen is None or seen.instance == command.instance


def placement_cause(state: State, command: PlaceInstance) -> tuple[str, str]:
    """Why ``command`` places an instance, as ``(kind, reason)``: ``("placement", "new")``
    for a new instance (an operator's or ``--model``'s); for a re-placement (``replaces``),
    ``("replacement", "node_down")`` when a node of the replaced instance is not up in
    ``state``, else the failure one of its runners reported (``runner_crashed``, ...), else
    ``"other"``."""
    if command.replaces is None:
        return "placement", "new"
    old = state.instance(command.replaces)
    if old is None:
        return "replacement", "other"
    for shard in old.shards:
        node = state.node(shard.node)
        if node is None or node.status != "up":
            return "replacement", "node_down"
    failures = sorted(
        r.failure for r in state.runners if r.instance == old.id and r.failure is not None
    )
    return "replacement", failures[0] if failures else "other"


def model_id(name_or_path: str) -> str:
    """The id a ``--model`` value has in the State: a directory's basename, a Hub id's card id
    (``org/repo``, or ``org/repo@revision`` for a revision other than ``main``), else the
    name."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path.name
    if looks_like_hub_ref(name_or_path):
        return hub_model_id(parse_hub_ref(name_or_path))
    return name_or_path


def is_hub_name(name: str) -> bool:
    """Whether ``name`` names a Hub model: the shape of a Hub id, and no such directory here
    (``models/foo`` may be either)."""
    return looks_like_hub_ref(name) and not Path(name).expanduser().is_dir()


def _ask_again(call: ControlCall, refused: ControlRefused) -> bool:
    """Whether ``refused`` (a leader's answer to ``call``) is for the next leader to decide:
    this node was not the leader, or it was and its Raft storage failed (``unavailable``) —
    asked again only for a keyed placement, which a repeat cannot place twice."""
    if refused.code == "not_leader":
        return True
    return (
        refused.code == "unavailable"
        and isinstance(call, PlacementAsk)
        and (call.key is not None or call.dry_run)
    )
