"""Sans-IO state machines for the federation handshake (see :mod:`skulk.wire.federation`).

:class:`ClientHandshake` runs on the node that dials, :class:`ServerHandshake` on the node that
accepted. Neither does I/O, reads a clock or logs; a driver (the WebSocket link) feeds them
what arrives and sends what they return::

    client = ClientHandshake(secret, my_id, is_connected=links.has)
    await ws.send_message(client.initial_bytes())
    while isinstance(client.state, Waiting):
        for out in client.receive_bytes(await ws.get_message()):
            await ws.send_message(out)
    # server side: ServerHandshake(secret, my_id, replay_cache=cache, now=trio.current_time())

After each call look at ``state``: :class:`Waiting` (send what was returned, read again),
:class:`Established` (``peer_id`` is authenticated; hand the link over) or :class:`Refused`
(close the WebSocket with ``refusal.close_code`` / ``refusal.close_reason`` and log
``refusal.log_line(peer)`` once). The driver enforces the handshake deadline and calls
:meth:`time_out` when it passes; it gives the link no other frame before ``Established``.

Contract for untrusted input: ``receive`` / ``receive_bytes`` never raise, whatever they are
given; anything wrong becomes a :class:`Refused` state with a typed reason. Input after the
handshake ended (either way) is ignored. Checks run in this order, so the reason names the
first problem: protocol version, frame shape (malformed), cluster id, replay (server), proof;
identity checks (own node id, duplicate node id) run only once the peer's proof verified, so
those reasons always describe an authenticated peer.
"""

from __future__ import annotations

import hmac
import secrets

from skulk.wire.federation import (
    PROOF_SIZE,
    PROTOCOL_VERSION,
    ClientHello,
    ClientProof,
    HandshakeFromClient,
    HandshakeFromServer,
    ServerChallenge,
    Welcome,
)

from ._machine import (
    CLIENT_LABEL,
    FROM_CLIENT,
    FROM_SERVER,
    SERVER_LABEL,
    Binding,
    Established,
    IsConnected,
    Machine,
    Rng,
    Waiting,
    is_bytes,
    never_connected,
)
from ._refusal import RefusalReason
from ._replay import ReplayCache
from ._secret import ClusterSecret


class ClientHandshake(Machine):
    """The dialing side. Sends :meth:`initial` first, then answers the server's challenge and
    waits for ``Welcome``.

    ``rng`` supplies the nonce (drawn here, so :meth:`initial` is fixed);
    ``is_connected(node_id)`` refuses a second link to an already-linked node
    (``DUPLICATE_NODE_ID``); ``protocol_version`` is for tests of mixed versions.
    """

    _role = "server"

    def __init__(
        self,
        secret: ClusterSecret,
        node_id: str,
        *,
        rng: Rng = secrets.token_bytes,
        is_connected: IsConnected = never_connected,
        protocol_version: int = PROTOCOL_VERSION,
    ) -> None:
        super().__init__(
            secret,
            node_id,
            expecting=ServerChallenge,
            rng=rng,
            is_connected=is_connected,
            protocol_version=protocol_version,
        )
        self._hello = ClientHello(
            protocol_version=protocol_version,
            cluster_id=secret.cluster_id,
            node_id=node_id,
            nonce=self._nonce(),
        )

    def initial(self) -> ClientHello:
        """The first frame of the link (the same value every call)."""
        return self._hello

    def initial_bytes(self) -> bytes:
        """:meth:`initial`, encoded: the first WebSocket message to send."""
        return FROM_CLIENT.encode(self._hello)

    def receive_bytes(self, data: bytes | bytearray | memoryview | str) -> list[bytes]:
        """Feed one WebSocket message; returns the messages to send (encoded frames)."""
        if not isinstance(self._state, Waiting):
            return []
        frame = self._decode(FROM_SERVER, data)
        if frame is None:
            return []
        return [FROM_CLIENT.encode(out) for out in self.receive(frame)]

    def receive(self, frame: HandshakeFromServer) -> list[HandshakeFromClient]:
        """Feed one decoded frame; returns the frames to send."""
        if not isinstance(self._state, Waiting):
            return []
        if self._expecting is ServerChallenge and isinstance(frame, ServerChallenge):
            return self._on_challenge(frame)
        if self._expecting is Welcome and isinstance(frame, Welcome):
            assert self._peer_id is not None
            self._state = Established(self._peer_id)
            return []
        self._unexpected(frame)
        return []

    def _on_challenge(self, frame: ServerChallenge) -> list[HandshakeFromClient]:
        if not self._check_intro(frame, is_bytes(frame.proof, PROOF_SIZE)):
            return []
        bound = Binding(
            version=self._version,
            cluster_id=self.cluster_id,
            client_id=self._node_id,
            server_id=frame.node_id,
            client_nonce=self._hello.nonce,
            server_nonce=frame.nonce,
        )
        if not hmac.compare_digest(bound.proof(self._secret, SERVER_LABEL), frame.proof):
            self._refuse(
                RefusalReason.WRONG_SECRET,
                "the server's proof does not verify: it does not hold this cluster's secret",
            )
            return []
        if not self._check_identity():
            return []
        self._expect(Welcome)
        return [ClientProof(proof=bound.proof(self._secret, CLIENT_LABEL))]


class ServerHandshake(Machine):
    """The accepting side: waits for ``ClientHello``, challenges, checks ``ClientProof``,
    sends ``Welcome``.

    ``replay_cache`` is shared by all of a node's server handshakes; ``now`` is the driver's
    clock reading when the connection was accepted (the handshake deadline keeps it close to
    the time the hello arrives). ``rng`` and ``is_connected`` as for :class:`ClientHandshake`.
    """

    _role = "client"

    def __init__(
        self,
        secret: ClusterSecret,
        node_id: str,
        *,
        replay_cache: ReplayCache,
        now: float,
        rng: Rng = secrets.token_bytes,
        is_connected: IsConnected = never_connected,
        protocol_version: int = PROTOCOL_VERSION,
    ) -> None:
        super().__init__(
            secret,
            node_id,
            expecting=ClientHello,
            rng=rng,
            is_connected=is_connected,
            protocol_version=protocol_version,
        )
        self._replay_cache = replay_cache
        self._now = now
        self._expected_proof = b""

    def receive_bytes(self, data: bytes | bytearray | memoryview | str) -> list[bytes]:
        """Feed one WebSocket message; returns the messages to send (encoded frames)."""
        if not isinstance(self._state, Waiting):
            return []
        frame = self._decode(FROM_CLIENT, data)
        if frame is None:
            return []
        return [FROM_SERVER.encode(out) for out in self.receive(frame)]

    def receive(self, frame: HandshakeFromClient) -> list[HandshakeFromServer]:
        """Feed one decoded frame; returns the frames to send."""
        if not isinstance(self._state, Waiting):
            return []
        if self._expecting is ClientHello and isinstance(frame, ClientHello):
            return self._on_hello(frame)
        if self._expecting is ClientProof and isinstance(frame, ClientProof):
            return self._on_proof(frame)
        self._unexpected(frame)
        return []

    def _on_hello(self, frame: ClientHello) -> list[HandshakeFromServer]:
        if not self._check_intro(frame, True):
            return []
        if not self._replay_cache.check_and_remember(frame.nonce, self._now):
            self._refuse(
                RefusalReason.REPLAYED,
                "the client's nonce was used in a recent handshake: a replayed handshake",
            )
            return []
        bound = Binding(
            version=self._version,
            cluster_id=self.cluster_id,
            client_id=frame.node_id,
            server_id=self._node_id,
            client_nonce=frame.nonce,
            server_nonce=self._nonce(),
        )
        self._expected_proof = bound.proof(self._secret, CLIENT_LABEL)
        self._expect(ClientProof)
        challenge = ServerChallenge(
            protocol_version=self._version,
            cluster_id=self.cluster_id,
            node_id=self._node_id,
            nonce=bound.server_nonce,
            proof=bound.proof(self._secret, SERVER_LABEL),
        )
        return [challenge]

    def _on_proof(self, frame: ClientProof) -> list[HandshakeFromServer]:
        if not is_bytes(frame.proof, PROOF_SIZE):
            self._refuse(RefusalReason.MALFORMED, f"the client's proof must be {PROOF_SIZE} bytes")
        elif not hmac.compare_digest(self._expected_proof, frame.proof):
            self._refuse(
                RefusalReason.WRONG_SECRET,
                "the client's proof does not verify: it does not hold this cluster's secret",
            )
        elif self._check_identity():
            assert self._peer_id is not None
            self._state = Established(self._peer_id)
            return [Welcome()]
        return []
