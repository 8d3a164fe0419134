"""Who should vote: the leader's membership policy for live clusters (pure).

A node that joins a running cluster starts empty; the leader adds it as a *learner* once it is
linked, and promotes learners whose log has caught up while the cluster has fewer voters than
it wants. The number of voters wanted is the largest odd number not above ``max_voters`` nor
the number of members: an even count tolerates no more failures than the odd count below it,
while needing one more node for a quorum. Nodes are never removed automatically: a node that
is merely down for a while must come back as the voter it was (an operator removes a node that
is gone for good).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from ._types import ConfChange, ConfState, NodeId

DEFAULT_MAX_VOTERS = 5


def wanted_voters(members: int, max_voters: int = DEFAULT_MAX_VOTERS) -> int:
    """The largest odd number ``<= min(members, max_voters)`` (at least 1)."""
    n = max(1, min(members, max_voters))
    return n if n % 2 else n - 1


def next_change(
    conf: ConfState,
    linked: Collection[NodeId],
    caught_up: Callable[[NodeId], bool],
    *,
    max_voters: int = DEFAULT_MAX_VOTERS,
) -> ConfChange | None:
    """The one membership change the leader should propose now, if any: first add every
    linked node that is not a member as a learner, then promote caught-up learners (in name
    order, so the choice is deterministic) up to :func:`wanted_voters`."""
    members = set(conf.members())
    for node in sorted(set(linked) - members):
        return ConfChange("add_learner", node)
    if len(conf.voters) < wanted_voters(len(members), max_voters):
        for node in conf.learners:
            if caught_up(node):
                return ConfChange("promote", node)
    return None
