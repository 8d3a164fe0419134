"""The telemetry gossip driver: runs a :class:`TelemetryStore` over a :class:`Mesh`'s links.

The store (:mod:`skulk.telemetry._store`) is the pure core; this module is its thin Trio
driver::

    store = TelemetryStore(node_id, next_epoch(home))
    gossip = TelemetryGossip(mesh, store, lambda: sample_readings(node_id, listen, api))
    await nursery.start(gossip.run)
    gossip.nodes_json()  # the body of GET /v1/cluster/nodes

Every ``interval`` seconds the driver publishes a fresh sample (:meth:`TelemetryStore.own`),
expires entries not refreshed for the store's ``ttl``, and sends the store's digest to
``fanout`` peers whose link is up, chosen at random each round (every such peer when there are
no more; ``fanout=0``: always every peer). Bounding the fan-out keeps a node's gossip bytes
linear in the number of nodes: a digest names every node and its answer carries every entry
the asker lacks, so sending to all N-1 peers each round costs each node O(N²) bytes a round
(measured: docs/scaling.md). An entry still reaches every node within a few rounds (epidemic
spread: about log(N) / log(2·fanout + 1)), since every node also answers the digests others
send it. For each link it reads the link's ``telemetry_inbox``: a digest is
answered with the entries the peer lacks (:meth:`TelemetryStore.delta_for`, sent only if not
empty), followed by our own digest when the peer's names something newer than ours
(:meth:`TelemetryStore.needs`), so one exchange pulls both ways; a push is merged
(:meth:`TelemetryStore.apply`). A new link (:class:`LinkUp`) gets our digest at once, so a
joining node converges within a round trip or two rather than an interval.

Sends never wait: a full control queue (:class:`LinkBusy`) or a closed link
(:class:`PeerUnreachable`) skips that peer until the next round, so one slow peer cannot stall
the others. A frame from a peer that cannot be handled, a sample that fails, or a link that
closes under a reader never ends the driver; they are logged and counted in
:meth:`TelemetryGossip.statistics`.

**The mesh's** :attr:`Mesh.events` **channel has a single consumer, and it is this driver**
(a Trio memory channel hands each event to one receiver only). Whoever else needs to know
about links going up and down should read :meth:`Mesh.links`, or be fed by this driver. Since
the mesh drops events when that channel is full, each round also checks :meth:`Mesh.links`
and starts readers for open links it has not seen a :class:`LinkUp` for.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from urllib.parse import urlsplit

import attrs
import trio

from skulk.federation import (
    Link,
    LinkBusy,
    LinkError,
    LinkUp,
    Mesh,
    MeshAddressError,
    PeerState,
    PeerUnreachable,
    quote,
)
from skulk.wire import WireError
from skulk.wire.telemetry import NodeReadings, TelemetryDigest, TelemetryFrame, TelemetryPush

from ._store import TelemetryStore

log = logging.getLogger("skulk.telemetry.gossip")

DEFAULT_FANOUT = 4
"""Peers a round sends its digest to (``--gossip-fanout``): a cluster of up to five nodes
gossips with every peer each round, a larger one with four of them."""


@attrs.frozen
class GossipStatistics:
    """Counters since the driver was made; ``readers`` is the number of links read now."""

    rounds: int
    readers: int
    digests_sent: int
    pushes_sent: int
    digests_received: int
    pushes_received: int
    #: sends skipped because the link's control queue was full / the link was closed
    sends_busy: int
    sends_unreachable: int
    #: sends that could not be encoded (a push over the frame size limit, say)
    sends_failed: int
    #: frames whose handling raised (a bug; logged with its traceback)
    frames_failed: int
    #: samples that raised (the round went on without publishing)
    samples_failed: int
    expired: int
    peers_learned: int
    #: digests the rounds queued or tried (at most ``fanout`` a round; the rest answered a peer)
    round_digests: int
    #: bytes of the digest / push frames queued on links (encoded link frames)
    digest_bytes_sent: int
    push_bytes_sent: int


class TelemetryGossip:
    """Gossips ``store`` over ``mesh``'s links, publishing ``sample()`` every ``interval`` s.

    ``sample`` must be cheap and must not block (it runs on the event loop every round);
    :func:`~skulk.telemetry.sample_readings` is (after its first call). Its readings must
    carry the store's node id. The driver is the only consumer of ``mesh.events`` (see the
    module doc) and the only user of ``store`` while it runs. Readings are published with
    ``trio.current_time()`` as ``now``; the store's ``ttl`` should be several intervals.
    """

    def __init__(
        self,
        mesh: Mesh,
        store: TelemetryStore,
        sample: Callable[[], NodeReadings],
        *,
        interval: float = 1.0,
        fanout: int = DEFAULT_FANOUT,
        rng: random.Random | None = None,
    ) -> None:
        if not (math.isfinite(interval) and interval > 0):
            raise ValueError(f"interval must be finite and > 0 seconds, not {interval!r}")
        if fanout < 0:
            raise ValueError(f"fanout must be >= 0 (0: every peer), not {fanout!r}")
        if store.node_id != mesh.node_id:
            raise ValueError(f"store of {store.node_id!r} given to the mesh of {mesh.node_id!r}")
        self._mesh = mesh
        self._store = store
        self._sample = sample
        self._interval = interval
        self._fanout = fanout
        self._rng = rng or random.Random()
        self._round_digests = 0
        self._readers: set[Link] = set()
        self._nursery: trio.Nursery | None = None
        self._started = False
        self._rounds = self._digests_sent = self._pushes_sent = 0
        self._digests_received = self._pushes_received = 0
        self._sends_busy = self._sends_unreachable = self._sends_failed = 0
        self._frames_failed = self._samples_failed = self._expired = 0
        self._learned = 0
        self._digest_bytes = self._push_bytes = 0
        # node id -> when its entry was last refreshed here, for entries since expired (so a
        # dead node's row still says how long it has been silent); at most max_forgotten
        self._last_seen: dict[str, float] = {}

    @property
    def store(self) -> TelemetryStore:
        return self._store

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Gossip until cancelled. Started (``task_status``) once the first sample is
        published, so :meth:`nodes_json` lists this node from then on. Runs once."""
        if self._started:
            raise RuntimeError("a TelemetryGossip runs once")
        self._started = True
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._event_loop)
                self._round()
                task_status.started()
                next_round = trio.current_time() + self._interval
                while True:
                    await trio.sleep_until(next_round)
                    self._round()
                    # Fixed cadence; after a stall, start afresh rather than catch up in a burst.
                    next_round = max(next_round + self._interval, trio.current_time())
        finally:
            self._nursery = None

    def nodes_json(self) -> dict[str, object]:
        """The body of ``GET /v1/cluster/nodes``: ``{"nodes": [...]}``, one row per node the
        store holds, by node id: ``node_id``, ``epoch``, ``seq``, ``age_s`` (seconds since this
        node last got a newer version of it; 0 for a node just published) and every
        :class:`~skulk.wire.telemetry.NodeReadings` field (tuples as lists)."""
        now = trio.current_time()
        rows: list[object] = []
        for node_id, entry in self._store.view.items():
            refreshed = self._store.refreshed_at(node_id)
            age = max(0.0, now - refreshed) if refreshed is not None else None
            row: dict[str, object] = {
                "node_id": node_id,
                "epoch": entry.epoch,
                "seq": entry.seq,
                "age_s": age,
            }
            for name, value in attrs.asdict(entry.readings).items():
                if name != "node_id":
                    row[name] = list(value) if isinstance(value, tuple) else value
            rows.append(row)
        return {"nodes": rows}

    def last_seen_age(self, node_id: str) -> float | None:
        """Seconds since this node last got a newer version of ``node_id``'s entry, whether
        the store holds it still or dropped it on expiry (``None``: never, or too long ago to
        remember)."""
        at = self._store.refreshed_at(node_id)
        if at is None:
            at = self._last_seen.get(node_id)
        return None if at is None else max(0.0, trio.current_time() - at)

    def statistics(self) -> GossipStatistics:
        return GossipStatistics(
            rounds=self._rounds,
            readers=len(self._readers),
            digests_sent=self._digests_sent,
            pushes_sent=self._pushes_sent,
            digests_received=self._digests_received,
            pushes_received=self._pushes_received,
            sends_busy=self._sends_busy,
            sends_unreachable=self._sends_unreachable,
            sends_failed=self._sends_failed,
            frames_failed=self._frames_failed,
            samples_failed=self._samples_failed,
            expired=self._expired,
            peers_learned=self._learned,
            round_digests=self._round_digests,
            digest_bytes_sent=self._digest_bytes,
            push_bytes_sent=self._push_bytes,
        )

    # ---- the round ----

    def _round(self) -> None:
        """Publish, expire, and send our digest to every open link (never blocks)."""
        self._rounds += 1
        now = trio.current_time()
        try:
            readings = self._sample()
            self._store.own(readings, now)
        except Exception:
            self._samples_failed += 1
            log.exception("telemetry: sampling this node's readings failed")
        due = self._store.next_expiry()
        refreshed: dict[str, float] = {}
        if due is not None and due < now:  # some entry expires now: remember when it was seen
            for node_id in self._store.view:
                if (at := self._store.refreshed_at(node_id)) is not None:
                    refreshed[node_id] = at
        gone = self._store.expire(now)
        if self._last_seen:  # a node heard from again is the store's to date
            for node_id in [n for n in self._last_seen if n in self._store.view]:
                del self._last_seen[node_id]
        if gone:
            for node_id in gone:
                if node_id in refreshed:
                    self._last_seen[node_id] = refreshed[node_id]
            while len(self._last_seen) > self._store.config.max_forgotten:
                del self._last_seen[next(iter(self._last_seen))]
            self._expired += len(gone)
            log.debug("telemetry: expired %s", ", ".join(quote(n) for n in gone))
        digest = self._store.digest()
        links = self._open_links()
        for link in links:
            self._watch(link)
        if 0 < self._fanout < len(links):
            links = self._rng.sample(links, self._fanout)
        for link in links:
            self._round_digests += 1
            self._send(link, digest)
        self._learn_peers()

    def _learn_peers(self) -> None:
        """Dial the nodes gossip tells of that no link reaches yet, at their listen addresses
        (the mesh's tie-break keeps one link per pair if they dial us too)."""
        for entry in self._store.view.entries():
            if entry.node_id == self._mesh.node_id or self._mesh.link(entry.node_id) is not None:
                continue
            for address in entry.readings.listen_addresses:
                host = urlsplit(address).hostname
                if host in (None, "", "0.0.0.0", "::"):
                    continue  # a wildcard says nothing about where the node is reachable
                try:
                    if self._mesh.add_peer(address):
                        self._learned += 1
                        log.info(
                            "telemetry: learned of node %s at %s", quote(entry.node_id), address
                        )
                except (MeshAddressError, RuntimeError) as exc:
                    log.debug("telemetry: not dialing %s: %s", address, exc)

    def _open_links(self) -> list[Link]:
        links = []
        for view in self._mesh.links():
            if view.state is PeerState.UP and view.peer_id is not None:
                link = self._mesh.link(view.peer_id)
                if link is not None:
                    links.append(link)
        return links

    # ---- links ----

    async def _event_loop(self) -> None:
        async for event in self._mesh.events:
            if isinstance(event, LinkUp) and event.link.closed is None:
                self._watch(event.link)
                self._send(event.link, self._store.digest())
            # LinkDown needs nothing: the link's reader ends with its inbox.

    def _watch(self, link: Link) -> None:
        """Start reading ``link`` unless a reader has it already."""
        if link in self._readers or self._nursery is None:
            return
        self._readers.add(link)
        self._nursery.start_soon(self._read, link)

    async def _read(self, link: Link) -> None:
        """Handle ``link``'s telemetry frames until the link closes (its inbox ends)."""
        try:
            async for frame in link.telemetry_inbox:
                try:
                    self._handle(link, frame)
                except Exception:  # a bug: keep gossiping with this peer and the others
                    self._frames_failed += 1
                    log.exception("telemetry: handling a frame from %s failed", quote(link.peer_id))
        finally:
            self._readers.discard(link)

    def _handle(self, link: Link, frame: TelemetryFrame) -> None:
        if isinstance(frame, TelemetryDigest):
            self._digests_received += 1
            delta = self._store.delta_for(frame)
            if delta.entries:
                self._send(link, delta)
            if self._store.needs(frame):
                self._send(link, self._store.digest())
        else:
            self._pushes_received += 1
            outcome = self._store.apply(frame.entries, trio.current_time())
            if outcome.refused:
                log.debug(
                    "telemetry: %d entries from %s refused: %s",
                    len(outcome.refused),
                    quote(link.peer_id),
                    ", ".join(f"{quote(r.node_id)} ({r.reason.value})" for r in outcome.refused),
                )

    def _send(self, link: Link, frame: TelemetryFrame) -> None:
        """Queue ``frame`` on ``link``; skip the peer this time if it is busy or gone."""
        try:
            size = link.send_telemetry_nowait(frame)
        except LinkBusy:
            self._sends_busy += 1
            log.debug("telemetry: link to %s busy; skipped", quote(link.peer_id))
            return
        except PeerUnreachable:
            self._sends_unreachable += 1
            log.debug("telemetry: link to %s closed; skipped", quote(link.peer_id))
            return
        except (LinkError, WireError) as exc:
            self._sends_failed += 1
            log.debug("telemetry: cannot send to %s: %r", quote(link.peer_id), exc)
            return
        if isinstance(frame, TelemetryPush):
            self._pushes_sent += 1
            self._push_bytes += size
        else:
            self._digests_sent += 1
            self._digest_bytes += size
