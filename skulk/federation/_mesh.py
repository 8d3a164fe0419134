"""The mesh: a node's listener and dialers, keeping one authenticated link per node pair.

Usage (under a nursery; ``start`` returns the bound listen address, port 0 allowed)::

    mesh = Mesh(node_id, secret, listen=("127.0.0.1", 52416), join=["ws://10.0.0.2:52416"])
    host, port = await nursery.start(mesh.run)
    mesh.add_peer("ws://10.0.0.3:52416")     # a peer learned of later
    link = mesh.link("node-b")               # the open Link to a peer, or None
    mesh.links()                             # rows for GET /v1/cluster/links
    async for event in mesh.events: ...      # LinkUp / LinkDown

**Listener.** A trio-websocket server on ``listen`` whose message size limit is the link's
``max_frame_size``. Each connection gets ``handshake_timeout`` for the WebSocket upgrade and as
much again for the federation handshake (server side, one :class:`ReplayCache` for all); no
frame but handshake frames is processed before it succeeds, and a refusal or a timeout closes
the connection with its close code (4001-4008) and one log line. At most ``max_handshakes``
connections are in their handshake at once; more are rejected (HTTP 503).

**Dialers.** One task per dial target (``join`` and :meth:`Mesh.add_peer`): connect (deadline
``handshake_timeout``), client handshake, run the link until it closes, then reconnect after
an exponential backoff with jitter (:meth:`RestartPolicy.backoff` from the injected RNG,
capped at ``max_backoff``; a link that stayed up ``backoff.stable_after`` seconds starts the
streak over). A dialer never gives up, except on a target that turns out to be this node
itself (``own_node_id``). While the target's peer is linked (either way) it does not dial.

**One link per pair.** A second link to a peer in the *same* direction as the open one (the
same side dialed both) is refused in the handshake with ``duplicate_node_id`` (4004). Links in
opposite directions arise when two nodes dial each other at the same time; both are
established, and both nodes apply the same rule: **the link dialed by the node with the
smaller node id (Python string order) is kept**. The smaller node closes the other link
(plain 1000 close) once it has both: it establishes the kept link last (the client's
handshake ends after the server's), so the larger node already has it when the close arrives
and never sees its peer go down. The larger node switches to the kept link at once and holds
the other as a *standby* until the close arrives (if the kept link fails first, the standby
takes over). A tie-break is counted in :class:`MeshStatistics` and logged at debug level only:
a replaced link's :class:`LinkUp` is followed by its successor's, with no :class:`LinkDown`.

Cancelling :meth:`Mesh.run` closes every link (1000, bounded by ``close_timeout``) and stops.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import random
import secrets
import ssl
from collections.abc import Awaitable, Callable, Iterable

import trio
import trio_websocket

from skulk.actors import RestartPolicy
from skulk.wire import JsonValue

from ._datastream import DataReceiver
from ._handshake import ClientHandshake, ServerHandshake
from ._link import Link
from ._linkbase import HandshakeFailed, LinkConfig
from ._linkopen import run_link
from ._linkrpc import RpcHandler
from ._machine import Established, valid_node_id
from ._meshtable import LinkTable, Target, is_open
from ._meshview import (
    DEFAULT_LISTEN,
    LinkView,
    MeshAddressError,
    MeshEvent,
    MeshStatistics,
    PeerState,
    links_json,
    parse_join_url,
)
from ._refusal import RefusalReason, quote
from ._replay import ReplayCache
from ._secret import ClusterSecret
from ._transport import WebSocketTransport
from ._websocket import RECEIVE_BUFFER, describe_failure, open_websocket

log = logging.getLogger("skulk.federation.mesh")

StreamHandler = Callable[[str, DataReceiver], Awaitable[None]]
"""``(peer id, receiver)``: serves one incoming data stream (see :class:`Mesh`)."""

_RPC_PEER: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "skulk_rpc_peer", default=None
)


def rpc_peer() -> str | None:
    """The authenticated node id of the peer whose rpc call the current task is answering,
    inside a :class:`Mesh`'s ``rpc_handler`` (and whatever it calls in the same task);
    ``None`` anywhere else. The rpc handler signature stays ``(method, body)``: a handler that
    must know its caller (to answer on a data stream, say) asks this instead of trusting a
    node id written in the request."""
    return _RPC_PEER.get()


DEFAULT_RECONNECT = RestartPolicy(
    initial_backoff=0.2, max_backoff=10.0, multiplier=2.0, jitter=0.5, reset_after=10.0
)
"""Reconnect delays: 0.2 s doubling to 10 s, each cut by up to half at random; a link that
stayed up 10 s starts over. (Only the backoff shape of the policy is used: never gives up.)"""


class Mesh:
    """Listens for peers, dials peers, keeps one authenticated link per node pair.

    ``rng`` draws the reconnect jitter (seed it for reproducible delays); ``backoff`` shapes
    the delays (:data:`DEFAULT_RECONNECT`). ``rpc_handler`` answers rpc calls on every link
    (inside it, :func:`rpc_peer` says which peer called). ``stream_handler(peer_id, receiver)``
    runs in a task of its own for every data stream a peer opens, in a nursery scoped to that
    link: the task is cancelled when the link closes. An exception in it is logged and ends
    only that stream, never the link or the mesh. However it ends, its receiver is closed for
    it (which stops the stream on the sending side unless it had ended).
    ``event_buffer`` bounds :attr:`events`: when it is full, events are dropped (counted in
    :meth:`statistics`) and :meth:`links` stays the truth. ``max_peers`` bounds the rows kept:
    beyond it, the oldest peers that are down and that no dial target names are forgotten.

    TLS (both optional, see :func:`tls_contexts`): with ``server_ssl`` the listener speaks TLS
    (peers dial it as ``wss://``); ``client_ssl`` verifies the peers dialed as ``wss://``. A
    ``wss://`` target without ``client_ssl`` is a :class:`MeshAddressError`.
    """

    def __init__(
        self,
        node_id: str,
        secret: ClusterSecret,
        *,
        listen: tuple[str, int] = DEFAULT_LISTEN,
        join: Iterable[str] = (),
        link_config: LinkConfig = LinkConfig(),  # noqa: B008 - frozen, so sharing is safe
        rpc_handler: RpcHandler | None = None,
        stream_handler: StreamHandler | None = None,
        rng: random.Random | None = None,
        backoff: RestartPolicy = DEFAULT_RECONNECT,
        max_handshakes: int = 64,
        event_buffer: int = 256,
        max_peers: int = 1024,
        server_ssl: ssl.SSLContext | None = None,
        client_ssl: ssl.SSLContext | None = None,
    ) -> None:
        if not valid_node_id(node_id):
            raise ValueError(f"invalid node id {node_id!r}: 1..128 printable characters")
        if min(max_handshakes, event_buffer, max_peers) < 1:
            raise ValueError("max_handshakes, event_buffer and max_peers must be >= 1")
        self.node_id = node_id
        self._secret = secret
        self._listen = listen
        self._config = link_config
        self._rpc_handler = rpc_handler
        self._stream_handler = stream_handler
        self._rng = rng if rng is not None else random.Random()
        self._backoff = backoff
        self._max_handshakes = max_handshakes
        self._max_peers = max_peers
        self._server_ssl = server_ssl
        self._client_ssl = client_ssl
        self._replay = ReplayCache()
        self._table = LinkTable(node_id, event_buffer=event_buffer, max_peers=max_peers)
        self._targets = self._table.targets
        self.events: trio.MemoryReceiveChannel[MeshEvent] = self._table.events
        """:class:`LinkUp` / :class:`LinkDown` as they happen (bounded; see the class doc)."""
        self._nursery: trio.Nursery | None = None
        self._bound: tuple[str, int] | None = None
        self._finished = False
        self._dials = self._dial_failures = self._accepted = self._handshaking = 0
        self._established_in = self._refused_in = self._turned_away = 0
        for url in join:
            self.add_peer(url)

    # ---- public surface ----

    @property
    def listen_address(self) -> tuple[str, int] | None:
        """The bound ``(host, port)`` while :meth:`run` runs."""
        return self._bound

    def add_peer(self, url: str) -> bool:
        """Dial ``url`` (``ws://HOST:PORT`` or ``wss://HOST:PORT``) from now on, reconnecting
        forever; ``False`` if it is a dial target already. :class:`MeshAddressError` for a bad
        URL, or a ``wss://`` one without a client TLS context; ``RuntimeError`` once :meth:`run`
        has ended, or beyond ``max_peers`` targets."""
        if self._finished:
            raise RuntimeError("the mesh has stopped")
        url = parse_join_url(url)
        if url.startswith("wss://") and self._client_ssl is None:
            raise MeshAddressError(
                f"--join {url!r}: a wss:// peer needs --tls-ca (the CA that signed its certificate)"
            )
        if url in self._targets:
            return False
        if len(self._targets) >= self._max_peers:
            raise RuntimeError(f"the mesh already dials {self._max_peers} peers")
        target = self._targets[url] = Target(url)
        if self._nursery is not None:
            self._nursery.start_soon(self._dial_loop, target)
        return True

    def link(self, peer_id: str) -> Link | None:
        """The open link to ``peer_id``, or ``None``."""
        return self._table.link(peer_id)

    def links(self) -> tuple[LinkView, ...]:
        """One row per dial target (in the order they were added), then one per peer that
        dialed us and that no target names (by peer id)."""
        return self._table.views()

    def links_json(self) -> dict[str, JsonValue]:
        """The body of ``GET /v1/cluster/links``: ``{"links": [...]}``."""
        return links_json(self.links())

    def statistics(self) -> MeshStatistics:
        return MeshStatistics(
            node_id=self.node_id,
            listen=self._bound,
            peers_up=sum(is_open(peer.link) for peer in self._table.peers.values()),
            dial_targets=len(self._targets),
            dials=self._dials,
            dial_failures=self._dial_failures,
            accepted=self._accepted,
            handshaking=self._handshaking,
            established_in=self._established_in,
            refused_in=self._refused_in,
            turned_away=self._turned_away,
            tie_breaks=self._table.tie_breaks,
            events_dropped=self._table.events_dropped,
            replay_cache=self._replay.statistics(),
        )

    async def run(
        self, *, task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen and dial until cancelled. ``task_status`` gets the bound ``(host, port)``.
        Raises ``OSError`` (in an ``ExceptionGroup``) if the address cannot be bound. A mesh
        runs once."""
        if self._finished or self._nursery is not None:
            raise RuntimeError("a mesh runs once")
        host, port = self._listen
        config = self._config
        serve = functools.partial(
            trio_websocket.serve_websocket,
            self._serve_connection,
            host,
            port,
            self._server_ssl,
            max_message_size=config.max_frame_size,
            receive_buffer_size=RECEIVE_BUFFER,
            connect_timeout=config.handshake_timeout,
            disconnect_timeout=config.close_timeout,
        )
        try:
            async with trio.open_nursery() as nursery:
                server: trio_websocket.WebSocketServer = await nursery.start(serve)
                self._bound = (host, server.port)
                self._nursery = nursery
                for target in self._targets.values():
                    nursery.start_soon(self._dial_loop, target)
                log.info(
                    "federation: node %s listening on %s:%d%s",
                    quote(self.node_id),
                    *self._bound,
                    " (TLS)" if self._server_ssl is not None else "",
                )
                task_status.started(self._bound)
        finally:
            self._finished = True
            self._nursery = None
            self._bound = None
            for target in self._targets.values():
                target.state = PeerState.DOWN

    async def _hold(self, link: Link, outbound: bool, address: str) -> float:
        """Hand ``link`` to the table, wait until it closes, release it; seconds it lived."""
        started = trio.current_time()
        try:
            self._table.adopt(link, outbound, address)
            if self._stream_handler is None:
                await link.wait_closed()
            else:
                async with trio.open_nursery() as streams:
                    streams.start_soon(self._serve_streams, link, streams)
                    await link.wait_closed()
                    streams.cancel_scope.cancel()  # the handlers live as long as the link
            return trio.current_time() - started
        finally:
            self._table.release(link)

    def _rpc_for(self, handshake: ClientHandshake | ServerHandshake) -> RpcHandler | None:
        """The rpc handler for the link ``handshake`` opens: ours, run with :func:`rpc_peer`
        set to the peer the handshake authenticated (calls arrive only once it has)."""
        handler = self._rpc_handler
        if handler is None:
            return None

        async def answer(method: str, body: bytes) -> bytes:
            state = handshake.state
            token = _RPC_PEER.set(state.peer_id if isinstance(state, Established) else None)
            try:
                return await handler(method, body)
            finally:
                _RPC_PEER.reset(token)

        return answer

    async def _serve_streams(self, link: Link, nursery: trio.Nursery) -> None:
        """Run the stream handler for each stream the peer opens (ends with the link)."""
        async for receiver in link.incoming_streams:
            nursery.start_soon(self._one_stream, link.peer_id, receiver)

    async def _one_stream(self, peer: str, receiver: DataReceiver) -> None:
        assert self._stream_handler is not None
        try:
            await self._stream_handler(peer, receiver)
        except Exception:  # a handler's bug fails its stream, never the link or the mesh
            log.exception("stream handler failed on a stream from %s", peer)
        finally:
            with trio.CancelScope(shield=True):
                await receiver.aclose()  # stops the sender unless the stream ended

    # ---- listener ----

    async def _serve_connection(self, request: trio_websocket.WebSocketRequest) -> None:
        self._accepted += 1
        config = self._config
        if self._handshaking >= self._max_handshakes:
            self._turned_away += 1
            with trio.move_on_after(config.close_timeout):
                await request.reject(503, body=b"too many federation handshakes in progress")
            return
        self._handshaking += 1
        link: Link | None = None
        try:
            async with trio.open_nursery() as nursery:
                try:
                    with trio.fail_after(config.close_timeout):
                        ws = await request.accept()
                    end = ws.remote
                    if isinstance(end, trio_websocket.Endpoint):
                        remote = f"{end.address}:{end.port}"
                    else:
                        remote = str(end)
                    handshake = ServerHandshake(
                        self._secret,
                        self.node_id,
                        replay_cache=self._replay,
                        now=trio.current_time(),
                        is_connected=functools.partial(self._table.duplicate, False),
                    )
                    start = functools.partial(
                        run_link, config=config, rpc_handler=self._rpc_for(handshake)
                    )
                    link = await nursery.start(
                        start, WebSocketTransport(ws, remote=remote), handshake
                    )
                except HandshakeFailed as exc:
                    self._refused_in += 1
                    if exc.refusal is None:  # a refusal was logged by the handshake driver
                        log.warning("federation: incoming connection %s: %s", remote, exc.detail)
                    return
                except (trio.TooSlowError, trio_websocket.ConnectionClosed) as exc:
                    log.debug("federation: incoming connection lost in its upgrade: %r", exc)
                    return
                finally:
                    self._handshaking -= 1
                self._established_in += 1
                await self._hold(link, False, remote)
        except Exception:  # a bug here must not take the listener (and every link) down
            log.exception("federation: internal error serving an incoming connection")

    # ---- dialers ----

    async def _dial_loop(self, target: Target) -> None:
        streak = 0
        first = True
        while True:
            if self._table.link(target.peer_id):
                streak = 0  # the peer is reachable
                while self._table.link(target.peer_id):
                    await self._table.wait_changed()
            if not first:
                target.state = PeerState.DOWN
                await trio.sleep(self._backoff.backoff(streak, self._rng))
                streak += 1
                if self._table.link(target.peer_id):
                    continue
            first = False
            target.state = PeerState.CONNECTING
            uptime, stop = await self._dial_once(target, quiet=streak > 0)
            if uptime >= self._backoff.stable_after:
                streak = 0
            if stop:
                target.state = PeerState.DOWN
                return

    async def _dial_once(self, target: Target, *, quiet: bool) -> tuple[float, bool]:
        """One connection to ``target``: ``(seconds our link was the peer's link, give up?)``."""
        self._dials += 1
        config = self._config
        failed: HandshakeFailed | None = None
        try:
            async with open_websocket(target.url, config, self._client_ssl) as ws:
                handshake = ClientHandshake(
                    self._secret,
                    self.node_id,
                    rng=secrets.token_bytes,
                    is_connected=functools.partial(self._table.duplicate, True),
                )
                transport = WebSocketTransport(ws, remote=target.url)
                start = functools.partial(
                    run_link, config=config, rpc_handler=self._rpc_for(handshake)
                )
                async with trio.open_nursery() as nursery:
                    try:
                        link: Link = await nursery.start(start, transport, handshake)
                    except HandshakeFailed as exc:  # logged once by the handshake driver
                        failed = exc
                    else:
                        target.peer_id = link.peer_id
                        return await self._hold(link, True, target.url), False
        except Exception as exc:  # connect refused, timeouts, rejected upgrades: retry later
            self._dial_failures += 1
            target.last_error = f"dial {target.url} failed: {describe_failure(exc)}"
            log.log(
                logging.DEBUG if quiet else logging.WARNING, "federation: %s", target.last_error
            )
            return 0.0, False
        assert failed is not None
        self._dial_failures += 1
        target.last_error = failed.detail
        if failed.refusal is None:  # a refusal was logged by the handshake driver
            log.log(logging.DEBUG if quiet else logging.WARNING, "federation: %s", failed.detail)
        refusal = failed.refusal
        return 0.0, refusal is not None and refusal.reason is RefusalReason.OWN_NODE_ID
