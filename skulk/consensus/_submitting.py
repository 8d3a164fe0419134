"""Client submissions to the Raft driver: proposing on the leader, forwarding from a follower.

**Submissions** work on every node: the leader proposes them; a follower forwards them to the
leader over the transport, under the caller's deadline, retrying across leader changes and
lost proposals until the deadline. Each command carries ``(client_id, seq)`` and the state
machine is wrapped in :class:`Sessions`, so retries apply at most once. Errors are typed
(:mod:`skulk.consensus._errors`).
"""

from __future__ import annotations

import math

import trio

from ._batch import Retry, Waiter
from ._core import RaftCore, Role
from ._driverbase import DriverBase
from ._errors import (
    NoQuorum,
    NotLeader,
    ProposalRefused,
    SubmitTimeout,
    Unavailable,
    UnavailableReason,
)
from ._forwarding import SubmitRequest
from ._machine import S
from ._types import NodeId, Propose


class Submitting(DriverBase[S]):
    """:meth:`submit` and what serves it (see the module doc)."""

    async def submit(
        self,
        command: bytes,
        *,
        client_id: str,
        seq: int,
        timeout: float,  # noqa: ASYNC109 - it travels with forwarded submissions
        forward: bool = True,
    ) -> bytes:
        """Replicate ``command`` and return the state machine's result for it.

        ``(client_id, seq)``: ``client_id`` is non-empty and stable across retries; ``seq``
        grows with each new command of that client (``>= 1``); a retry reuses it and applies at
        most once. Works on any node: a follower forwards to the leader (unless ``forward`` is
        False: then :class:`NotLeader` on a non-leader). Waits at most ``timeout`` seconds.

        Raises :class:`NoQuorum` (no reachable leader before the deadline),
        :class:`SubmitTimeout` (a leader took it; no commit seen: outcome unknown),
        :class:`Unavailable` (this node's storage failed, it is stopped, or overloaded) and
        :class:`NotLeader` (``forward=False`` only).
        """
        if not (math.isfinite(timeout) and timeout > 0):
            raise ValueError(f"timeout must be finite and > 0, not {timeout!r}")
        if not client_id or seq < 1:
            raise ValueError("a submission needs a client_id and a seq >= 1")
        request = SubmitRequest(command, client_id, seq, 0)
        return await self._submit(request, trio.current_time() + timeout, forward, timeout)

    async def _serve_forwarded(self, request: SubmitRequest, deadline: float) -> bytes:
        timeout = max(deadline - trio.current_time(), 1e-6)
        return await self._submit(request, deadline, False, timeout)

    async def _submit(
        self,
        request: SubmitRequest,
        deadline: float,
        forward: bool,
        timeout: float,  # noqa: ASYNC109 - for the error message only
    ) -> bytes:
        reached = False  # a leader took (or may have taken) the command
        seen = "no leader"
        while True:
            if not self._running or self._unavailable is not None or self._core is None:
                raise Unavailable(self._unavailable or UnavailableReason.STOPPED)
            if trio.current_time() >= deadline:
                raise SubmitTimeout(timeout) if reached else NoQuorum(seen)
            core = self._core
            pause = self._config.retry_interval
            if core.role is Role.LEADER:
                reached = True
                proposed = await self._propose(core, request, deadline)
                if not isinstance(proposed, Retry):
                    return proposed
                pause = proposed.pause
            elif core.leader is not None and core.leader != self.node_id:
                if not forward:
                    raise NotLeader(core.leader)
                reached, result, seen = await self._forward(core.leader, request, deadline, reached)
                if result is not None:
                    return result
            elif not forward:
                raise NotLeader(None)
            with trio.move_on_at(min(deadline, trio.current_time() + pause)):
                await self._changed.wait()

    async def _forward(
        self, leader: NodeId, request: SubmitRequest, deadline: float, reached: bool
    ) -> tuple[bool, bytes | None, str]:
        """One forwarding attempt: (reached a leader?, result or None to retry, last seen)."""
        self._forwards += 1
        try:
            return True, await self._transport.forward(leader, request, deadline), ""
        except SubmitTimeout:
            return True, None, f"{leader} did not answer"
        except NotLeader as exc:
            return reached, None, f"{leader} does not lead (hint: {exc.leader})"
        except (NoQuorum, Unavailable) as exc:
            return reached, None, str(exc)
        except Exception as exc:  # ForwardFailed and friends: the peer cannot be reached now
            return reached, None, f"{leader} unreachable: {exc}"

    async def _propose(
        self, core: RaftCore, request: SubmitRequest, deadline: float
    ) -> bytes | Retry:
        if len(self._waiters) >= self._config.max_pending:
            raise Unavailable(UnavailableReason.OVERLOADED, f"{len(self._waiters)} pending")
        waiter = Waiter(deadline=deadline)
        self._waiters.add(waiter)
        if deadline < self._expiry.deadline:
            self._expiry.deadline = deadline
        try:
            if self._queue[-1].inputs >= self._config.max_batch:
                with trio.move_on_at(deadline):
                    await self._admit(core)
            if self._core is not core or trio.current_time() >= deadline:
                return Retry(0.0)  # the core was discarded, or the deadline: the caller decides
            proposal = Propose(request.command, request.client_id, request.seq)
            try:
                ready = self._step(core, proposal)
            except NotLeader:
                return Retry(0.0)
            except ProposalRefused:  # a transfer or conf change under way: try again soon
                return Retry(self._config.retry_interval)
            self._proposals += 1
            if ready.proposed is not None:
                self._waiters.place(waiter, ready.proposed.index, ready.proposed.term)
            await waiter.event.wait()  # finished by a commit, a failure or _expire_waiters
            if isinstance(waiter.outcome, Exception):
                raise waiter.outcome
            assert waiter.outcome is not None
            return waiter.outcome
        finally:
            self._waiters.discard(waiter)

    async def _expire_waiters(self) -> None:
        """Finish submissions whose deadline passed (see :class:`WaiterTable`); a proposal with
        an earlier deadline than the one slept for moves this task's deadline forward."""
        while True:
            self._waiters.expire(trio.current_time())
            self._expiry = trio.CancelScope(deadline=self._waiters.next_deadline())
            with self._expiry:
                await trio.sleep_forever()
