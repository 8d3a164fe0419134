"""The mesh's table of peers and dial targets, and the one-link-per-pair rule.

No I/O: :class:`~skulk.federation._mesh.Mesh` hands it each established link (:meth:`adopt`)
and each ended one (:meth:`release`); the table decides which link is a peer's, emits
:class:`LinkUp` / :class:`LinkDown` into a bounded channel and answers the views.
"""

from __future__ import annotations

import logging

import attrs
import trio

from ._link import Link
from ._linkbase import LinkStatistics
from ._meshview import LinkDown, LinkUp, LinkView, MeshEvent, PeerState
from ._refusal import quote

log = logging.getLogger("skulk.federation.mesh")


@attrs.define(eq=False)
class Peer:
    """What the mesh knows of one authenticated peer."""

    address: str
    link: Link | None = None
    outbound: bool | None = None
    last_stats: LinkStatistics | None = None
    last_error: str | None = None
    #: an open link this node dialed that lost the tie-break, until the peer closes it
    standby: Link | None = None


@attrs.define(eq=False)
class Target:
    """One dial target (a ``--join`` URL or a peer learned of)."""

    url: str
    peer_id: str | None = None
    state: PeerState = PeerState.CONNECTING
    last_error: str | None = None


class LinkTable:
    """Peers by node id (each with at most one current link) and dial targets by URL."""

    def __init__(self, node_id: str, *, event_buffer: int, max_peers: int) -> None:
        self.node_id = node_id
        self._max_peers = max_peers
        self.peers: dict[str, Peer] = {}
        self.targets: dict[str, Target] = {}
        self._changed = trio.Event()
        self._event_send, self.events = trio.open_memory_channel[MeshEvent](event_buffer)
        self.tie_breaks = 0
        self.events_dropped = 0

    def link(self, peer_id: str | None) -> Link | None:
        """The open link to ``peer_id``, or ``None``."""
        peer = self.peers.get(peer_id) if peer_id is not None else None
        return peer.link if peer is not None and is_open(peer.link) else None

    async def wait_changed(self) -> None:
        """Wait until a link is adopted or released."""
        await self._changed.wait()

    def views(self) -> tuple[LinkView, ...]:
        """One row per dial target (in the order they were added), then one per peer that no
        target names (by peer id)."""
        views = []
        named = set()
        for target in self.targets.values():
            peer = self.peers.get(target.peer_id) if target.peer_id is not None else None
            if target.peer_id is not None:
                named.add(target.peer_id)
            views.append(self._view(target.url, target.peer_id, peer, target))
        for peer_id in sorted(self.peers.keys() - named):
            peer = self.peers[peer_id]
            views.append(self._view(peer.address, peer_id, peer, None))
        return tuple(views)

    def _view(
        self, address: str, peer_id: str | None, peer: Peer | None, target: Target | None
    ) -> LinkView:
        up = peer is not None and is_open(peer.link)
        stats = None
        if peer is not None:
            # A link that closed is the peer's until its task releases it a few steps later:
            # its own statistics (and why it closed) are the freshest then.
            stats = peer.link.statistics() if peer.link is not None else peer.last_stats
        if up:
            state = PeerState.UP
        else:
            state = target.state if target is not None else PeerState.DOWN
        closing = not up and peer is not None and peer.link is not None
        error = stats.last_error if closing and stats is not None else None
        if error is None and target is not None:
            error = target.last_error
        if error is None and peer is not None:
            error = peer.last_error
        return LinkView(
            peer_id=peer_id,
            address=address,
            state=state,
            rtt_ms=stats.rtt_ms if stats is not None else None,
            bytes_in=stats.bytes_in if stats is not None else 0,
            bytes_out=stats.bytes_out if stats is not None else 0,
            frames_in=stats.frames_in if stats is not None else 0,
            frames_out=stats.frames_out if stats is not None else 0,
            last_error=error,
            outbound=peer.outbound if up and peer is not None else None,
        )

    # ---- one link per pair ----

    def duplicate(self, outbound: bool, peer_id: str) -> bool:
        """The handshake's ``is_connected``: an open link to the peer in the same direction."""
        peer = self.peers.get(peer_id)
        return peer is not None and is_open(peer.link) and peer.outbound == outbound

    def _preferred(self, peer_id: str, outbound: bool | None) -> bool:
        """Whether a link in this direction is the one the tie-break keeps: the one dialed by
        the node with the smaller id."""
        dialer = self.node_id if outbound else peer_id
        return dialer == min(self.node_id, peer_id)

    def adopt(self, link: Link, outbound: bool, address: str) -> None:
        """A link to ``link.peer_id`` was just established: make it the peer's link, or apply
        the tie-break against the peer's open link (see :mod:`skulk.federation._mesh`)."""
        if link.closed is not None:
            return
        peer_id = link.peer_id
        peer = self.peers.pop(peer_id, None) or Peer(address)
        self.peers[peer_id] = peer  # most recently active last (pruning drops the oldest)
        current = peer.link
        if current is None or not is_open(current):
            log.info("federation: link to %s (%s) up", quote(peer_id), link.remote)
            self._make_current(peer, link, outbound, address)
            return
        self.tie_breaks += 1
        keep_new = self._preferred(peer_id, outbound) and not self._preferred(
            peer_id, peer.outbound
        )
        loser, loser_outbound = (current, peer.outbound) if keep_new else (link, outbound)
        winner_outbound = outbound if keep_new else peer.outbound
        log.debug(
            "federation: two links with %s: keeping the one dialed by %s",
            quote(peer_id),
            quote(self.node_id if winner_outbound else peer_id),
        )
        if keep_new:
            self._make_current(peer, link, outbound, address)
        if loser_outbound == winner_outbound or winner_outbound:
            # A same-direction duplicate, or this node dialed the winner: it establishes the
            # winner last, so the peer already has it when the loser's close arrives.
            loser.close()
        else:
            # The peer dialed the winner and closes the loser once it has the winner too.
            # Closing it here could reach the peer before its winner does (a false down);
            # kept as a standby that takes over if the winner fails first.
            if peer.standby is not None and peer.standby is not loser:
                peer.standby.close()
            peer.standby = loser

    def _make_current(self, peer: Peer, link: Link, outbound: bool, address: str) -> None:
        peer.link, peer.outbound, peer.address = link, outbound, address
        self._emit(LinkUp(link.peer_id, link))
        self._notify()

    def release(self, link: Link) -> None:
        """A link ended: if it was its peer's current link, its standby takes over, or the
        peer is down."""
        peer = self.peers.get(link.peer_id)
        if peer is not None and peer.standby is link:
            peer.standby = None
        if peer is None or peer.link is not link:
            return  # it lost a tie-break; the peer is still up
        stats = link.statistics()
        peer.link, peer.outbound, peer.last_stats = None, None, stats
        if stats.last_error is not None:
            peer.last_error = stats.last_error
            for target in self.targets.values():
                if target.peer_id == link.peer_id:
                    target.last_error = stats.last_error
        standby, peer.standby = peer.standby, None
        if standby is not None and is_open(standby):
            self._make_current(peer, standby, True, standby.remote)  # standbys are outbound
            return
        log.info(
            "federation: link to %s (%s) down: %s",
            quote(link.peer_id),
            link.remote,
            stats.last_error or "closed",
        )
        self._emit(LinkDown(link.peer_id, stats.last_error))
        self._notify()
        self._prune()

    def _prune(self) -> None:
        named = {target.peer_id for target in self.targets.values()}
        excess = len(self.peers) - self._max_peers
        for peer_id in [p for p, peer in self.peers.items() if peer.link is None]:
            if excess <= 0:
                return
            if peer_id not in named:
                del self.peers[peer_id]
                excess -= 1

    def _emit(self, event: MeshEvent) -> None:
        try:
            self._event_send.send_nowait(event)
        except trio.WouldBlock:
            self.events_dropped += 1
        except trio.BrokenResourceError:
            pass  # nobody listens any more

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()


def is_open(link: Link | None) -> bool:
    return link is not None and link.closed is None
