"""What a leader knows about each follower's log (Raft's nextIndex/matchIndex, plus flow
control): one :class:`Progress` per member other than the leader."""

from __future__ import annotations

import enum

import attrs

from ._types import Snapshot


class Replication(enum.Enum):
    PROBE = "probe"
    """Looking for the match point: one AppendRequest at a time."""
    REPLICATE = "replicate"
    """Match found: stream entries, up to ``max_inflight`` requests unacknowledged."""
    SNAPSHOT = "snapshot"
    """Sending a snapshot in chunks, one chunk in flight."""


@attrs.define
class Progress:
    match: int = 0
    next: int = 1
    state: Replication = Replication.PROBE
    inflight: list[int] = attrs.Factory(list)
    """Last index of each AppendRequest sent and not yet acknowledged (REPLICATE)."""
    probe_sent: bool = False
    """PROBE: a request is out; wait for its reply or the next heartbeat."""
    recent_active: bool = False
    """Heard from since the last CheckQuorum round."""
    snapshot: Snapshot | None = None
    snapshot_offset: int = 0
    """SNAPSHOT: bytes the follower acknowledged."""
    snapshot_waiting: bool = False
    stalled_heartbeats: int = 0
    """REPLICATE: heartbeats since an acknowledgement brought news while requests were out."""

    def become_probe(self) -> None:
        self.stalled_heartbeats = 0
        self.state = Replication.PROBE
        self.next = self.match + 1
        self.inflight.clear()
        self.probe_sent = False
        self.snapshot = None

    def become_replicate(self) -> None:
        self.state = Replication.REPLICATE
        self.next = self.match + 1
        self.inflight.clear()
        self.snapshot = None

    def become_snapshot(self, snapshot: Snapshot) -> None:
        self.state = Replication.SNAPSHOT
        self.inflight.clear()
        self.snapshot = snapshot
        self.snapshot_offset = 0
        self.snapshot_waiting = False

    def on_heartbeat(self) -> None:
        """Once per heartbeat interval: allow a new probe or snapshot chunk (the last may have
        been lost) and, if pipelined requests brought no acknowledgement for two intervals,
        assume they were lost and probe again from the match point."""
        self.probe_sent = False
        self.snapshot_waiting = False
        if self.state is Replication.REPLICATE and self.inflight:
            self.stalled_heartbeats += 1
            if self.stalled_heartbeats >= 2:
                self.become_probe()

    def acknowledge(self, index: int) -> bool:
        """The follower matches through ``index``; returns whether that is news."""
        self.inflight = [i for i in self.inflight if i > index]
        self.probe_sent = False
        if index > self.match:
            self.stalled_heartbeats = 0
            self.match = index
            self.next = max(self.next, index + 1)
            return True
        return False
