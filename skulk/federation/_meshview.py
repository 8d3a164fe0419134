"""What a :class:`~skulk.federation.Mesh`'s users see: link views, events, statistics, and the
parsing of ``--listen`` / ``--join`` addresses.

The mesh itself is in :mod:`skulk.federation._mesh`.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from urllib.parse import urlsplit

import attrs

from skulk.wire import JsonValue

from ._link import Link
from ._replay import ReplayCacheStatistics

DEFAULT_LISTEN = ("127.0.0.1", 52416)
"""``--listen`` when none is given."""


class PeerState(enum.Enum):
    """The state of one row of :meth:`Mesh.links`; the value is what ``/v1/cluster/links``
    shows."""

    UP = "up"
    """An authenticated link to the peer is open (whichever side dialed it)."""
    CONNECTING = "connecting"
    """No link; a dial (connect, WebSocket upgrade, handshake) is in progress."""
    DOWN = "down"
    """No link and no dial in progress: waiting out a reconnect delay, a peer that only ever
    dialed us and went away, or a dial target given up on (it is this node itself)."""


@attrs.frozen
class LinkView:
    """One row of :meth:`Mesh.links`: a dial target (``address`` is its ``ws://`` URL), or a peer
    that dialed us and that no dial target names (``address`` is the connection's remote
    ``host:port``).

    ``peer_id`` is ``None`` until a handshake with the address succeeded. ``rtt_ms``, bytes and
    frames are those of the current link (of the latest one while not up; zero before any).
    ``last_error`` is the latest failure (refusal, connect error, link error), kept after the
    link recovers. ``outbound`` says who dialed the current link: ``True`` this node, ``False``
    the peer, ``None`` while not up.
    """

    peer_id: str | None
    address: str
    state: PeerState
    rtt_ms: float | None
    bytes_in: int
    bytes_out: int
    frames_in: int
    frames_out: int
    last_error: str | None
    outbound: bool | None

    def to_json(self) -> dict[str, JsonValue]:
        """The row as ``/v1/cluster/links`` shows it."""
        return {
            "peer_id": self.peer_id,
            "address": self.address,
            "state": self.state.value,
            "rtt_ms": self.rtt_ms,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
            "frames_in": self.frames_in,
            "frames_out": self.frames_out,
            "last_error": self.last_error,
        }


def links_json(views: Sequence[LinkView]) -> dict[str, JsonValue]:
    """``{"links": [...]}``, the body of ``GET /v1/cluster/links``."""
    return {"links": [view.to_json() for view in views]}


@attrs.frozen(eq=False)
class LinkUp:
    """A link to ``peer_id`` is up. Repeats without a :class:`LinkDown` in between when the
    tie-break replaces the link: the latest ``link`` is the current one."""

    peer_id: str
    link: Link


@attrs.frozen
class LinkDown:
    """The link to ``peer_id`` is gone and no other replaced it; ``last_error`` says why
    (``None`` for a clean close)."""

    peer_id: str
    last_error: str | None


MeshEvent = LinkUp | LinkDown


@attrs.frozen
class MeshStatistics:
    """A snapshot of a mesh (see :meth:`Mesh.statistics`)."""

    node_id: str
    #: the bound ``(host, port)`` while running, else ``None``
    listen: tuple[str, int] | None
    peers_up: int
    dial_targets: int
    #: dial attempts started, and those that ended without a link
    dials: int
    dial_failures: int
    #: incoming connections accepted, in their handshake now, established, refused
    accepted: int
    handshaking: int
    established_in: int
    refused_in: int
    #: incoming connections turned away because ``max_handshakes`` were in progress
    turned_away: int
    #: links closed by the one-link-per-pair tie-break
    tie_breaks: int
    #: events not delivered because the event channel was full
    events_dropped: int
    replay_cache: ReplayCacheStatistics


class MeshAddressError(ValueError):
    """A ``--listen`` or ``--join`` address that cannot be used; the message says why."""


def parse_join_url(url: str) -> str:
    """A ``--join`` URL, checked and normalised (``ws://host:port`` or ``wss://host:port``, plus
    its path, if any). The port is required. (Whether a ``wss://`` URL can be dialed, which needs
    ``--tls-ca``, is the mesh's check.)
    """
    parts = urlsplit(url.strip())
    if parts.scheme not in ("ws", "wss"):
        raise MeshAddressError(f"--join {url!r}: expected ws://HOST:PORT or wss://HOST:PORT")
    try:
        port = parts.port
    except ValueError:
        raise MeshAddressError(f"--join {url!r}: the port is not a number in 0..65535") from None
    if not parts.hostname or port is None or port == 0:
        raise MeshAddressError(f"--join {url!r}: expected {parts.scheme}://HOST:PORT with a port")
    if parts.query or parts.fragment or parts.username or parts.password:
        raise MeshAddressError(f"--join {url!r}: no user, query or fragment allowed")
    path = parts.path.rstrip("/")
    return f"{parts.scheme}://{parts.netloc}{path}"


def parse_listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) as ``(host, port)``; port 0 picks a free one."""
    host, sep, port_text = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise MeshAddressError(f"--listen {text!r}: expected HOST:PORT")
    return host, int(port_text)
