"""Operator requests: membership changes and leadership transfers, retried until a leader
takes them.

An :class:`AdminRequest` goes to whichever node leads when it is tried; ``NotLeader``, a
refusal (a change already pending, a learner not caught up, a transfer under way) or no
leader at all means trying again ``ADMIN_RETRY_TICKS`` later, up to ``ADMIN_RETRIES`` times.
"Accepted" means a leader appended the change (or started the transfer) -- not that it
committed: a change appended by a leader that is then deposed may be rolled back, which is
exactly what some scenarios exercise.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from skulk.consensus import (
    ConfChange,
    Input,
    NotLeader,
    ProposalRefused,
    ProposeConfChange,
    TransferLeadership,
)
from skulk.sim._faults import Action
from skulk.sim._node import SimNode

ADMIN_RETRIES = 40
ADMIN_RETRY_TICKS = 5


@attrs.define
class AdminRequest:
    action: Action
    tries_left: int = ADMIN_RETRIES
    next_try: int = 0
    outcome: str = "pending"


def admin_input(a: Action) -> Input:
    if a.op == "transfer":
        return TransferLeadership(a.node)
    if a.op == "add_learner":
        return ProposeConfChange(ConfChange("add_learner", a.node))
    if a.op == "promote":
        return ProposeConfChange(ConfChange("promote", a.node))
    return ProposeConfChange(ConfChange("remove", a.node))


class Admin:
    """Pending requests and the log of every attempt ``(tick, op, node, result)``."""

    def __init__(self, trace: Callable[[str], None]) -> None:
        self._trace = trace
        self.pending: list[AdminRequest] = []
        self.log: list[tuple[int, str, str, str]] = []

    def request(self, action: Action, now: int) -> None:
        self.pending.append(AdminRequest(action, next_try=now))

    def run(
        self,
        now: int,
        find_leader: Callable[[], SimNode | None],
        send: Callable[[SimNode, Input], None],
    ) -> None:
        """Try the requests that are due at the current leader (``send`` steps it and sends;
        the leader is looked up for each request, as the previous one may have crashed it)."""
        for req in self.pending:
            if req.next_try > now:
                continue
            leader = find_leader()
            req.tries_left -= 1
            req.next_try = now + ADMIN_RETRY_TICKS
            a = req.action
            if leader is None:
                result = "no leader"
            elif a.op == "transfer" and leader.node_id == a.node:
                result = req.outcome = f"accepted: {a.node} leads already"
            else:
                try:
                    send(leader, admin_input(a))
                    result = req.outcome = f"accepted by {leader.node_id}"
                except NotLeader:
                    result = "not leader"
                except ProposalRefused as exc:
                    result = f"refused: {exc.reason}"
            self._trace(f"{now} M {a.op} {a.node} {result}")
            self.log.append((now, a.op, a.node, result))
            if req.outcome == "pending" and req.tries_left <= 0:
                req.outcome = f"gave up: {result}"
        self.pending = [r for r in self.pending if r.outcome == "pending"]
