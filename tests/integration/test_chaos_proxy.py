"""The chaos harness's link proxy on loopback: bytes pass intact, a cut closes open
connections and refuses new ones, a one-way stall holds one direction until it heals (then
everything arrives, in order), delay and bandwidth modes still deliver every byte."""

from __future__ import annotations

import trio

from skulk.chaos import LinkMode, LinkProxy


async def _echo(stream: trio.SocketStream) -> None:
    async with stream:
        try:
            while data := await stream.receive_some(65536):
                await stream.send_all(data)
        except trio.BrokenResourceError:
            pass


async def _receive(stream: trio.SocketStream, n: int) -> bytes:
    got = b""
    while len(got) < n:
        data = await stream.receive_some(n - len(got))
        if not data:
            break
        got += data
    return got


async def _proxied(nursery: trio.Nursery) -> LinkProxy:
    listeners = await nursery.start(trio.serve_tcp, _echo, 0)
    port = listeners[0].socket.getsockname()[1]
    proxy = LinkProxy(1, 2, port)
    await nursery.start(proxy.serve)
    return proxy


async def test_bytes_pass_and_a_cut_closes_and_refuses() -> None:
    async with trio.open_nursery() as nursery:
        proxy = await _proxied(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
        await stream.send_all(b"hello")
        assert await _receive(stream, 5) == b"hello"
        proxy.set_mode(LinkMode("cut"))
        with trio.fail_after(10):
            assert await stream.receive_some(10) == b""  # closed by the proxy
        again = await trio.open_tcp_stream("127.0.0.1", proxy.port)
        with trio.fail_after(10):
            assert await again.receive_some(10) == b""
        assert proxy.statistics().refused == 1
        proxy.set_mode(LinkMode())
        healed = await trio.open_tcp_stream("127.0.0.1", proxy.port)
        await healed.send_all(b"back")
        assert await _receive(healed, 4) == b"back"
        nursery.cancel_scope.cancel()


async def test_a_one_way_stall_holds_one_direction_until_it_heals() -> None:
    async with trio.open_nursery() as nursery:
        proxy = await _proxied(nursery)
        stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
        proxy.set_mode(LinkMode("oneway", way=0))
        await stream.send_all(b"one")
        await stream.send_all(b"two")
        with trio.move_on_after(0.5):
            await stream.receive_some(10)
            raise AssertionError("bytes passed a stalled direction")
        assert proxy.statistics().bytes_forward == 0
        proxy.set_mode(LinkMode())
        with trio.fail_after(10):
            assert await _receive(stream, 6) == b"onetwo"
        nursery.cancel_scope.cancel()


async def test_delay_and_bandwidth_deliver_every_byte_in_order() -> None:
    payload = bytes(range(256)) * 512  # 128 KiB
    async with trio.open_nursery() as nursery:
        proxy = await _proxied(nursery)
        for mode in (LinkMode("delay", delay_s=0.01), LinkMode("bandwidth", bytes_per_s=4e6)):
            proxy.set_mode(mode)
            stream = await trio.open_tcp_stream("127.0.0.1", proxy.port)
            async with trio.open_nursery() as inner:
                inner.start_soon(stream.send_all, payload)
                with trio.fail_after(30):
                    assert await _receive(stream, len(payload)) == payload
            await stream.aclose()
        nursery.cancel_scope.cancel()
