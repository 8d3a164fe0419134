"""Elections: PreVote, votes, leader stickiness, and the target's side of a leadership transfer
(Raft §5.2, dissertation §9.6, §4.2.3, §3.10). Part of :class:`~skulk.consensus.RaftCore`."""

from __future__ import annotations

from ._corestate import CoreState, Role
from ._types import (
    NodeId,
    Payload,
    VoteReply,
    VoteRequest,
)


class Election(CoreState):
    def _campaign(self, transfer: bool) -> None:
        """Start an election: first a PreVote round (unless disabled or asked for by a
        leader transferring leadership), which changes no term and so cannot disrupt a
        cluster that still has a leader."""
        self.elections_started += 1
        if self.config.pre_vote and not transfer:
            self._reset(self.term)
            self.role = Role.PRE_CANDIDATE
            self._votes[self.node_id] = True
            if self._won():
                self._real_campaign(transfer)
                return
            request = VoteRequest(
                self.term + 1, self.log.last_index, self.log.last_term, pre_vote=True
            )
            self._send_to_voters(request)
        else:
            self._real_campaign(transfer)

    def _real_campaign(self, transfer: bool) -> None:
        self._reset(self.term + 1)
        self.role = Role.CANDIDATE
        self.vote = self.node_id
        self._votes[self.node_id] = True
        if self._won():
            self._become_leader()
            return
        request = VoteRequest(self.term, self.log.last_index, self.log.last_term, transfer=transfer)
        self._send_to_voters(request)

    def _send_to_voters(self, payload: Payload) -> None:
        for v in self.conf.voters:
            if v != self.node_id:
                self._send(v, payload)

    def _won(self) -> bool:
        voters = self.conf.voters
        granted = sum(1 for v in voters if self._votes.get(v) is True)
        return granted * 2 > len(voters)

    def _lost(self) -> bool:
        voters = self.conf.voters
        refused = sum(1 for v in voters if self._votes.get(v) is False)
        return refused * 2 >= len(voters) and len(voters) > 0

    def _in_lease(self) -> bool:
        """Leader stickiness: we heard from a live leader less than an election timeout ago,
        so a vote request from a higher term is ignored (it comes from a node that is
        partitioned, removed, or simply impatient)."""
        return (
            self.config.check_quorum
            and self.leader is not None
            and self._election_elapsed < self.config.election_ticks
        )

    def _on_vote_request(self, src: NodeId, p: VoteRequest) -> None:
        up_to_date = self.log.is_up_to_date(p.last_index, p.last_term)
        if p.pre_vote:
            can = p.term > self.term or (self.vote in (None, src) and self.leader is None)
            if can and up_to_date:
                if self.role is Role.FOLLOWER:
                    # Give the pre-candidate time for its real election instead of starting a
                    # rival one: that split vote is what stalls a cluster one node from losing
                    # its quorum. We grant only once our leader's lease ran out, so we forget
                    # that leader too: a restarted timer must not revive its lease.
                    self._election_elapsed = 0
                    self.leader = None
                self._send(src, VoteReply(p.term, True, pre_vote=True))
            else:  # with our own term, so a pre-candidate behind us learns it
                self._send(src, VoteReply(self.term, False, pre_vote=True))
            return
        can = self.vote == src or (self.vote is None and self.leader is None)
        if can and up_to_date:
            self.vote = src
            self._election_elapsed = 0
            self._send(src, VoteReply(self.term, True))
        else:
            self._send(src, VoteReply(self.term, False))

    def _rule_vote_reply_counts(self, p: VoteReply) -> bool:
        """Only a reply for the election under way counts (its term, its kind)."""
        if p.pre_vote:
            return self.role is Role.PRE_CANDIDATE and p.term == self.term + 1
        return self.role is Role.CANDIDATE and p.term == self.term

    def _on_vote_reply(self, src: NodeId, p: VoteReply) -> None:
        if self.role not in (Role.PRE_CANDIDATE, Role.CANDIDATE):
            return
        if not self._rule_vote_reply_counts(p):
            return
        self._votes.setdefault(src, p.granted)
        if self._won():
            if self.role is Role.PRE_CANDIDATE:
                self._real_campaign(transfer=False)
            else:
                self._become_leader()
        elif self._lost():
            self._become_follower(self.term, None)

    def _on_timeout_now(self) -> None:
        if self._promotable():
            self._campaign(transfer=True)
