"""Pulling a Hub model into the cluster: the leader's decision, and the asking node's view.

* **On the leader** (:func:`decide_pull`, one ask at a time like placements): a model with a
  card, or one downloading, is answered as it is; otherwise the leader chooses the node to
  download it (:func:`skulk.cluster.choose_downloader`: room in its store from telemetry, the
  asking node preferred among near equals; nodes that failed it earlier only once every node
  has) and commits ``StartDownload``, or refuses ``disk_full`` with the largest room it saw.
* **On the asking node** (:func:`pull_statuses`, behind :meth:`ClusterControl.pull`): the Hub
  check first (a typed :class:`~skulk.hub.HubError` before any weight byte moves), then the
  ask (asked again for up to :data:`INFO_WAIT_S` while the leader has no store reading yet),
  then a :class:`PullStatus` every :data:`STATUS_INTERVAL_S` and on every State change:
  ``downloading`` until the card is registered, ``spreading`` until every up node with room
  holds the model, ``done``. A download every candidate failed ends the pull with
  :class:`PullFailed` (the last failure's reason); a spread that makes no progress for
  :data:`SPREAD_STALL_S` ends it ``done`` with the holders it has (the nodes left out fetch on
  their own, later). The generator holds no cancel scope across a ``yield``: whoever iterates
  it may close it from anywhere.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Literal, Protocol

import attrs
import trio

from skulk.cluster import State, choose_downloader, store_room
from skulk.hub import HubPlan, HubRef, parse_hub_ref
from skulk.wire.cluster import (
    ClusterCommand,
    ClusterResult,
    ControlCall,
    ControlRefused,
    ControlReply,
    HubSource,
    PullAsk,
    Pulling,
    Rejected,
    StartDownload,
)
from skulk.wire.telemetry import ModelTransfer, NodeReadings

from ._sight import now_ms

STATUS_INTERVAL_S = 0.5
#: A spread with no new holder and no byte moving for this long ends the pull.
SPREAD_STALL_S = 120.0
#: A download that failed and was not re-placed within this long ends the pull.
REPLACE_GRACE_S = 10.0
#: How long a pull asks again while the leader has no node's store reading yet (a cluster
#: just started: ``placement_info_pending``), before it ends with that reason.
INFO_WAIT_S = 30.0

PullPhase = Literal["checking", "downloading", "spreading", "done"]


class PullFailed(Exception):
    """A pull that cannot finish: ``reason`` is typed (``disk_full``, ``hub_unreachable``,
    ``hash_mismatch``, ...: a download's failure on its last candidate), ``message`` for people."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@attrs.frozen
class PullStatus:
    """Where a pull stands. ``done_bytes`` counts toward ``target_bytes``: while downloading,
    the downloader's bytes of ``total_bytes``; while spreading, ``total_bytes`` per holder
    plus the bytes of the transfers in flight, toward ``total_bytes`` per node in ``nodes``
    (the up nodes that can take the model). ``transfers``: (node, transfer of this model)."""

    model: str
    phase: PullPhase
    repo: str
    commit: str
    total_bytes: int
    downloader: str | None
    holders: tuple[str, ...]
    nodes: tuple[str, ...]
    transfers: tuple[tuple[str, ModelTransfer], ...]
    done_bytes: int
    target_bytes: int


def hub_model_id(ref: HubRef) -> str:
    """The card id of a Hub model: ``org/repo`` at the default revision, else
    ``org/repo@revision`` as given."""
    if ref.revision is None or ref.revision == "main":
        return ref.repo
    return f"{ref.repo}@{ref.revision}"


Submit = Callable[[ClusterCommand], Awaitable[ClusterResult]]


async def decide_pull(
    ask: PullAsk,
    state: State,
    usable: set[str],
    readings: Mapping[str, NodeReadings],
    submit: Submit,
) -> ControlReply:
    """The leader's answer to ``ask`` (see the module doc); ``usable``: the up, reachable
    nodes."""
    if state.model(ask.model) is not None:
        return Pulling(ask.model, None, existed=True)
    running = state.download(ask.model)
    if running is not None:
        return Pulling(ask.model, running.node, existed=True)
    room = store_room(readings)
    failed = {d.node for d in state.downloads_of(ask.model)}
    node = choose_downloader(
        room, ask.total_bytes, usable, prefer=ask.prefer, exclude=failed
    ) or choose_downloader(room, ask.total_bytes, usable, prefer=ask.prefer)
    if node is None:
        seen = {n: r for n, r in room.items() if n in usable}
        if not seen:
            return ControlRefused(
                "placement_info_pending", "no node has published its model store yet"
            )
        have = max(seen.values())
        return ControlRefused(
            "disk_full",
            f"no node has room for {ask.model} ({ask.total_bytes} bytes): the most any node "
            f"has is {have} bytes (free disk, or --store-budget, less what its store holds)",
            need=ask.total_bytes,
            have=have,
        )
    result = await submit(
        StartDownload(ask.model, ask.repo, ask.commit, node, ask.total_bytes, now_ms())
    )
    if isinstance(result, Rejected):
        return ControlRefused(result.reason, result.detail)
    return Pulling(ask.model, node, existed=False)


class PullHost(Protocol):
    """What :func:`pull_statuses` uses of :class:`~skulk.control.ClusterControl`."""

    @property
    def state(self) -> State: ...

    @property
    def applied(self) -> int: ...

    node_id: str

    async def wait_change(self, seen: int) -> None: ...

    async def ask(self, call: ControlCall) -> ControlReply: ...

    async def check_hub(self, name: str) -> HubPlan: ...

    def readings(self) -> Mapping[str, NodeReadings]: ...


async def pull_statuses(host: PullHost, name: str) -> AsyncGenerator[PullStatus, None]:
    """The statuses of pulling ``name`` (``ORG/REPO[@REVISION]``) into the cluster (see the
    module doc). Raises ``ValueError`` for a name that is not a Hub id, a
    :class:`~skulk.hub.HubError`, :class:`PullFailed`, or ``ControlUnavailable``."""
    ref = parse_hub_ref(name)
    model = hub_model_id(ref)
    track = _Tracker(model, ref.repo)
    yield track.status(host.state, host.readings(), "checking")
    if host.state.model(model) is None:
        plan = await host.check_hub(name)
        track.commit, track.total = plan.commit, plan.total_bytes
        ask = PullAsk(model, ref.repo, plan.commit, plan.total_bytes, prefer=(host.node_id,))
        reply = await host.ask(ask)
        until = trio.current_time() + INFO_WAIT_S
        while _pending(reply) and trio.current_time() < until:
            yield track.status(host.state, host.readings(), "checking")
            await trio.sleep(STATUS_INTERVAL_S)
            reply = await host.ask(ask)
        if isinstance(reply, ControlRefused):
            raise PullFailed(reply.code, reply.message)
    while True:
        seen = host.applied
        state, readings = host.state, host.readings()
        status = track.next(state, readings, trio.current_time())
        yield status
        if status.phase == "done":
            return
        with trio.move_on_after(STATUS_INTERVAL_S):
            await host.wait_change(seen)


def _pending(reply: ControlReply) -> bool:
    """Whether the leader could not decide yet for want of store readings."""
    return isinstance(reply, ControlRefused) and reply.code == "placement_info_pending"


class _Tracker:
    """The running account of one pull (progress, stalls), turned into statuses."""

    def __init__(self, model: str, repo: str) -> None:
        self.model = model
        self.repo = repo
        self.commit = ""
        self.total = 0
        self._progress: tuple[int, ...] = ()
        self._moved_at: float | None = None
        self._unplaced_since: float | None = None

    def next(self, state: State, readings: Mapping[str, NodeReadings], now: float) -> PullStatus:
        card = state.model(self.model)
        if card is None:
            self._check_download(state, now)
            return self.status(state, readings, "downloading")
        if isinstance(card.source, HubSource):
            self.commit = card.source.commit
        self.total = card.weight_bytes or self.total
        status = self.status(state, readings, "spreading")
        progress = (len(status.holders), status.done_bytes)
        if self._moved_at is None or progress != self._progress:
            self._progress, self._moved_at = progress, now
        waiting = [n for n in status.nodes if n not in status.holders]
        if not waiting or now - self._moved_at >= SPREAD_STALL_S:
            return attrs.evolve(status, phase="done")
        return status

    def _check_download(self, state: State, now: float) -> None:
        """Raise :class:`PullFailed` once the download failed and was not re-placed."""
        if state.download(self.model) is not None:
            self._unplaced_since = None
            return
        entries = state.downloads_of(self.model)
        if not entries:  # not committed yet (or the card came and went): keep watching
            return
        self._unplaced_since = self._unplaced_since or now
        up = {n.id for n in state.nodes if n.status == "up"}
        every = up <= {d.node for d in entries}
        if every or now - self._unplaced_since >= REPLACE_GRACE_S:
            last = max(entries, key=lambda d: d.changed_at)
            tried = ", ".join(f"{d.node}: {d.reason}" for d in entries)
            raise PullFailed(
                last.reason or "download_failed",
                f"{self.model} could not be downloaded ({tried}): {last.detail}",
            )

    def status(
        self, state: State, readings: Mapping[str, NodeReadings], phase: PullPhase
    ) -> PullStatus:
        card = state.model(self.model)
        running = state.download(self.model)
        if running is not None:
            self.commit, self.total = running.commit, running.total_bytes
        transfers = tuple(
            (node, t)
            for node in sorted(readings)
            for t in readings[node].transfers
            if t.model == self.model
        )
        holders = card.holders if card is not None else ()
        nodes = tuple(
            sorted(
                n.id
                for n in state.nodes
                if n.status == "up" and _can_take(n.id, holders, transfers, readings, self.total)
            )
        )
        if phase == "downloading" or card is None:
            done = sum(t.bytes_done for node, t in transfers if running and node == running.node)
            target = self.total
        else:
            moving = sum(t.bytes_done for node, t in transfers if node not in holders)
            done = self.total * len([h for h in holders if h in nodes]) + moving
            target = self.total * len(nodes)
        return PullStatus(
            self.model,
            phase,
            self.repo,
            self.commit,
            self.total,
            running.node if running is not None else None,
            holders,
            nodes,
            transfers,
            min(done, target) if target else done,
            target,
        )


def _can_take(
    node: str,
    holders: tuple[str, ...],
    transfers: tuple[tuple[str, ModelTransfer], ...],
    readings: Mapping[str, NodeReadings],
    total: int,
) -> bool:
    """Whether a pull waits for ``node``: it holds the model, fetches it, or has room."""
    if node in holders or any(n == node for n, _ in transfers):
        return True
    reading = readings.get(node)
    return (
        reading is not None
        and reading.store is not None
        and (reading.store.available_bytes >= total)
    )
