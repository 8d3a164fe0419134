"""The liveness check that follows ``heal_all``.

Once every fault is healed (the network whole again, crashed nodes restarted, paused ones
resumed, disks with space), a cluster that still has a majority of its voters must elect a
leader within 5 maximal election timeouts and then commit and acknowledge a probe command
within 5 more. Voters lost for good (a corrupt disk refuses to start) excuse the check only
when they are at least half of the voters of some configuration in play (the committed one, or
one a node appended: a change that leaves no live majority blocks the cluster for good --
FINDING 2 in the simulator's report).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

import attrs

from skulk.consensus import RaftCore
from skulk.sim._invariants import Violation


@attrs.define
class Liveness:
    """``window``: 5 maximal election timeouts, in ticks."""

    window: int
    healed_at: int | None = None
    leader_seen_at: int | None = None
    probe_acked_at: int | None = None
    note: str = "not checked"

    def start(self, now: int) -> None:
        """Everything was healed at ``now`` (only the first heal counts)."""
        if self.healed_at is None:
            self.healed_at = now

    def deadlines(self) -> tuple[int, int] | None:
        """(leader by, probe acknowledged by), once healed."""
        if self.healed_at is None:
            return None
        return self.healed_at + self.window, self.healed_at + 2 * self.window

    def open(self, now: int) -> bool:
        """Whether the run must go on to settle the check."""
        d = self.deadlines()
        return d is not None and self.probe_acked_at is None and now <= d[1]

    def check(
        self, now: int, *, has_leader: bool, probe_acked: bool, voters: int, lost: int
    ) -> Violation | None:
        """Called every tick; returns the violation once a deadline passed unmet."""
        d = self.deadlines()
        if d is None:
            return None
        healed = self.healed_at or 0
        if self.leader_seen_at is None and has_leader:
            self.leader_seen_at = now
        if self.probe_acked_at is None and probe_acked:
            self.probe_acked_at = now
        if self.probe_acked_at is not None:
            self.note = (
                f"leader at +{(self.leader_seen_at or now) - healed}, "
                f"probe acknowledged at +{self.probe_acked_at - healed}"
            )
            return None
        if 2 * lost >= voters:
            self.note = f"skipped: {lost} of {voters} voters lost to corrupt disks"
            self.healed_at = None
            return None
        leader_by, probe_by = d
        if self.leader_seen_at is None and now >= leader_by:
            detail = f"no leader within {self.window} ticks of healing"
            return Violation("liveness", now, "", detail)
        if now >= probe_by:
            return Violation(
                "liveness",
                now,
                "",
                f"probe command not acknowledged within {2 * self.window} ticks of healing",
            )
        return None


def voter_sets(
    founders: tuple[str, ...], cores: Iterable[RaftCore | None]
) -> list[tuple[str, ...]]:
    """Every voter set in play: the founders, and each running core's latest and committed
    configuration (an empty joiner knows none)."""
    sets = [founders]
    for core in cores:
        if core is not None and core.conf.voters:
            sets += [core.conf.voters, core.log.conf_at(core.commit).voters]
    return sets


def worst_voter_set(
    voter_sets: Sequence[tuple[str, ...]], lost_nodes: Collection[str]
) -> tuple[int, int]:
    """``(voters, lost)`` of the voter set that lost the largest share of its voters for good
    (one that lost half or more first)."""

    def lost(voters: tuple[str, ...]) -> int:
        return sum(1 for n in voters if n in lost_nodes)

    worst = max(voter_sets, key=lambda v: (2 * lost(v) >= len(v), lost(v)))
    return len(worst), lost(worst)
