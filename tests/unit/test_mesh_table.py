"""The mesh's link table (no I/O): what its views say of a peer's link."""

from __future__ import annotations

from types import SimpleNamespace

from skulk.federation._meshtable import LinkTable
from skulk.federation._meshview import PeerState


class FakeLink:
    """What the table reads of a link."""

    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.remote = "127.0.0.1:5"
        self.closed: object | None = None
        self.stats = SimpleNamespace(
            rtt_ms=0.5, bytes_in=10, bytes_out=20, frames_in=1, frames_out=3, last_error=None
        )

    def statistics(self) -> SimpleNamespace:
        return self.stats


def test_a_link_that_closed_shows_its_own_statistics_and_error_until_released() -> None:
    table = LinkTable("me", event_buffer=8, max_peers=8)
    link = FakeLink("peer")
    table.adopt(link, outbound=False, address="127.0.0.1:5")  # type: ignore[arg-type]
    (view,) = table.views()
    assert view.state is PeerState.UP and view.frames_out == 3 and view.last_error is None
    # It closed (liveness): the table hears of it only when the link's task releases it, a
    # few scheduler steps later; until then the view must already say why, with its counters.
    link.closed = object()
    link.stats.last_error = "liveness_timeout: nothing received for 1.0 s"
    link.stats.frames_out = 4
    (view,) = table.views()
    assert view.state is PeerState.DOWN
    assert view.last_error == "liveness_timeout: nothing received for 1.0 s"
    assert view.frames_out == 4
    table.release(link)  # type: ignore[arg-type]
    (view,) = table.views()
    assert view.state is PeerState.DOWN and view.frames_out == 4
    assert view.last_error == "liveness_timeout: nothing received for 1.0 s"
