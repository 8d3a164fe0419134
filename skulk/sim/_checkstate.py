"""What the invariant checker (:mod:`skulk.sim._invariants`) records and reports: violations,
each node's track (a mirror of its durable log as a hash chain), and the checker's shared state.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable

import attrs

from skulk.consensus import Entry, HardState, Role
from skulk.sim._statemachine import INITIAL, MACHINE, Machine, SmState
from skulk.wire.cluster import ClusterCommand, ClusterResult

Ack = tuple[str, int, int, int, bytes]
"""An acknowledged command: ``(client_id, seq, index, term, result)``."""

GENESIS = b"\x00" * 32


@attrs.frozen
class Violation:
    """A broken invariant: its ``name``, when (tick), where (node, or ``""``) and details."""

    name: str
    time: int
    node: str
    details: str

    def __str__(self) -> str:
        where = f" on {self.node}" if self.node else ""
        return f"{self.name} at t={self.time}{where}: {self.details}"


class ViolationFound(Exception):
    def __init__(self, violation: Violation) -> None:
        super().__init__(str(violation))
        self.violation = violation


def chain_hash(prev: bytes, entry: Entry) -> bytes:
    """The hash chain link for ``entry`` after a prefix whose chain hash is ``prev``."""
    conf = f"{entry.conf.op}:{entry.conf.node}" if entry.conf is not None else ""
    head = f"{entry.index}|{entry.term}|{entry.kind.value}|{entry.client_id}|{entry.seq}|{conf}|"
    return hashlib.sha256(prev + head.encode() + entry.data).digest()


@attrs.define
class NodeTrack:
    """What the checker knows about one node."""

    snap_index: int = 0
    snap_term: int = 0
    snap_chain: bytes | None = None
    log: dict[int, tuple[int, bytes]] = attrs.Factory(dict)
    last: int = 0
    hs: HardState = attrs.Factory(HardState)
    started: bool = False
    life_term: int = 0
    life_commit: int = 0
    applied: int = 0
    max_applied: int = 0
    """Highest index applied in any life (applied must get back there after a restart)."""
    leader_term: int = 0
    role: Role | None = None
    prevote_grants: dict[int, set[str]] = attrs.Factory(dict)
    truncations: int = 0
    restores: int = 0

    def chain_at(self, index: int) -> bytes | None:
        if index == self.snap_index:
            return self.snap_chain
        got = self.log.get(index)
        return got[1] if got is not None else None

    def term_at(self, index: int) -> int | None:
        if index == self.snap_index:
            return self.snap_term
        got = self.log.get(index)
        return got[0] if got is not None else None


class CheckerState:
    """The checker's records and helpers, shared by its parts (:class:`~._invariants.Checker`
    is assembled from this base, :class:`~._applychecks.ApplyChecks` and the Raft checks)."""

    def __init__(
        self,
        clock: Callable[[], int],
        *,
        require_pre_vote: bool = True,
        machine: Machine = MACHINE,
    ) -> None:
        self._clock = clock
        self.require_pre_vote = require_pre_vote
        self.machine = machine
        self.tracks: dict[str, NodeTrack] = {}
        self.chains: dict[tuple[int, int], bytes] = {(0, 0): GENESIS}
        self.leaders: dict[int, str] = {}
        self.commit_by_term: dict[int, int] = {}
        self.committed: dict[int, bytes] = {}
        self.applied_entries: dict[int, Entry] = {}
        self.applied_state: dict[int, SmState] = {0: INITIAL}
        self.applied_results: dict[int, bytes] = {}
        self._decoded: dict[int, tuple[ClusterCommand | None, ClusterResult | None]] = {}
        self.command_stats: dict[str, int] = {}
        """After :meth:`final_replay`: ``"Kind:applied"`` / ``"Kind:reason"`` -> how many
        effective commands of the log had that outcome."""

    # --- helpers ------------------------------------------------------------------------

    def fail(self, name: str, node: str, details: str) -> None:
        raise ViolationFound(Violation(name, self._clock(), node, details))

    def track(self, node: str) -> NodeTrack:
        tr = self.tracks.get(node)
        if tr is None:
            tr = self.tracks[node] = NodeTrack()
        return tr

    def max_committed(self) -> int:
        return max(self.commit_by_term.values(), default=0)
