"""A leader duty: the Raft membership follows the State.

A node's removal is two steps: ``RemoveNode`` commits (the State forgets the node), then the
leader takes the node out of the Raft membership. The second step can fail after the first
committed (no quorum for the membership entry, a leader change, a timeout), and nothing would
try it again: the gone node would stay a voter for good, counted in every quorum. So while
this node leads, every round compares the two: a member the State does not hold, that this
leader does not reach, for ``grace`` seconds (under this leader) is taken out of the
membership; a failed step is tried again after a back-off (0.5 s, doubling to 30 s).

A member the State does not hold *yet* is a node joining: the consensus layer adds linked
nodes as learners before the leader's duties commit its ``UpsertNode``. It is linked, so it is
never taken out; one that loses its link before its upsert and stays away for ``grace`` is,
and is added again as a learner when it links again.
"""

from __future__ import annotations

import logging

import trio

from skulk.cluster import State
from skulk.consensus import ConsensusError, ConsensusService, ProposalRefused

from ._sight import LeaderSight

log = logging.getLogger("skulk.control")

FIRST_RETRY_S = 0.5
"""The back-off after a membership step's first failure (doubling each time)."""
MAX_RETRY_S = 30.0
"""The longest back-off between two tries for one node."""
STEP_TIMEOUT_S = 1.0
"""How long one try waits for the membership change to apply."""


class MembershipReconciler:
    """See the module doc. :meth:`round` runs on the leader; :meth:`reset` when a new term
    starts (the grace counts under this leader only)."""

    def __init__(self, sight: LeaderSight, consensus: ConsensusService[State]) -> None:
        self._sight = sight
        self._consensus = consensus
        self._stale_since: dict[str, float] = {}
        self._next_try: dict[str, tuple[float, float]] = {}  # node -> (when, back-off)
        self.tries: dict[str, int] = {}
        """Membership steps tried per node since it became stale (for tests and logs)."""

    def reset(self) -> None:
        self._stale_since.clear()
        self._next_try.clear()
        self.tries.clear()

    def stale(self, state: State) -> set[str]:
        """Raft members that ``state`` does not hold and this leader does not reach."""
        held = {n.id for n in state.nodes}
        return self._sight.members() - held - self._sight.reachable_ids() - {self._sight.node_id}

    async def round(self, state: State, grace: float) -> None:
        """Take out of the membership every node stale for ``grace`` s whose back-off is over."""
        now = trio.current_time()
        stale = self.stale(state)
        for node in set(self._stale_since) - stale:  # gone from the membership, or back
            self._forget(node)
        for node in sorted(stale):
            since = self._stale_since.setdefault(node, now)
            when, delay = self._next_try.get(node, (since + grace, FIRST_RETRY_S))
            if now < when:
                continue
            self.tries[node] = self.tries.get(node, 0) + 1
            why = "still a member when the step timed out"
            try:
                done = await self._consensus.remove_member(node, timeout=STEP_TIMEOUT_S)
            except (ConsensusError, ProposalRefused) as exc:
                done, why = False, str(exc) or type(exc).__name__
            if done:
                log.warning("node %s, gone from the State, taken out of the Raft membership", node)
                self._forget(node)
                continue
            self._next_try[node] = (trio.current_time() + delay, min(MAX_RETRY_S, delay * 2))
            log.warning(
                "node %s is gone from the State but still a Raft member (%s); trying again in %g s",
                node,
                why,
                delay,
            )

    def _forget(self, node: str) -> None:
        self._stale_since.pop(node, None)
        self._next_try.pop(node, None)
        self.tries.pop(node, None)
