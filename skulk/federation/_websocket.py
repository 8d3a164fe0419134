"""WebSocket connections between nodes: dialing a peer's ``ws://`` or ``wss://`` URL, and the
socket buffer size the mesh's listener and dialers share.

A ``wss://`` dial does its TLS handshake before the WebSocket upgrade so that a TLS failure is
reported as one (:class:`~skulk.federation._tls.TlsHandshakeError`), not as a timeout.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import trio
import trio_websocket

from ._linkbase import LinkConfig
from ._refusal import one_line
from ._tls import TlsHandshakeError
from ._wsmask import install as _install_fast_masking

_install_fast_masking()  # wsproto's masking costs ~5 ms per MiB each way (see _wsmask)

RECEIVE_BUFFER = 1024 * 1024
"""Bytes a connection reads from its socket at once. trio-websocket's default (4 KiB) costs a
trip through the event loop per 4 KiB: weight transfers ran at ~80 MB/s, ~280 MB/s with 256 KiB;
1 MiB (the chunk size of a transfer) halves the reads again."""


def open_websocket(
    url: str, config: LinkConfig, client_ssl: ssl.SSLContext | None
) -> contextlib.AbstractAsyncContextManager[trio_websocket.WebSocketConnection]:
    """A WebSocket connection to a peer's ``ws://`` or ``wss://`` ``url`` (``client_ssl``
    verifies a ``wss://`` one), sized and timed by the link ``config``."""
    if url.startswith("wss://"):
        return _open_wss(url, config, client_ssl)
    return trio_websocket.open_websocket_url(
        url,
        max_message_size=config.max_frame_size,
        receive_buffer_size=RECEIVE_BUFFER,
        connect_timeout=config.handshake_timeout,
        disconnect_timeout=config.close_timeout,
    )


@contextlib.asynccontextmanager
async def _open_wss(
    url: str, config: LinkConfig, client_ssl: ssl.SSLContext | None
) -> AsyncIterator[trio_websocket.WebSocketConnection]:
    """A ``wss://`` connection whose TLS handshake is done first, so that a TLS failure (an
    untrusted certificate, a wrong host name) is reported as such: trio-websocket itself
    would only report a timeout."""
    parts = urlsplit(url)
    host, port = parts.hostname, parts.port
    assert host is not None and port is not None and client_ssl is not None
    try:
        with trio.fail_after(config.handshake_timeout):
            stream = await trio.open_ssl_over_tcp_stream(
                host, port, ssl_context=client_ssl, https_compatible=True
            )
            try:
                await stream.do_handshake()
            except BaseException:
                await trio.aclose_forcefully(stream)
                raise
    except trio.BrokenResourceError as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise TlsHandshakeError(f"TLS handshake failed: {cause}") from None
    except trio.TooSlowError:
        raise trio_websocket.ConnectionTimeout from None
    async with trio.open_nursery() as nursery:
        try:
            with trio.fail_after(config.handshake_timeout):
                ws = await trio_websocket.wrap_client_stream(
                    nursery,
                    stream,
                    parts.netloc,
                    parts.path or "/",
                    max_message_size=config.max_frame_size,
                    receive_buffer_size=RECEIVE_BUFFER,
                )
        except BaseException:
            await trio.aclose_forcefully(stream)
            raise
        try:
            yield ws
        finally:
            with trio.move_on_after(config.close_timeout) as scope:
                scope.shield = True
                await ws.aclose()
            nursery.cancel_scope.cancel()


def describe_failure(exc: BaseException) -> str:
    """One line for a dial failure (groups: their first leaf)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    cause = exc.__cause__
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if cause is not None and str(cause):
        text += f" ({type(cause).__name__}: {cause})"
    return one_line(text)[:300]
