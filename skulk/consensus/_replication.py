"""Log replication: AppendEntries with fast backtracking and pipelining, chunked
InstallSnapshot (both sides), and commitment through current-term entries (Raft §5.3, §5.4.2,
§7). Part of :class:`~skulk.consensus.RaftCore`."""

from __future__ import annotations

from ._corestate import CoreState, Role
from ._progress import Progress, Replication
from ._types import (
    AppendReply,
    AppendRequest,
    Entry,
    NodeId,
    Snapshot,
    SnapshotChunk,
    SnapshotReply,
    TimeoutNow,
)


class Replicator(CoreState):
    def _heard_from_leader(self, src: NodeId) -> None:
        if self.role is not Role.FOLLOWER or self.leader != src:
            self._become_follower(self.term, src)
        self._election_elapsed = 0

    def _on_append(self, src: NodeId, p: AppendRequest) -> None:
        self._heard_from_leader(src)
        if self._snapshot is None:  # never initialised: it starts from a snapshot
            self._send(src, AppendReply(self.term, False, p.prev_index, needs_snapshot=True))
            return
        if p.prev_index < self.commit:
            self._send(src, AppendReply(self.term, True, self.commit))
            return
        if self.log.term_at(p.prev_index) != p.prev_term:
            hint = min(p.prev_index, self.log.last_index)
            hint_index, hint_term = self.log.find_conflict_by_term(hint, p.prev_term)
            self._send(src, AppendReply(self.term, False, p.prev_index, hint_index, hint_term))
            return
        conflict, added = self.log.merge(p.entries, self.commit)
        if conflict:
            self._note_truncation(conflict)
        self._out_entries.extend(added)
        last_new = p.prev_index + len(p.entries)
        self.commit = max(self.commit, min(p.commit, last_new))
        self._send(src, AppendReply(self.term, True, last_new))

    def _on_snapshot_chunk(self, src: NodeId, p: SnapshotChunk) -> None:
        self._heard_from_leader(src)
        meta = p.meta
        if meta.index <= self.commit and self._snapshot is not None:
            self._incoming = None
            self._send(src, SnapshotReply(self.term, meta.index, p.offset + len(p.data), True))
            return
        if p.offset == 0 or self._incoming is None or self._incoming[0] != meta:
            self._incoming = (meta, bytearray())
        buf = self._incoming[1]
        if p.offset != len(buf):
            self._send(src, SnapshotReply(self.term, meta.index, len(buf), False))
            return
        buf += p.data
        if not p.done:
            self._send(src, SnapshotReply(self.term, meta.index, len(buf), False))
            return
        self._incoming = None
        self._install(Snapshot(meta, bytes(buf)))
        self._send(src, SnapshotReply(self.term, meta.index, len(buf), True))

    def _install(self, snap: Snapshot) -> None:
        self.log.restore(snap.meta)
        self._snapshot = snap
        self.commit = snap.meta.index
        self.applied = snap.meta.index
        self._out_snapshot = snap
        self._out_restore = True
        # Storage drops its whole log when it installs a leader's snapshot; re-persist what
        # we kept after it.
        self._out_entries = list(self.log.slice(snap.meta.index + 1, self.log.last_index))

    def _broadcast(self) -> None:
        for peer in self._progress:
            self._send_append(peer)

    def _send_append(self, peer: NodeId, heartbeat: bool = False) -> None:
        pr = self._progress.get(peer)
        if pr is None:  # no longer leader, or the peer was removed
            return
        if pr.state is Replication.SNAPSHOT:
            self._send_snapshot_chunk(peer, pr)
            return
        if pr.state is Replication.PROBE and pr.probe_sent:
            return
        if pr.state is Replication.REPLICATE and len(pr.inflight) >= self.config.max_inflight:
            if heartbeat and self.log.term_at(pr.match) is not None:
                # keep the follower's lease and commit index fresh without touching its log
                self._send_entries(peer, pr.match, ())
            return
        prev = pr.next - 1
        if self.log.term_at(prev) is None:
            assert self._snapshot is not None, "log compacted without a snapshot"
            pr.become_snapshot(self._snapshot)
            self._send_snapshot_chunk(peer, pr)
            return
        last = min(self.log.last_index, prev + self.config.max_append_entries)
        entries = self.log.slice(prev + 1, last)
        if not entries and not heartbeat and pr.state is Replication.REPLICATE:
            return
        self._send_entries(peer, prev, entries)
        if pr.state is Replication.PROBE:
            pr.probe_sent = True
        elif entries:
            pr.inflight.append(entries[-1].index)
            pr.next = entries[-1].index + 1

    def _send_entries(self, peer: NodeId, prev: int, entries: tuple[Entry, ...]) -> None:
        prev_term = self.log.term_at(prev)
        assert prev_term is not None
        # The follower commits only up to what it verified matches: sending ours is safe.
        self._send(peer, AppendRequest(self.term, prev, prev_term, entries, self.commit))

    def _send_snapshot_chunk(self, peer: NodeId, pr: Progress) -> None:
        if pr.snapshot_waiting:
            return
        snap = pr.snapshot
        assert snap is not None
        start = pr.snapshot_offset
        chunk = snap.data[start : start + self.config.snapshot_chunk_bytes]
        done = start + len(chunk) >= len(snap.data)
        self._send(peer, SnapshotChunk(self.term, snap.meta, start, chunk, done))
        pr.snapshot_waiting = True

    def _on_append_reply(self, src: NodeId, p: AppendReply) -> None:
        pr = self._progress.get(src)
        if self.role is not Role.LEADER or pr is None:
            return
        pr.recent_active = True
        if p.success:
            if pr.acknowledge(p.index):
                if pr.state is Replication.PROBE:
                    pr.become_replicate()
                self._maybe_commit()
                if src == self._transfer_target and pr.match == self.log.last_index:
                    self._send(src, TimeoutNow(self.term))
            elif pr.state is Replication.PROBE:
                pr.become_replicate()
            self._send_append(src)
            return
        if p.needs_snapshot:
            if pr.state is not Replication.SNAPSHOT and self._snapshot is not None:
                pr.become_snapshot(self._snapshot)
                self._send_snapshot_chunk(src, pr)
            return
        if p.index <= pr.match or pr.state is Replication.SNAPSHOT:
            return  # stale rejection
        if pr.state is Replication.PROBE and p.index != pr.next - 1:
            return  # stale rejection of an earlier probe
        probe, _ = self.log.find_conflict_by_term(p.hint_index, p.hint_term)
        pr.become_probe()
        pr.next = max(min(p.index, probe + 1), pr.match + 1)
        self._send_append(src)

    def _on_snapshot_reply(self, src: NodeId, p: SnapshotReply) -> None:
        pr = self._progress.get(src)
        if self.role is not Role.LEADER or pr is None:
            return
        pr.recent_active = True
        if pr.state is not Replication.SNAPSHOT or pr.snapshot is None:
            if p.done and pr.acknowledge(p.index):
                self._maybe_commit()
            return
        if p.index != pr.snapshot.meta.index:
            return
        if p.done:
            pr.acknowledge(p.index)
            pr.become_probe()
            self._maybe_commit()
            self._send_append(src)
            return
        pr.snapshot_offset = p.offset
        pr.snapshot_waiting = False
        self._send_snapshot_chunk(src, pr)

    def _rule_can_commit(self, index: int) -> bool:
        """Raft §5.4.2: a leader commits by counting replicas only entries of its own term."""
        return self.log.term_at(index) == self.term

    def _maybe_commit(self) -> None:
        voters = self.conf.voters
        if not voters:
            return
        matches = sorted(
            (self.log.last_index if v == self.node_id else self._match_of(v) for v in voters),
            reverse=True,
        )
        candidate = matches[len(voters) // 2]
        if candidate > self.commit and self._rule_can_commit(candidate):
            self.commit = candidate
            self._on_commit_advanced()

    def _match_of(self, peer: NodeId) -> int:
        pr = self._progress.get(peer)
        return pr.match if pr else 0

    def _on_commit_advanced(self) -> None:
        if self.node_id not in self.conf.members() and self.log.last_conf_index() <= self.commit:
            # Our removal is committed: hand the cluster over by stepping down (§4.2.2).
            self._become_follower(self.term, None)
            return
        self._broadcast()
