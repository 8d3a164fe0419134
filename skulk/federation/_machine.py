"""What the two handshake machines share: states, the proof binding, the base machine.

See :mod:`skulk.federation._handshake` for the protocol and the driver contract.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import attrs

from skulk.wire import Codec, WireError
from skulk.wire.federation import (
    HANDSHAKE_MAX_FRAME_SIZE,
    NONCE_SIZE,
    ClientHello,
    HandshakeFromClient,
    HandshakeFromServer,
    ServerChallenge,
    sniff_protocol_version,
)

from ._refusal import Refusal, RefusalReason, make_refusal, quote
from ._secret import ClusterSecret

MAX_NODE_ID_LENGTH = 128
"""Node ids are 1..128 printable characters."""

SERVER_LABEL = b"skulk/federation/handshake/v1/server-proof"
CLIENT_LABEL = b"skulk/federation/handshake/v1/client-proof"

FROM_CLIENT: Codec[HandshakeFromClient] = Codec(
    HandshakeFromClient, max_frame_size=HANDSHAKE_MAX_FRAME_SIZE
)
FROM_SERVER: Codec[HandshakeFromServer] = Codec(
    HandshakeFromServer, max_frame_size=HANDSHAKE_MAX_FRAME_SIZE
)

Rng = Callable[[int], bytes]
"""``rng(n)`` returns ``n`` random bytes (``secrets.token_bytes``; a seeded one in tests)."""
F = TypeVar("F")

IsConnected = Callable[[str], bool]
"""``is_connected(node_id)``: does this node already have a live link to ``node_id``?"""


@attrs.frozen
class Waiting:
    """The handshake goes on; ``expecting`` names the frame the machine waits for."""

    expecting: str


@attrs.frozen
class Established:
    """The peer proved it holds the cluster secret; ``peer_id`` is its node id."""

    peer_id: str


@attrs.frozen
class Refused:
    """The handshake failed; close the link as ``refusal`` says."""

    refusal: Refusal


HandshakeState = Waiting | Established | Refused


def never_connected(node_id: str) -> bool:
    return False


def valid_node_id(node_id: object) -> bool:
    """Whether ``node_id`` is acceptable on the wire: a ``str`` of 1..128 printable
    characters (so it is valid UTF-8 and safe in one log line)."""
    return (
        isinstance(node_id, str)
        and 0 < len(node_id) <= MAX_NODE_ID_LENGTH
        and node_id.isprintable()
    )


def is_bytes(value: object, size: int) -> bool:
    return isinstance(value, bytes) and len(value) == size


@attrs.frozen
class Binding:
    """Everything a proof binds: the version, the cluster, both ids and both nonces."""

    version: int
    cluster_id: str
    client_id: str
    server_id: str
    client_nonce: bytes
    server_nonce: bytes

    def proof(self, secret: ClusterSecret, label: bytes) -> bytes:
        """HMAC-SHA256 over the direction ``label`` and every field, each length-prefixed so
        that no two different transcripts have the same bytes."""
        parts = (
            label,
            str(self.version).encode("ascii"),
            self.cluster_id.encode("utf-8"),
            self.client_id.encode("utf-8"),
            self.server_id.encode("utf-8"),
            self.client_nonce,
            self.server_nonce,
        )
        return secret.mac(b"".join(len(p).to_bytes(4, "big") + p for p in parts))


class Machine:
    """What both sides share: identity, state, the checks on the peer's first frame, refusals."""

    _role: str  # the peer's role, for messages

    def __init__(
        self,
        secret: ClusterSecret,
        node_id: str,
        *,
        expecting: type,
        rng: Rng,
        is_connected: IsConnected,
        protocol_version: int,
    ) -> None:
        if not valid_node_id(node_id):
            raise ValueError(f"invalid node id {node_id!r}: 1..128 printable characters")
        self._secret = secret
        self._node_id = node_id
        self._rng = rng
        self._is_connected = is_connected
        self._version = protocol_version
        self._expecting = expecting
        self._state: HandshakeState = Waiting(expecting.__name__)
        self._peer_id: str | None = None  # as claimed; authenticated once Established

    @property
    def state(self) -> HandshakeState:
        """:class:`Waiting`, :class:`Established` or :class:`Refused`."""
        return self._state

    @property
    def node_id(self) -> str:
        return self._node_id

    @property
    def cluster_id(self) -> str:
        return self._secret.cluster_id

    def time_out(self) -> Refusal | None:
        """The driver's handshake deadline passed: refuse with ``HANDSHAKE_TIMEOUT`` (returned)
        unless the handshake already ended (``None``)."""
        if not isinstance(self._state, Waiting):
            return None
        expecting = self._state.expecting
        return self._refuse(
            RefusalReason.HANDSHAKE_TIMEOUT,
            f"no {expecting} from the {self._role} before the handshake deadline",
        )

    def _expect(self, frame_type: type) -> None:
        self._expecting = frame_type
        self._state = Waiting(frame_type.__name__)

    def _nonce(self) -> bytes:
        nonce = self._rng(NONCE_SIZE)
        if not is_bytes(nonce, NONCE_SIZE):
            raise ValueError(f"rng must return {NONCE_SIZE} bytes")
        return nonce

    def _refuse(
        self, reason: RefusalReason, detail: str, *, close_reason: str | None = None
    ) -> Refusal:
        refusal = make_refusal(
            reason, detail, peer_node_id=self._peer_id, close_reason=close_reason
        )
        self._state = Refused(refusal)
        return refusal

    def _refuse_version(self, theirs: int) -> None:
        self._refuse(
            RefusalReason.VERSION_MISMATCH,
            f"the {self._role} speaks federation protocol version {theirs}, this node"
            f" version {self._version}: run the same Skulk version on every node",
            close_reason=f"version_mismatch: this node speaks federation protocol {self._version}",
        )

    def _refuse_undecodable(self, data: bytes | bytearray | memoryview | str, error: str) -> None:
        """Bytes our codec refused: a version mismatch if they carry another version (a later
        version's frames may differ), else malformed."""
        version = None if isinstance(data, str) else sniff_protocol_version(data)
        if version is not None and version != self._version:
            self._refuse_version(version)
        else:
            self._refuse(
                RefusalReason.MALFORMED,
                f"expected {self._expecting.__name__} from the {self._role}: {error}",
            )

    def _decode(self, codec: Codec[F], data: bytes | bytearray | memoryview | str) -> F | None:
        """The frame in one message, or ``None`` after refusing it."""
        if isinstance(data, str):
            self._refuse_undecodable(data, "a text message (handshake frames are binary)")
            return None
        try:
            return codec.decode(data)
        except WireError as exc:
            self._refuse_undecodable(data, str(exc))
            return None

    def _unexpected(self, frame: object) -> None:
        self._refuse(
            RefusalReason.MALFORMED,
            f"expected {self._expecting.__name__} from the {self._role},"
            f" got {type(frame).__name__}",
        )

    def _check_intro(self, frame: ClientHello | ServerChallenge, sizes_ok: bool) -> bool:
        """Checks on the peer's first frame, before any proof: version, shape, cluster id."""
        version, node_id = frame.protocol_version, frame.node_id
        if valid_node_id(node_id):
            assert isinstance(node_id, str)
            self._peer_id = node_id  # claimed, for log lines from here on
        if not isinstance(version, int) or isinstance(version, bool):
            self._unexpected(frame)
        elif version != self._version:
            self._refuse_version(version)
        elif self._peer_id is None:
            self._refuse(
                RefusalReason.MALFORMED,
                f"the {self._role}'s node id is not 1..{MAX_NODE_ID_LENGTH} printable characters",
            )
        elif not (sizes_ok and is_bytes(frame.nonce, NONCE_SIZE)):
            self._refuse(
                RefusalReason.MALFORMED,
                f"the {self._role}'s nonce and proof must be {NONCE_SIZE} bytes each",
            )
        elif frame.cluster_id != self.cluster_id:
            theirs = frame.cluster_id if isinstance(frame.cluster_id, str) else None
            self._refuse(
                RefusalReason.WRONG_CLUSTER,
                f"the {self._role} is in cluster {quote(theirs)}, this node in"
                f" {self.cluster_id!r}: the nodes have different cluster secrets",
            )
        return isinstance(self._state, Waiting)

    def _check_identity(self) -> bool:
        """After the peer's proof verified: refuse our own id or an already-linked id."""
        peer = self._peer_id
        assert peer is not None
        if peer == self._node_id:
            self._refuse(
                RefusalReason.OWN_NODE_ID,
                f"the {self._role} has this node's own id {quote(peer)}: it dialed itself, or"
                " two nodes share a node id (a copied data dir?)",
            )
        elif self._is_connected(peer):
            self._refuse(
                RefusalReason.DUPLICATE_NODE_ID,
                f"node {quote(peer)} is already connected; a second link is refused",
            )
        return isinstance(self._state, Waiting)
