"""A connection whose client has closed is closed at once, not after the keep-alive timeout.

Hypercorn's Trio server (0.17, 0.18) reads a connection until the client's EOF, then leaves its
task group, which waits for every task of the connection, the keep-alive timer included. A
client that closes (or half-closes) its socket after a response has *ended* — what every
one-shot client does: ``curl``, ``httpx.post``, a script — leaves that timer running, so the
server holds the socket in ``CLOSE_WAIT``, its file descriptor and its task for the whole
keep-alive timeout (``skulk serve`` sets 75 s). Measured on ``skulk serve``: 172 of 200 one-shot
``GET /health`` left a ``CLOSE_WAIT`` socket behind. At a few hundred such requests a second
that is every file descriptor the node may open, and with them its runners' pipes, its links
and its Raft storage: one client's habit would take the node down. A half-closed client that
waits for the end of the connection waits the whole timeout.

:func:`close_on_client_eof` stops the keep-alive timer when the read loop ends, so the task
group ends (and the socket is closed) as soon as no request of the connection is left running.
A request still running when the EOF comes is not affected: Hypercorn answers it and closes
after it as before. It patches Hypercorn: call it once, before serving. If a later Hypercorn
lacks what it wraps, it logs a warning and leaves it alone (and the test that counts
``CLOSE_WAIT`` sockets fails).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from hypercorn.trio import tcp_server

log = logging.getLogger("skulk.api")


def close_on_client_eof() -> None:
    """Close a connection as soon as its client's EOF is read and no request of it runs
    (see the module docstring). Idempotent."""
    server: Any = tcp_server.TCPServer
    read: Callable[[Any], Awaitable[None]] | None = getattr(server, "_read_data", None)
    if read is None:
        log.warning("hypercorn's TCPServer has no _read_data: closed connections linger")
        return
    if getattr(read, "closes_on_eof", False):
        return

    @functools.wraps(read)
    async def read_then_stop_idling(self: Any) -> None:
        await read(self)
        idle = getattr(self, "idle_task", None)  # the keep-alive timer
        if idle is not None:
            await idle.stop()

    read_then_stop_idling.closes_on_eof = True  # type: ignore[attr-defined]
    server._read_data = read_then_stop_idling
