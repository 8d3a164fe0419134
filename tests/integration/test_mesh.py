"""The federation mesh over real loopback WebSockets: meshes in one Trio run, port 0 each."""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable

import pytest
import trio
import trio_websocket

from skulk.federation import (
    ClientHandshake,
    ClusterSecret,
    Established,
    LinkUp,
    LinkView,
    Mesh,
    MeshAddressError,
    PeerState,
    Waiting,
    WebSocketTransport,
    parse_join_url,
    parse_listen_address,
)
from skulk.federation._meshview import LinkDown, MeshEvent
from skulk.wire.federation import PROTOCOL_VERSION
from tests._doubles import LINK_BACKOFF as BACKOFF
from tests._doubles import LINK_CONFIG as CONFIG
from tests._doubles import OTHER_SECRET, SECRET

SLACK = 2.0  # on top of a configured timeout, for a loaded 2-core machine


async def echo(method: str, body: bytes) -> bytes:
    return method.encode() + b":" + body


def make_mesh(
    node_id: str, *, join: tuple[str, ...] = (), port: int = 0, secret: ClusterSecret = SECRET
) -> Mesh:
    return Mesh(
        node_id,
        secret,
        listen=("127.0.0.1", port),
        join=join,
        link_config=CONFIG,
        rpc_handler=echo,
        rng=random.Random(node_id),
        backoff=BACKOFF,
    )


async def start_mesh(nursery: trio.Nursery, mesh: Mesh) -> tuple[str, trio.CancelScope]:
    """Run ``mesh`` under its own cancel scope (cancel it to kill the node); its URL."""
    scope = trio.CancelScope()

    async def body(task_status: trio.TaskStatus[tuple[str, int]]) -> None:
        with scope:
            await mesh.run(task_status=task_status)

    host, port = await nursery.start(body)
    return f"ws://{host}:{port}", scope


async def until(predicate: Callable[[], bool], within: float = 5.0) -> None:
    """Poll ``predicate`` until it holds; ``trio.TooSlowError`` after ``within`` seconds."""
    with trio.fail_after(within):
        while not predicate():  # noqa: ASYNC110 - polling with a deadline, on purpose
            await trio.sleep(0.01)


def row(mesh: Mesh, peer_id: str) -> LinkView | None:
    return next((view for view in mesh.links() if view.peer_id == peer_id), None)


def is_up(mesh: Mesh, *peers: str) -> bool:
    return all((view := row(mesh, p)) is not None and view.state is PeerState.UP for p in peers)


def drain(events: trio.MemoryReceiveChannel[MeshEvent]) -> list[MeshEvent]:
    got = []
    while True:
        try:
            got.append(events.receive_nowait())
        except trio.WouldBlock:
            return got


async def test_three_meshes_form_a_full_mesh() -> None:
    # No gossip of addresses yet ("peers it learns of" comes with the telemetry plane), so C
    # is told of both A and B; B of A only. A dials nobody: its rows are peers that dialed it.
    async with trio.open_nursery() as nursery:
        a = make_mesh("node-a")
        a_url, _ = await start_mesh(nursery, a)
        b = make_mesh("node-b", join=(a_url,))
        b_url, _ = await start_mesh(nursery, b)
        c = make_mesh("node-c", join=(a_url, b_url))
        await start_mesh(nursery, c)
        await until(
            lambda: (
                is_up(a, "node-b", "node-c")
                and is_up(b, "node-a", "node-c")
                and is_up(c, "node-a", "node-b")
            )
        )
        for mesh in (a, b, c):
            assert mesh.statistics().peers_up == 2
            assert len(mesh.links()) == 2
        # B dialed A, so A's row for B names B's ephemeral address; B's row names A's URL.
        b_at_a, a_at_b = row(a, "node-b"), row(b, "node-a")
        assert b_at_a is not None and a_at_b is not None
        assert b_at_a.outbound is False and b_at_a.address.startswith("127.0.0.1:")
        assert a_at_b.outbound is True and a_at_b.address == a_url
        events = drain(a.events)
        assert {e.peer_id for e in events if isinstance(e, LinkUp)} == {"node-b", "node-c"}
        assert not [e for e in events if isinstance(e, LinkDown)]

        # Heartbeats give an RTT; an rpc over the mesh's link moves the counters.
        await until(lambda: all(v.rtt_ms is not None for m in (a, b, c) for v in m.links()))
        before = row(c, "node-a")
        link = c.link("node-a")
        assert before is not None and link is not None
        assert await link.call("hello", b"mesh", timeout=5) == b"hello:mesh"
        after = row(c, "node-a")
        assert after is not None
        assert after.frames_out > before.frames_out and after.bytes_out > before.bytes_out
        assert after.frames_in > before.frames_in and after.bytes_in > before.bytes_in

        body = c.links_json()
        assert set(body) == {"links"}
        entries = body["links"]
        assert isinstance(entries, list) and isinstance(entries[0], dict)
        entry = entries[0]
        assert set(entry) == {
            "peer_id",
            "address",
            "state",
            "rtt_ms",
            "bytes_in",
            "bytes_out",
            "frames_in",
            "frames_out",
            "last_error",
        }
        assert entry["state"] == "up" and entry["peer_id"] == "node-a"
        nursery.cancel_scope.cancel()


async def test_a_mesh_with_another_secret_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="skulk.federation")
    async with trio.open_nursery() as nursery:
        a = make_mesh("node-a")
        a_url, _ = await start_mesh(nursery, a)
        stranger = make_mesh("node-x", join=(a_url,), secret=OTHER_SECRET)
        await start_mesh(nursery, stranger)
        await until(lambda: a.statistics().refused_in >= 1)
        await until(lambda: (stranger.links()[0].last_error or "").find("4006") >= 0)
        view = stranger.links()[0]
        assert view.state is not PeerState.UP and view.peer_id is None
        assert view.last_error is not None and "wrong_cluster" in view.last_error
        assert a.links() == () and a.statistics().peers_up == 0
        refused = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert any("wrong_cluster (close 4006)" in m and "by the peer" not in m for m in refused)
        assert any("refused by the peer: wrong_cluster (close 4006)" in m for m in refused)
        nursery.cancel_scope.cancel()


async def test_a_killed_peer_goes_down_and_comes_back_on_its_port() -> None:
    async with trio.open_nursery() as nursery:
        b = make_mesh("node-b")
        b_url, b_scope = await start_mesh(nursery, b)
        a = make_mesh("node-a", join=(b_url,))
        await start_mesh(nursery, a)
        await until(lambda: is_up(a, "node-b"))
        assert [type(e) for e in drain(a.events)] == [LinkUp]

        b_scope.cancel()
        await until(lambda: not is_up(a, "node-b"), within=CONFIG.liveness_timeout + SLACK)
        assert a.link("node-b") is None
        assert [type(e) for e in drain(a.events)] == [LinkDown]
        # The dialer keeps trying with backoff while nothing listens on the port.
        failures = a.statistics().dial_failures
        await until(lambda: a.statistics().dial_failures >= failures + 2)
        view = a.links()[0]
        assert view.state in (PeerState.DOWN, PeerState.CONNECTING)
        assert view.last_error is not None and view.last_error.startswith(f"dial {b_url} failed")

        port = int(b_url.rsplit(":", 1)[1])
        b2 = make_mesh("node-b", port=port)
        await start_mesh(nursery, b2)
        await until(lambda: is_up(a, "node-b") and is_up(b2, "node-a"))
        assert [type(e) for e in drain(a.events)] == [LinkUp]
        link = a.link("node-b")
        assert link is not None and await link.call("again", b"", timeout=5) == b"again:"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("ids", [("node-a", "node-b"), ("node-b", "node-a")])
async def test_simultaneous_mutual_dial_keeps_one_link(ids: tuple[str, str]) -> None:
    async with trio.open_nursery() as nursery:
        x, y = make_mesh(ids[0]), make_mesh(ids[1])
        x_url, _ = await start_mesh(nursery, x)
        y_url, _ = await start_mesh(nursery, y)
        x.add_peer(y_url)  # both dial at about the same time
        y.add_peer(x_url)

        # Whether both dials race depends on scheduling: a dialer that finds the pair linked
        # already does not dial. Either way each side ends with one link, the same one.
        def settled() -> bool:
            vx, vy = row(x, ids[1]), row(y, ids[0])
            return (
                vx is not None and vy is not None and vx.state is PeerState.UP
                and vy.state is PeerState.UP and vx.outbound is not vy.outbound
            )  # fmt: skip

        await until(settled)
        both_dialed = x.statistics().dials == 1 and y.statistics().dials == 1
        if both_dialed:
            # The tie-break keeps the link dialed by the smaller id, on both sides.
            smaller = min(ids)
            kept_by_smaller = x.node_id == smaller
            await until(lambda: getattr(row(x, ids[1]), "outbound", None) is kept_by_smaller)
            assert x.statistics().tie_breaks + y.statistics().tie_breaks >= 1
        # A side whose own dial was still in flight when the peer's dial linked them shows
        # that dial target as a second, "connecting" row until the dial finds the pair linked.
        await until(lambda: len(x.links()) == 1 and len(y.links()) == 1)
        for mesh in (x, y):
            assert mesh.statistics().peers_up == 1
        kept_x, kept_y = x.link(ids[1]), y.link(ids[0])
        assert kept_x is not None and kept_y is not None

        # And it stays so: several heartbeats later, the same link, no redial, nothing down.
        frames = kept_x.statistics().frames_in
        await until(lambda: kept_x.statistics().frames_in >= frames + 5)
        assert x.link(ids[1]) is kept_x and y.link(ids[0]) is kept_y
        assert x.statistics().dials <= 1 and y.statistics().dials <= 1
        for mesh in (x, y):
            assert not [e for e in drain(mesh.events) if isinstance(e, LinkDown)]
            view = mesh.links()[0]
            assert view.state is PeerState.UP and view.last_error is None
        nursery.cancel_scope.cancel()


async def raw_close_code(url: str, *messages: bytes | str) -> int | None:
    """Connect without the mesh, send ``messages``, and wait for the server's close code."""
    async with trio_websocket.open_websocket_url(
        url, max_message_size=CONFIG.max_frame_size, connect_timeout=2, disconnect_timeout=1
    ) as ws:
        for message in messages:
            await ws.send_message(message)
        with trio.fail_after(CONFIG.handshake_timeout + SLACK):
            while True:
                try:
                    await ws.get_message()
                except trio_websocket.ConnectionClosed as exc:
                    return exc.reason.code if exc.reason is not None else None


async def raw_handshake(url: str, handshake: ClientHandshake) -> int | None:
    """Run a client handshake by hand; the close code if refused, ``None`` if established
    (then the connection closes at once)."""
    async with trio_websocket.open_websocket_url(
        url, max_message_size=CONFIG.max_frame_size, connect_timeout=2, disconnect_timeout=1
    ) as ws:
        transport = WebSocketTransport(ws)
        try:
            with trio.fail_after(CONFIG.handshake_timeout + SLACK):
                await transport.send_message(handshake.initial_bytes())
                while isinstance(handshake.state, Waiting):
                    for out in handshake.receive_bytes(await transport.get_message()):
                        await transport.send_message(out)
        except Exception as exc:
            code = getattr(exc, "code", None)
            assert isinstance(code, int), exc
            return code
        assert isinstance(handshake.state, Established)
        return None


async def test_unauthenticated_and_bad_handshakes_are_refused(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="skulk.federation")
    async with trio.open_nursery() as nursery:
        a = make_mesh("node-a")
        a_url, _ = await start_mesh(nursery, a)
        b = make_mesh("node-b", join=(a_url,))  # B dials A: an inbound link at A
        await start_mesh(nursery, b)
        await until(lambda: is_up(a, "node-b"))
        b_link = a.link("node-b")
        hello = ClientHandshake(SECRET, "node-r").initial_bytes()
        codes: dict[str, int | None] = {}

        async def probe(name: str, fn: Callable[..., Awaitable[int | None]], *args: object) -> None:
            codes[name] = await fn(*args)

        async with trio.open_nursery() as probes:
            probes.start_soon(probe, "silent", raw_close_code, a_url)
            probes.start_soon(probe, "garbage", raw_close_code, a_url, b"\xff\x00")
            probes.start_soon(probe, "text", raw_close_code, a_url, "hello")
            big = bytes(CONFIG.max_frame_size + 1)
            probes.start_soon(probe, "too_large", raw_close_code, a_url, big)
            probes.start_soon(probe, "first", raw_close_code, a_url, hello)
            duplicate = ClientHandshake(SECRET, "node-b")
            probes.start_soon(probe, "duplicate", raw_handshake, a_url, duplicate)
            version = ClientHandshake(SECRET, "node-v", protocol_version=PROTOCOL_VERSION + 1)
            probes.start_soon(probe, "version", raw_handshake, a_url, version)
        codes["replayed"] = await raw_close_code(a_url, hello)  # the same nonce again

        assert codes == {
            "silent": 4007,  # handshake timeout: nothing sent within handshake_timeout
            "garbage": 4005,
            "text": 4005,
            "too_large": 1009,  # trio-websocket's own limit, set to max_frame_size
            "first": 4007,  # a valid hello, then silence
            "duplicate": 4004,
            "version": 4003,
            "replayed": 4002,
        }
        await until(lambda: a.statistics().refused_in == 8)
        lines = [r.getMessage() for r in caplog.records if r.name.startswith("skulk.federation")]
        for code in (4007, 4005, 4004, 4003, 4002):
            assert any(f"(close {code})" in line and "by the peer" not in line for line in lines)
        assert any("transport closed during the handshake: 1009" in line for line in lines)
        stats = a.statistics()
        assert stats.established_in == 1 and stats.handshaking == 0
        assert stats.replay_cache.replays == 1
        # Nothing of that touched the real peer.
        assert a.link("node-b") is b_link and is_up(a, "node-b")
        assert a.statistics().peers_up == 1
        nursery.cancel_scope.cancel()


async def test_an_authenticated_peer_that_goes_silent_is_down_after_liveness() -> None:
    async with trio.open_nursery() as nursery:
        a = make_mesh("node-a")
        a_url, _ = await start_mesh(nursery, a)
        async with trio_websocket.open_websocket_url(
            a_url, max_message_size=CONFIG.max_frame_size, connect_timeout=2, disconnect_timeout=1
        ) as ws:
            transport = WebSocketTransport(ws)
            handshake = ClientHandshake(SECRET, "node-s")
            with trio.fail_after(CONFIG.handshake_timeout + SLACK):
                await transport.send_message(handshake.initial_bytes())
                while isinstance(handshake.state, Waiting):
                    for out in handshake.receive_bytes(await transport.get_message()):
                        await transport.send_message(out)
            assert isinstance(handshake.state, Established)
            await until(lambda: is_up(a, "node-s"))
            # The peer never answers a ping: the link dies of the liveness timeout.
            await until(lambda: not is_up(a, "node-s"), within=CONFIG.liveness_timeout + SLACK)
        view = row(a, "node-s")
        assert view is not None and view.state is PeerState.DOWN
        assert view.last_error is not None and view.last_error.startswith("liveness_timeout")
        assert view.frames_out > 0  # the pings it never answered
        events = drain(a.events)
        assert [type(e) for e in events] == [LinkUp, LinkDown]
        down = events[1]
        assert isinstance(down, LinkDown) and down.last_error == view.last_error
        nursery.cancel_scope.cancel()


def test_addresses_are_checked() -> None:
    assert parse_join_url(" ws://10.0.0.2:52416/ ") == "ws://10.0.0.2:52416"
    assert parse_join_url("ws://[::1]:1/fed") == "ws://[::1]:1/fed"
    assert parse_join_url("WSS://node-b:52416/") == "wss://node-b:52416"
    for bad in (
        "http://h:1",
        "ws://h",
        "ws://h:0",
        "ws://h:99999",
        "wss://h",
        "ftp://h:1",
        "ws://h:1/?q",
    ):
        with pytest.raises(MeshAddressError):
            parse_join_url(bad)
    assert parse_listen_address("127.0.0.1:52416") == ("127.0.0.1", 52416)
    assert parse_listen_address("[::1]:0") == ("::1", 0)
    for bad in ("127.0.0.1", ":1", "h:x", "h:70000"):
        with pytest.raises(MeshAddressError):
            parse_listen_address(bad)
    with pytest.raises(ValueError, match="invalid node id"):
        Mesh("", SECRET)
