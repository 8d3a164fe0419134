"""The cluster timeline: every reachable node's runner flight recorders, merged by wall clock.

Each node answers rpc :data:`TIMELINE_METHOD` (a :class:`~skulk.wire.diagnostics.TimelineAsk`)
with its own events (:class:`~skulk.wire.diagnostics.TimelineReply`), taken from a
:data:`TimelineSource`: a callable the node wires to its runners (:func:`runner_events` turns
a runner's flight recorder into events tagged with node, model, instance, rank and
incarnation). :meth:`ClusterTimeline.gather` asks every peer at once, each under its own
deadline, and merges what came back with this node's events; a peer that does not answer in
time (or has no link, or refuses) is listed in :attr:`TimelineResult.unanswered`, never waited
on longer. Sizes are bounded: each node sends at most ``limit`` events (its most recent at or
after ``since``) and the merge keeps the most recent ``limit`` of all.

One request's timeline (``gather(..., request_id=...)``, ``GET /v1/requests/{id}``): each node
answers only the events about that request, its runners' and, from a :data:`RequestSource`,
its own node-level ones (:func:`journal_events`: received, routed, admitted, the route hop,
done; ``incarnation`` 0 marks them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import attrs
import trio

from skulk.federation import LinkError, PeerUnreachable, RpcFailed, RpcTimeout
from skulk.runner import FlightEvent
from skulk.tracing import RequestJournal, check_request_id
from skulk.wire import Codec, WireError
from skulk.wire.diagnostics import DiagnosticsFrame, TimelineAsk, TimelineEvent, TimelineReply

log = logging.getLogger("skulk.diagnostics")

TIMELINE_METHOD = "diagnostics.timeline"
#: Events returned when the caller names no limit, and the most it may ask for.
DEFAULT_LIMIT = 500
MAX_LIMIT = 2000
#: A flight-recorder detail longer than this is cut (the reply stays well under a frame).
MAX_DETAIL = 400

CODEC: Codec[DiagnosticsFrame] = Codec(DiagnosticsFrame)

TimelineSource = Callable[[], Iterable[TimelineEvent]]
"""This node's runner events, in any order (called on the event loop: must not block)."""

RequestSource = Callable[[str], Iterable[TimelineEvent]]
"""This node's own (not its runners') events about one request, by the request's id."""


class RunnerHistory(Protocol):
    """A runner as :func:`runner_events` reads it (:class:`skulk.runner.Runner`)."""

    @property
    def model_id(self) -> str: ...

    @property
    def incarnation(self) -> int: ...

    def flight_events(self) -> tuple[FlightEvent, ...]: ...


class RpcCaller(Protocol):
    """One peer's link, as far as the timeline uses it (:class:`skulk.federation.Link`)."""

    async def call(self, method: str, body: bytes, timeout: float) -> bytes: ...  # noqa: ASYNC109


def runner_events(
    node: str, instance: str, rank: int, runners: Iterable[RunnerHistory]
) -> list[TimelineEvent]:
    """The flight-recorder events of ``runners`` (rank ``rank`` of ``instance`` on ``node``,
    one per incarnation) as timeline events."""
    return [
        TimelineEvent(
            e.at,
            node,
            r.model_id,
            instance,
            rank,
            r.incarnation,
            e.kind,
            e.detail[:MAX_DETAIL],
            e.request_id,
        )
        for r in runners
        for e in r.flight_events()
    ]


def journal_events(node: str, journal: RequestJournal, request_id: str) -> list[TimelineEvent]:
    """The events ``journal`` (node ``node``'s) holds about ``request_id``, as timeline events:
    rank 0, incarnation 0 (no runner), the model and instance the request was routed to."""
    return [
        TimelineEvent(
            e.at, node, e.model, e.instance, 0, 0, e.kind, e.detail[:MAX_DETAIL], e.request_id
        )
        for e in journal.events(request_id)
    ]


def select_events(
    events: Iterable[TimelineEvent], since: float, limit: int
) -> tuple[tuple[TimelineEvent, ...], int]:
    """The most recent ``limit`` of ``events`` at or after ``since``, oldest first (ties: by
    node, then in the order given), and how many matching ones were left out."""
    matching = sorted((e for e in events if e.at >= since), key=lambda e: (e.at, e.node))
    kept = matching[-limit:] if limit > 0 else []
    return tuple(kept), len(matching) - len(kept)


@attrs.frozen
class Unanswered:
    """A node whose events are missing: ``reason`` is ``no_link``, ``timeout``,
    ``unreachable``, ``bad_reply`` or the peer's rpc error reason."""

    node: str
    reason: str


@attrs.frozen
class TimelineResult:
    events: tuple[TimelineEvent, ...]
    """Oldest first, at most the limit asked for."""
    dropped: int
    """Matching events left out by the limits (on the nodes, and in the merge)."""
    answered: tuple[str, ...]
    """Nodes whose events are in (this one included), sorted."""
    unanswered: tuple[Unanswered, ...]
    """Nodes asked that did not answer in time, sorted by node."""


class ClusterTimeline:
    """See the module doc. ``peers()``: the other nodes to ask (the State's); ``link(node)``:
    the open link to one, or ``None``; ``timeout``: each peer's deadline, in seconds."""

    def __init__(
        self,
        node_id: str,
        local: TimelineSource,
        peers: Callable[[], Iterable[str]],
        link: Callable[[str], RpcCaller | None],
        *,
        timeout: float = 2.0,
        requests: RequestSource | None = None,
    ) -> None:
        self.node_id = node_id
        self._local = local
        self._requests = requests
        self._peers = peers
        self._link = link
        self._timeout = timeout

    def local_events(
        self, since: float, limit: int, request_id: str | None = None
    ) -> TimelineReply:
        """This node's answer to a :class:`TimelineAsk`."""
        try:
            events = list(self._local())
            if request_id is not None:
                events = [e for e in events if e.request_id == request_id]
                if self._requests is not None:
                    events += self._requests(request_id)
        except Exception:  # a bug in a source must not fail the whole timeline
            log.exception("timeline: reading this node's runner events failed")
            events = []
        kept, dropped = select_events(events, since, limit)
        return TimelineReply(kept, dropped)

    async def handle_rpc(self, method: str, body: bytes) -> bytes:
        """The mesh rpc handler for :data:`TIMELINE_METHOD`."""
        try:
            ask = CODEC.decode(body)
        except WireError as exc:
            raise RpcFailed("bad_request", str(exc)[:200]) from None
        if not isinstance(ask, TimelineAsk) or not 1 <= ask.limit <= MAX_LIMIT:
            raise RpcFailed("bad_request", f"expected a TimelineAsk with 1 <= limit <= {MAX_LIMIT}")
        if ask.request_id is not None:
            try:
                check_request_id(ask.request_id)
            except ValueError as exc:
                raise RpcFailed("bad_request", f"request_id: {exc}") from None
        return CODEC.encode(self.local_events(ask.since, ask.limit, ask.request_id))

    async def gather(
        self, since: float, limit: int, request_id: str | None = None
    ) -> TimelineResult:
        """Every reachable node's events at or after ``since``, the most recent ``limit``
        (see the module doc); with ``request_id``, only that request's. Returns within about
        the per-peer timeout."""
        own = self.local_events(since, limit, request_id)
        replies: dict[str, TimelineReply] = {self.node_id: own}
        missing: list[Unanswered] = []
        peers = sorted({p for p in self._peers() if p != self.node_id})
        body = CODEC.encode(TimelineAsk(since, limit, request_id))

        async def ask(peer: str) -> None:
            link = self._link(peer)
            if link is None:
                missing.append(Unanswered(peer, "no_link"))
                return
            reason = "timeout"
            with trio.move_on_after(self._timeout):
                reason = await self._ask(link, peer, body, replies)
            if reason:
                missing.append(Unanswered(peer, reason))

        async with trio.open_nursery() as nursery:
            for peer in peers:
                nursery.start_soon(ask, peer)
        merged, dropped = select_events(
            (e for reply in replies.values() for e in reply.events), since, limit
        )
        dropped += sum(max(0, reply.dropped) for reply in replies.values())
        return TimelineResult(
            merged,
            dropped,
            tuple(sorted(replies)),
            tuple(sorted(missing, key=lambda u: u.node)),
        )

    async def _ask(
        self, link: RpcCaller, peer: str, body: bytes, replies: dict[str, TimelineReply]
    ) -> str:
        """Ask ``peer``; store its reply and return ``""``, or return why there is none."""
        try:
            reply = CODEC.decode(await link.call(TIMELINE_METHOD, body, self._timeout))
        except RpcTimeout:
            return "timeout"
        except RpcFailed as exc:
            return exc.reason
        except PeerUnreachable:
            return "unreachable"
        except (LinkError, WireError) as exc:
            log.debug("timeline: %s answered badly: %s", peer, exc)
            return "bad_reply"
        if not isinstance(reply, TimelineReply) or any(e.node != peer for e in reply.events):
            return "bad_reply"  # a node speaks for itself only
        replies[peer] = reply
        return ""


def events_json(events: Sequence[TimelineEvent]) -> list[dict[str, object]]:
    """Events as the route shows them (one JSON object each, every field)."""
    return [attrs.asdict(e) for e in events]
