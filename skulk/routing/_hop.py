"""What both ends of the remote hop share: the rpc method, the codecs, the deadlines."""

from __future__ import annotations

import math

import attrs
import trio

from skulk.federation import Link
from skulk.wire import Codec
from skulk.wire.routing import RouteAnswer, RouteAsk, RouteItem, RouteRequest

ROUTE_METHOD = "route.generate"
"""The rpc method a serving node answers with :meth:`RemoteRouting.handle_rpc`."""
ASK_METHOD = "route.ask"
"""The rpc method for one-answer requests (token counts, embeddings), answered in the rpc."""
ADMITTED = b"admitted"
"""The rpc's answer when the request was admitted (its stream follows)."""
REQUEST_CODEC: Codec[RouteRequest] = Codec(RouteRequest)
ITEM_CODEC: Codec[RouteItem] = Codec(RouteItem)
ASK_CODEC: Codec[RouteAsk] = Codec(RouteAsk)
ANSWER_CODEC: Codec[RouteAnswer] = Codec(RouteAnswer)
#: The longest text one RouteDelta carries (characters: at most 32 KiB of UTF-8, far under any
#: link frame limit); longer deltas are split, shorter ones waiting together are merged up to it.
MAX_DELTA_CHARS = 8192
#: The most log-probability entries one RouteDelta carries (each at most ~21 token ids, byte
#: strings and floats: 512 stay far under a link frame's 4 MiB).
MAX_DELTA_LOGPROBS = 512
#: The longest wait for a refused request that a serving node may ask for (seconds).
MAX_RETRY_AFTER = 3600.0


def _positive(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be finite and > 0, not {value!r}")


@attrs.frozen
class RouteTimeouts:
    """The deadlines of a routed request, in seconds.

    * ``admit``: the caller waits this for the rpc's answer, then as long again for the answer
      stream to open (the rpc is answered just before the stream's first chunk is sent).
    * ``header``: an incoming stream must name its request in its first chunk within this, or
      it is closed (the first chunk comes with the stream, so in practice a peer sending
      garbage is refused at once).
    * ``send``: one chunk may wait this long on the serving node for the caller's credit (its
      client is not reading); then the stream is given up and the generation cancelled, so a
      stalled receiver cannot hold a runner slot and an admission place for longer.
    * ``keepalive``: the serving node sends a ``RouteKeepalive`` after this much silence (a
      long prefill), which also notices a stopped stream within it while nothing else is sent.
    * ``idle``: the caller waits at most this for the next chunk; past it (the serving node
      gave the stream up, or the link is too congested to carry a keepalive) the request
      fails ``node_unreachable``. A lost link is noticed sooner: at once for a closed
      connection, within the link's liveness timeout (5 s by default) for a silent peer.
    * ``ask``: a one-answer request (``route.ask``: a token count, embeddings) waits this
      long for its answer, the serving node's work included.
    """

    admit: float = attrs.field(default=5.0, validator=_positive)
    header: float = attrs.field(default=5.0, validator=_positive)
    send: float = attrs.field(default=30.0, validator=_positive)
    keepalive: float = attrs.field(default=2.0, validator=_positive)
    idle: float = attrs.field(default=10.0, validator=_positive)
    ask: float = attrs.field(default=120.0, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.idle <= self.keepalive:
            raise ValueError(f"idle ({self.idle}) must exceed keepalive ({self.keepalive})")


async def cancel_when_closed(link: Link, target: trio.CancelScope, watch: trio.CancelScope) -> None:
    """Cancel ``target`` once ``link`` has closed (unless ``watch`` is cancelled first)."""
    with watch:
        await link.wait_closed()
        target.cancel()
