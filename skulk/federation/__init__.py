"""Federation: authenticated links between the nodes of a cluster.

The handshake (sans-IO; a link driver feeds it WebSocket messages)::

    from skulk.federation import ClientHandshake, ServerHandshake, ReplayCache
    from skulk.federation import Waiting, Established, Refused

and the cluster secret it proves knowledge of::

    from skulk.federation import load_or_create_secret, join_instructions

See :mod:`skulk.federation._handshake` for the driver contract and :mod:`skulk.wire.federation`
for the frames.

The telemetry plane's core (sans-IO; a gossip driver feeds it pushes and digests)::

    from skulk.federation import TelemetryStore, TelemetryView, next_epoch, sample_readings

See :mod:`skulk.federation._telemetry` for the merge, expiry and cap rules and
:mod:`skulk.wire.telemetry` for the frames.

Authenticated links over a message transport (a WebSocket, or length-prefixed frames over any
Trio stream), with the handshake, heartbeats and the raft / rpc / data / telemetry topics::

    from skulk.federation import run_link, open_link, Link, LinkConfig, WebSocketTransport

    link = await nursery.start(run_link, WebSocketTransport(ws), handshake)
    reply = await link.call("method", b"body", timeout=5.0)

See :mod:`skulk.federation._link` for the contract and :mod:`skulk.wire.link` for the frames.

The mesh: a listener and dialers keeping one authenticated link per node pair::

    from skulk.federation import Mesh, LinkView, LinkUp, LinkDown

    mesh = Mesh(node_id, secret, listen=("127.0.0.1", 0), join=["ws://10.0.0.2:52416"])
    host, port = await nursery.start(mesh.run)
    mesh.links_json()  # the body of GET /v1/cluster/links

See :mod:`skulk.federation._mesh` for the listener, dialers, reconnects and the tie-break.
``Mesh(..., stream_handler=handler)`` runs ``await handler(peer_id, receiver)`` for every data
stream a peer opens (for as long as its link lives); inside the ``rpc_handler``,
:func:`rpc_peer` is the calling peer's node id.
Optional TLS (``wss://``): ``server_ssl, client_ssl = tls_contexts(cert, key, ca)``, passed to
``Mesh(..., server_ssl=..., client_ssl=...)``; see :mod:`skulk.federation._tls`.

The telemetry gossip driver: a :class:`TelemetryStore` kept in sync over a mesh's links (it is
the single consumer of ``mesh.events``)::

    from skulk.federation import TelemetryGossip, GossipStatistics

    gossip = TelemetryGossip(mesh, store, lambda: sample_readings(node_id, listen, api))
    await nursery.start(gossip.run)
    gossip.nodes_json()  # the body of GET /v1/cluster/nodes

See :mod:`skulk.federation._gossip` for the rounds, the replies and what is skipped.
:class:`FetchBoard` collects this node's weight fetches in progress for its readings.

Requests waiting for the data stream a peer opens to answer them, each claimed by the request
id in its header (for a protocol whose stream handler is ``claims.handle_stream``)::

    from skulk.federation import StreamClaims, StreamClaim

    async with claims.expect(request_id, peer) as claim:
        ...  # the rpc that asks for the stream
        receiver = await claim.wait(link, timeout)

See :mod:`skulk.federation._claims` for the refusals and who closes a claimed stream.
"""

from ._claims import StreamClaim, StreamClaims, StreamClaimsStatistics, StreamHeader
from ._datastream import DataReceiver, DataSender
from ._fetchboard import FetchBoard, FetchBoardStatistics
from ._gossip import GossipStatistics, TelemetryGossip
from ._handshake import ClientHandshake, ServerHandshake
from ._link import Link, RpcHandler
from ._linkbase import (
    HandshakeFailed,
    LinkBusy,
    LinkClosed,
    LinkCloseReason,
    LinkConfig,
    LinkError,
    LinkState,
    LinkStatistics,
    PeerUnreachable,
    RpcFailed,
    RpcTimeout,
    StreamStopped,
)
from ._linkopen import open_link, run_link
from ._machine import (
    MAX_NODE_ID_LENGTH,
    Established,
    HandshakeState,
    Refused,
    Waiting,
    valid_node_id,
)
from ._mesh import DEFAULT_RECONNECT, Mesh, StreamHandler, rpc_peer
from ._meshview import (
    DEFAULT_LISTEN,
    LinkDown,
    LinkUp,
    LinkView,
    MeshAddressError,
    MeshEvent,
    MeshStatistics,
    PeerState,
    links_json,
    parse_join_url,
    parse_listen_address,
)
from ._readings import cap_memory, sample_readings
from ._refusal import Refusal, RefusalReason, refusal_from_close
from ._replay import ReplayCache, ReplayCacheStatistics
from ._secret import (
    ENV_VAR,
    MIN_SECRET_BYTES,
    SECRET_FILE_NAME,
    ClusterSecret,
    LoadedSecret,
    SecretError,
    SecretSource,
    join_instructions,
    load_or_create_secret,
)
from ._telemetry import (
    EPOCH_FILE_NAME,
    EpochFileCorrupt,
    TelemetryApplyOutcome,
    TelemetryConfig,
    TelemetryRefusal,
    TelemetryRefusalReason,
    TelemetryStatistics,
    TelemetryStore,
    TelemetryView,
    next_epoch,
    telemetry_version,
)
from ._tls import TlsConfigError, tls_contexts
from ._transport import (
    MessageTooLarge,
    MessageTransport,
    StreamTransport,
    TransportClosed,
    TransportError,
    TransportViolation,
    WebSocketTransport,
    memory_transport_pair,
)

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_RECONNECT",
    "ENV_VAR",
    "EPOCH_FILE_NAME",
    "MAX_NODE_ID_LENGTH",
    "MIN_SECRET_BYTES",
    "SECRET_FILE_NAME",
    "ClientHandshake",
    "ClusterSecret",
    "DataReceiver",
    "DataSender",
    "EpochFileCorrupt",
    "Established",
    "FetchBoard",
    "FetchBoardStatistics",
    "GossipStatistics",
    "HandshakeFailed",
    "HandshakeState",
    "Link",
    "LinkBusy",
    "LinkCloseReason",
    "LinkClosed",
    "LinkConfig",
    "LinkDown",
    "LinkError",
    "LinkState",
    "LinkStatistics",
    "LinkUp",
    "LinkView",
    "LoadedSecret",
    "Mesh",
    "MeshAddressError",
    "MeshEvent",
    "MeshStatistics",
    "MessageTooLarge",
    "MessageTransport",
    "PeerState",
    "PeerUnreachable",
    "Refusal",
    "RefusalReason",
    "Refused",
    "ReplayCache",
    "ReplayCacheStatistics",
    "RpcFailed",
    "RpcHandler",
    "RpcTimeout",
    "SecretError",
    "SecretSource",
    "ServerHandshake",
    "StreamClaim",
    "StreamClaims",
    "StreamClaimsStatistics",
    "StreamHandler",
    "StreamHeader",
    "StreamStopped",
    "StreamTransport",
    "TelemetryApplyOutcome",
    "TelemetryConfig",
    "TelemetryGossip",
    "TelemetryRefusal",
    "TelemetryRefusalReason",
    "TelemetryStatistics",
    "TelemetryStore",
    "TelemetryView",
    "TlsConfigError",
    "TransportClosed",
    "TransportError",
    "TransportViolation",
    "Waiting",
    "WebSocketTransport",
    "cap_memory",
    "join_instructions",
    "links_json",
    "load_or_create_secret",
    "memory_transport_pair",
    "next_epoch",
    "open_link",
    "parse_join_url",
    "parse_listen_address",
    "refusal_from_close",
    "rpc_peer",
    "run_link",
    "sample_readings",
    "telemetry_version",
    "tls_contexts",
    "valid_node_id",
]
