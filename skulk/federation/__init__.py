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
"""

from ._datastream import DataReceiver, DataSender
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
from ._readings import sample_readings
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
    "HandshakeFailed",
    "HandshakeState",
    "Link",
    "LinkBusy",
    "LinkCloseReason",
    "LinkClosed",
    "LinkConfig",
    "LinkError",
    "LinkState",
    "LinkStatistics",
    "LoadedSecret",
    "MessageTooLarge",
    "MessageTransport",
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
    "StreamStopped",
    "StreamTransport",
    "TelemetryApplyOutcome",
    "TelemetryConfig",
    "TelemetryRefusal",
    "TelemetryRefusalReason",
    "TelemetryStatistics",
    "TelemetryStore",
    "TelemetryView",
    "TransportClosed",
    "TransportError",
    "TransportViolation",
    "Waiting",
    "WebSocketTransport",
    "join_instructions",
    "load_or_create_secret",
    "memory_transport_pair",
    "next_epoch",
    "open_link",
    "refusal_from_close",
    "run_link",
    "sample_readings",
    "telemetry_version",
    "valid_node_id",
]
