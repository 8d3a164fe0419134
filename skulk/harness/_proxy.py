"""A fault-injecting TCP proxy for the links between nodes (chaos runs, the repro of a one-way
cut): one :class:`LinkProxy` per ordered
pair (node *a* dials node *b* through it), all served by one Trio thread (:class:`Proxies`).

Each proxy accepts on its own loopback port and forwards to its target; its :class:`LinkMode`
says how bytes pass, and applies at once to connections already open:

* ``up`` — they pass;
* ``cut`` — every open connection is closed and new ones are accepted and closed at once
  (a partition both ways);
* ``oneway`` — bytes in one direction (``way``) stop (they wait in the proxy; TCP's flow
  control backs up behind them), the other direction passes: one side hears nothing from the
  other while the other hears it (a one-way partition; over TCP, loss in one direction is
  exactly this: nothing arrives until the fault heals, then it all does, in order);
* ``delay`` — each chunk is held ``delay_s`` seconds before it is forwarded (both directions);
* ``bandwidth`` — each direction passes at most ``bytes_per_s``.

Why a proxy of our own: toxiproxy, the well-kept fault proxy, is a Go server binary (its Python
packages are clients of it); ``tc netem`` needs the ``sch_netem`` kernel module, which
sandboxed kernels (this machine's among them) do not have. The proxy is ~200 lines of Trio.
"""

from __future__ import annotations

import math
import threading
from typing import Literal

import attrs
import trio

ModeName = Literal["up", "cut", "oneway", "delay", "bandwidth"]
CHUNK = 65536


@attrs.frozen
class LinkMode:
    """How one proxy passes bytes; ``way`` is the direction ``oneway`` stalls (0: from the
    dialer to the target, 1: back)."""

    name: ModeName = "up"
    delay_s: float = 0.0
    bytes_per_s: float = math.inf
    way: int = 0


@attrs.frozen
class ProxyStatistics:
    connections: int
    open: int
    refused: int
    bytes_forward: int
    bytes_back: int


class LinkProxy:
    """Node ``source`` reaches node ``target`` (at ``target_port``) through :attr:`port`."""

    def __init__(self, source: int, target: int, target_port: int) -> None:
        self.source = source
        self.target = target
        self.target_port = target_port
        self.port = 0
        self.mode = LinkMode()
        self._changed = trio.Event()
        self._conns: set[trio.CancelScope] = set()
        self._connections = 0
        self._refused = 0
        self._bytes = [0, 0]

    def set_mode(self, mode: LinkMode) -> None:
        """Trio thread only (see :meth:`Proxies.set_mode`)."""
        self.mode = mode
        if mode.name == "cut":
            for scope in list(self._conns):
                scope.cancel()
        self._changed.set()
        self._changed = trio.Event()

    def statistics(self) -> ProxyStatistics:
        return ProxyStatistics(self._connections, len(self._conns), self._refused, *self._bytes)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            if self.mode.name == "cut":
                self._refused += 1
                return
            try:
                with trio.fail_after(5):
                    upstream = await trio.open_tcp_stream("127.0.0.1", self.target_port)
            except (OSError, trio.TooSlowError):
                self._refused += 1
                return
            self._connections += 1
            async with upstream:
                with trio.CancelScope() as scope:
                    self._conns.add(scope)
                    try:
                        async with trio.open_nursery() as nursery:
                            nursery.start_soon(
                                self._pump, client, upstream, 0, nursery.cancel_scope
                            )
                            nursery.start_soon(
                                self._pump, upstream, client, 1, nursery.cancel_scope
                            )
                    finally:
                        self._conns.discard(scope)

    async def _pump(
        self, src: trio.SocketStream, dst: trio.SocketStream, way: int, both: trio.CancelScope
    ) -> None:
        """Forward ``src`` to ``dst`` (``way`` 0: dialer → target) under the current mode;
        either side closing ends both directions."""
        try:
            while True:
                while self.mode.name == "oneway" and self.mode.way == way:
                    await self._changed.wait()
                data = await src.receive_some(CHUNK)
                if not data:
                    break
                mode = self.mode
                if mode.name == "delay":
                    await trio.sleep(mode.delay_s)
                elif mode.name == "bandwidth":
                    await trio.sleep(len(data) / mode.bytes_per_s)
                while self.mode.name == "oneway" and self.mode.way == way:
                    await self._changed.wait()
                await dst.send_all(data)
                self._bytes[way] += len(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        both.cancel()


class Proxies:
    """Every link proxy of a run, served by one Trio thread; the methods are for other
    threads."""

    def __init__(self) -> None:
        self._proxies: dict[tuple[int, int], LinkProxy] = {}
        self._token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, links: dict[tuple[int, int], int]) -> dict[tuple[int, int], int]:
        """Start one proxy per ``(source, target): target_port``; their ports, by pair."""
        self._proxies = {(a, b): LinkProxy(a, b, port) for (a, b), port in links.items()}
        self._thread = threading.Thread(target=trio.run, args=(self._main,), daemon=True,
                                        name="chaos-proxies")  # fmt: skip
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the link proxies did not start")
        return {pair: p.port for pair, p in self._proxies.items()}

    async def _main(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        self._stop = trio.Event()
        async with trio.open_nursery() as nursery:
            for proxy in self._proxies.values():
                await nursery.start(proxy.serve)
            self._ready.set()
            await self._stop.wait()
            nursery.cancel_scope.cancel()

    def set_mode(self, a: int, b: int, mode: LinkMode) -> None:
        """The mode of the link ``a → b`` (``a`` dials ``b``)."""
        assert self._token is not None
        trio.from_thread.run_sync(self._proxies[(a, b)].set_mode, mode, trio_token=self._token)

    def set_link(self, a: int, b: int, mode: LinkMode) -> None:
        """Apply ``mode`` between nodes ``a`` and ``b``, whichever of them dialed: on both
        proxies, except that a ``oneway`` mode silences only ``a → b`` (way 0 of the proxy
        ``a`` dials ``b`` through, way 1 of the one ``b`` dials ``a`` through)."""
        self.set_mode(a, b, attrs.evolve(mode, way=0))
        self.set_mode(b, a, attrs.evolve(mode, way=1))

    def statistics(self) -> dict[tuple[int, int], ProxyStatistics]:
        return {pair: p.statistics() for pair, p in self._proxies.items()}

    def stop(self) -> None:
        if self._token is not None and self._stop is not None:
            try:
                trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
            except trio.RunFinishedError:
                pass
        if self._thread is not None:
            self._thread.join(10)
