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
"""

from ._handshake import ClientHandshake, ServerHandshake
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

__all__ = [
    "ENV_VAR",
    "EPOCH_FILE_NAME",
    "MAX_NODE_ID_LENGTH",
    "MIN_SECRET_BYTES",
    "SECRET_FILE_NAME",
    "ClientHandshake",
    "ClusterSecret",
    "EpochFileCorrupt",
    "Established",
    "HandshakeState",
    "LoadedSecret",
    "Refusal",
    "RefusalReason",
    "Refused",
    "ReplayCache",
    "ReplayCacheStatistics",
    "SecretError",
    "SecretSource",
    "ServerHandshake",
    "TelemetryApplyOutcome",
    "TelemetryConfig",
    "TelemetryRefusal",
    "TelemetryRefusalReason",
    "TelemetryStatistics",
    "TelemetryStore",
    "TelemetryView",
    "Waiting",
    "join_instructions",
    "load_or_create_secret",
    "next_epoch",
    "refusal_from_close",
    "sample_readings",
    "telemetry_version",
    "valid_node_id",
]
