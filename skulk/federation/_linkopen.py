"""Opening a federation link: drive the handshake over a transport, then run the link.

:func:`run_link` (under a nursery: ``link = await nursery.start(run_link, ...)``) and
:func:`open_link` (``async with open_link(...) as link``) first drive the handshake under
``config.handshake_timeout``: no frame but handshake frames is processed before it ends, and a
refusal closes the transport with the refusal's close code (4001-4008), logs its line once and
raises :class:`HandshakeFailed`. A peer's refusal (its close code) is logged and raised the same
way, with ``refusal.by_peer`` set. Then the :class:`~skulk.federation._link.Link` runs until it
closes.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from skulk.wire.federation import HANDSHAKE_MAX_FRAME_SIZE

from ._handshake import ClientHandshake, ServerHandshake
from ._link import Link, log
from ._linkbase import HandshakeFailed, LinkClosed, LinkConfig
from ._linkrpc import RpcHandler
from ._machine import Established, Refused, Waiting
from ._refusal import quote, refusal_from_close
from ._transport import MessageTooLarge, MessageTransport, TransportClosed, TransportViolation


async def _drive_handshake(
    transport: MessageTransport,
    handshake: ClientHandshake | ServerHandshake,
    config: LinkConfig,
) -> str:
    """Run the handshake; the peer's authenticated node id, or :class:`HandshakeFailed`
    (the transport closed with the refusal's code). Cancelled from outside: the transport is
    closed (1001) before the cancellation goes on."""
    try:
        return await _handshake_steps(transport, handshake, config)
    except HandshakeFailed:
        raise
    except BaseException:
        with trio.move_on_after(config.close_timeout, shield=True):
            await transport.aclose(1001, "going away")
        raise


async def _handshake_steps(
    transport: MessageTransport,
    handshake: ClientHandshake | ServerHandshake,
    config: LinkConfig,
) -> str:
    failure: HandshakeFailed | None = None
    with trio.move_on_after(config.handshake_timeout):
        try:
            if isinstance(handshake, ClientHandshake):
                await transport.send_message(handshake.initial_bytes())
            while isinstance(handshake.state, Waiting):
                message = await transport.get_message()
                for out in handshake.receive_bytes(message):
                    await transport.send_message(out)
        except TransportClosed as exc:
            refusal = refusal_from_close(exc.code, exc.reason) if exc.by_peer else None
            detail = f"transport closed during the handshake: {exc.code} {quote(exc.reason)}"
            if refusal is not None:
                log.warning("%s", refusal.log_line(transport.remote))
                detail = refusal.log_line(transport.remote)
            failure = HandshakeFailed(refusal, detail)
        except TransportViolation:
            handshake.receive_bytes("")  # the machine refuses a text message as malformed
        except MessageTooLarge:
            handshake.receive_bytes(bytes(HANDSHAKE_MAX_FRAME_SIZE + 1))  # refused: too large
    state = handshake.state
    if failure is None and isinstance(state, Waiting):
        handshake.time_out()
        state = handshake.state
    if isinstance(state, Established) and failure is None:
        return state.peer_id
    if isinstance(state, Refused):
        refusal = state.refusal
        line = refusal.log_line(transport.remote)
        log.warning("%s", line)
        failure = HandshakeFailed(refusal, line)
    assert failure is not None
    refusal = failure.refusal
    with trio.move_on_after(config.close_timeout, shield=True):
        if refusal is None or refusal.by_peer:
            await transport.aclose()
        else:
            await transport.aclose(refusal.close_code, refusal.close_reason)
    raise failure


async def run_link(
    transport: MessageTransport,
    handshake: ClientHandshake | ServerHandshake,
    *,
    config: LinkConfig = LinkConfig(),  # noqa: B008 - frozen, so sharing the default is safe
    rpc_handler: RpcHandler | None = None,
    task_status: trio.TaskStatus[Link] = trio.TASK_STATUS_IGNORED,
) -> LinkClosed:
    """Drive the handshake, then run the link until it closes; returns how it ended.

    Use with ``link = await nursery.start(run_link, transport, handshake)``: ``start`` returns
    the :class:`Link` once established, or raises :class:`HandshakeFailed` (the transport is
    closed by then). The link's own failures never raise here; they are in the result.
    """
    peer_id = await _drive_handshake(transport, handshake, config)
    link = Link(transport, peer_id, config, rpc_handler)
    task_status.started(link)
    await link._run()
    assert link.closed is not None
    return link.closed


@asynccontextmanager
async def open_link(
    transport: MessageTransport,
    handshake: ClientHandshake | ServerHandshake,
    *,
    config: LinkConfig = LinkConfig(),  # noqa: B008
    rpc_handler: RpcHandler | None = None,
) -> AsyncIterator[Link]:
    """``async with open_link(transport, handshake) as link:`` runs :func:`run_link` for the
    block and closes the link (code 1000) when it exits. Raises :class:`HandshakeFailed` on
    entry if the handshake fails. An exception from the block propagates unwrapped."""
    error: BaseException | None = None
    async with trio.open_nursery() as nursery:
        start = functools.partial(run_link, config=config, rpc_handler=rpc_handler)
        link: Link = await nursery.start(start, transport, handshake)
        try:
            yield link
        except BaseException as exc:  # re-raised below, outside the nursery (not grouped)
            error = exc
        finally:
            link.close()
    if error is not None:
        raise error
