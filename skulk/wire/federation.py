"""Frames of the federation handshake: how two nodes authenticate a new link.

The node that dials (the *client*) and the node that accepted the connection (the *server*)
prove to each other that they hold the same cluster secret, without sending it::

    client                                             server
      ClientHello(version, cluster_id, node_id, nonce)  ->
                       <-  ServerChallenge(version, cluster_id, node_id, nonce, proof)
      ClientProof(proof)                                ->
                                                    <-  Welcome()

``ServerChallenge.proof`` is an HMAC-SHA256 under the cluster secret over both nonces, both node
ids, the cluster id and the protocol version, with a label for the server direction;
``ClientProof.proof`` is the same over a label for the client direction, so a proof cannot be
reflected back. Each side checks the other's proof before trusting anything it claims. A side
that refuses the handshake closes the link with a close code (see
:mod:`skulk.federation`); there is no refusal frame. The state machines that speak this live in
:mod:`skulk.federation`; ``specs/wire.cddl`` is the normative description.

``protocol_version`` accepts any int, so that a peer of another version is refused as a version
mismatch, not as a malformed frame; :func:`sniff_protocol_version` finds the version in a body
this version cannot decode (a later version's hello may have other fields).
"""

from __future__ import annotations

import attrs

from ._cbor import loads as _strict_loads
from ._codec import DEFAULT_MAX_DEPTH
from ._errors import WireError

PROTOCOL_VERSION = 4
"""The federation protocol version; nodes of different versions never form a cluster.
2: a routed request's end (``RouteEnd``) carries one ``GenerationEnd`` record (issue 20).
3: the State has downloads (``StartDownload``, ``DownloadFailed``) and ``ReleaseModel``, cards
have Hub and imported sources, the leader answers ``PullAsk`` (issue 22).
4: placements and deletions carry idempotency keys the State remembers; data chunks are binary
data frames (a fixed header and the raw body, no CBOR), a stream's sender can abort it
(``DataAbort``), and a transfer stream's file bytes are raw data items (issue 22: peer fetch
throughput; issue 23: idempotent control asks, credit starvation)."""

HANDSHAKE_MAX_FRAME_SIZE = 4096
"""Limit on one handshake frame's CBOR body; a real one is a few hundred bytes."""

NONCE_SIZE = 32
"""Bytes in each side's nonce."""

PROOF_SIZE = 32
"""Bytes in a proof (an HMAC-SHA256 digest)."""


@attrs.frozen
class ClientHello:
    """First frame on a link, from the dialing node: who it is and its fresh nonce."""

    protocol_version: int
    cluster_id: str
    node_id: str
    nonce: bytes


@attrs.frozen
class ServerChallenge:
    """The accepting node's answer: who it is, its fresh nonce, and its proof of the secret."""

    protocol_version: int
    cluster_id: str
    node_id: str
    nonce: bytes
    proof: bytes


@attrs.frozen
class ClientProof:
    """The dialing node's proof of the secret, sent once it has checked the server's."""

    proof: bytes


@attrs.frozen
class Welcome:
    """The server checked the client's proof: the link is established on both sides."""


HandshakeFromClient = ClientHello | ClientProof
HandshakeFromServer = ServerChallenge | Welcome


def sniff_protocol_version(body: bytes | bytearray | memoryview) -> int | None:
    """The ``protocol_version`` of a handshake body that may not be a valid frame of this
    version: the int under that key if ``body`` is (strict, size-checked) CBOR for a map that
    has one, else ``None``. Never raises."""
    if len(body) > HANDSHAKE_MAX_FRAME_SIZE:
        return None
    try:
        value = _strict_loads(body, max_depth=DEFAULT_MAX_DEPTH)
    except WireError:
        return None
    if not isinstance(value, dict):
        return None
    version = value.get("protocol_version")
    if isinstance(version, int) and not isinstance(version, bool):
        return version
    return None
