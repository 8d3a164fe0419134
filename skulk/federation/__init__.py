"""Federation: authenticated links between the nodes of a cluster, and the mesh that keeps them.

The cluster secret every node proves knowledge of::

    from skulk.federation import load_or_create_secret, join_instructions

The mesh: a listener and dialers keeping one authenticated link per node pair::

    from skulk.federation import Mesh, LinkView

    mesh = Mesh(node_id, secret, listen=("127.0.0.1", 0), join=["ws://10.0.0.2:52416"])
    host, port = await nursery.start(mesh.run)
    link = mesh.link("node-b")            # the open Link to a peer, or None
    reply = await link.call("method", b"body", timeout=5.0)
    mesh.links_json()                     # the body of GET /v1/cluster/links

``Mesh(..., rpc_handler=handler)`` answers every link's rpc calls (inside it, :func:`rpc_peer`
is the calling peer's node id); ``Mesh(..., stream_handler=handler)`` runs
``await handler(peer_id, receiver)`` for every data stream a peer opens. Optional TLS
(``wss://``): ``server_ssl, client_ssl = tls_contexts(cert, key, ca)``. See
:mod:`skulk.federation._mesh` for the listener, dialers, reconnects and the tie-break.

A :class:`Link` (topics raft, rpc, data, telemetry; heartbeats; typed failures such as
:class:`RpcFailed`, :class:`RpcTimeout`, :class:`PeerUnreachable`) can also run over any
message transport, with the sans-IO handshake (:class:`ClientHandshake`,
:class:`ServerHandshake`) in front::

    link = await nursery.start(run_link, StreamTransport(stream), handshake)

See :mod:`skulk.federation._link` for the contract, :mod:`skulk.federation._handshake` for the
handshake, and :mod:`skulk.wire.link` / :mod:`skulk.wire.federation` for the frames.

Requests waiting for the data stream a peer opens to answer them, each claimed by the request
id in its header (for a protocol whose stream handler is ``claims.handle_stream``)::

    async with claims.expect(request_id, peer) as claim:   # claims = StreamClaims(...)
        ...  # the rpc that asks for the stream
        receiver = await claim.wait(link, timeout)

See :mod:`skulk.federation._claims` for the refusals and who closes a claimed stream.
"""

from ._claims import StreamClaim, StreamClaims
from ._datastream import DataReceiver, DataSender
from ._handshake import ClientHandshake, ServerHandshake
from ._link import Link
from ._linkbase import (
    HandshakeFailed,
    LinkBusy,
    LinkClosed,
    LinkCloseReason,
    LinkConfig,
    LinkError,
    PeerUnreachable,
    RpcFailed,
    RpcTimeout,
    StreamAborted,
    StreamStarved,
    StreamStopped,
)
from ._linkopen import run_link
from ._machine import Established, Refused, Waiting
from ._mesh import Mesh, rpc_peer
from ._meshview import (
    LinkUp,
    LinkView,
    MeshAddressError,
    PeerState,
    parse_join_url,
    parse_listen_address,
)
from ._refusal import RefusalReason, quote
from ._replay import ReplayCache
from ._secret import (
    ClusterSecret,
    SecretError,
    SecretSource,
    join_instructions,
    load_or_create_secret,
)
from ._tls import tls_contexts
from ._transport import (
    StreamTransport,
    TransportClosed,
    WebSocketTransport,
    memory_transport_pair,
)

__all__ = [
    "ClientHandshake",
    "ClusterSecret",
    "DataReceiver",
    "DataSender",
    "Established",
    "HandshakeFailed",
    "Link",
    "LinkBusy",
    "LinkCloseReason",
    "LinkClosed",
    "LinkConfig",
    "LinkError",
    "LinkUp",
    "LinkView",
    "Mesh",
    "MeshAddressError",
    "PeerState",
    "PeerUnreachable",
    "RefusalReason",
    "Refused",
    "ReplayCache",
    "RpcFailed",
    "RpcTimeout",
    "SecretError",
    "SecretSource",
    "ServerHandshake",
    "StreamAborted",
    "StreamClaim",
    "StreamClaims",
    "StreamStarved",
    "StreamStopped",
    "StreamTransport",
    "TransportClosed",
    "Waiting",
    "WebSocketTransport",
    "join_instructions",
    "load_or_create_secret",
    "memory_transport_pair",
    "parse_join_url",
    "parse_listen_address",
    "quote",
    "rpc_peer",
    "run_link",
    "tls_contexts",
]
