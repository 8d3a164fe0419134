"""The world: a single-threaded discrete-event loop over nodes, network, disks, clients, faults.

Time is an integer tick. Within tick ``t`` the world, in this fixed order:

1. runs the plan's actions due at ``t`` (in plan order), then the triggered actions due at
   ``t`` (:mod:`skulk.sim._triggers`), and retries pending admin requests;
2. delivers every message due at ``t`` (in send order; a message sent at ``t`` arrives at
   ``t + 1`` at the earliest). A message to a node that is not running is lost, to a paused
   node it queues, over a link that is down now it is lost;
3. gives each running, unpaused node one ``Tick`` (in node order); DEGRADED nodes retry their
   storage every ``degraded_retry`` ticks; crashed-by-I/O-error nodes restart after
   ``restart_delay``;
4. lets the clients submit -- a leader that takes a submission decides its cluster command
   then, from its own applied State and clock (:mod:`skulk.sim._commands`); checks liveness
   once everything was healed.

Every randomness comes from ``random.Random`` instances derived from the seed by name
(``f"{seed}:network"``, ``f"{seed}:workload"``, ``f"{seed}:commands"``,
``f"{seed}:disk:{node}"``...), so one seed
(plus the plan and configuration) decides the whole run and its :class:`Trace` hash. The
invariant checker sees every step (:class:`World` is the nodes' observer); the first
violation, or an exception escaping the core or storage, stops the run.

:class:`World` is one object in three files: its state, node primitives and node observer
(:mod:`._worldbase`), the fault plan's actions (:mod:`._worldfaults`) and, here, the loop.
"""

from __future__ import annotations

import heapq
import traceback

from skulk.consensus import NotLeader, ProposalRefused, Propose, Tick
from skulk.sim._invariants import Violation, ViolationFound
from skulk.sim._liveness import voter_sets, worst_voter_set
from skulk.sim._node import NodeStatus
from skulk.sim._workload import Answer, Outcome
from skulk.sim._worldbase import ACK_CHECK_TICKS, PROBE_CLIENT
from skulk.sim._worldfaults import FaultActions

__all__ = ["World"]


class World(FaultActions):
    """One simulation run. Build it, then :meth:`run` it once."""

    # --- the loop ---------------------------------------------------------------------

    def run(self, until: int | None = None) -> Violation | None:
        """Run to ``until`` (default: ``config.steps``, extended while a liveness check is
        still open); returns the first violation, if any."""
        until = self.config.steps if until is None else until
        plan = list(self.plan)
        cursor = 0
        try:
            for nid in self.node_ids:
                self._send(self.nodes[nid].start())
            while self.now < until or self.liveness.open(self.now):
                now = self.now
                while cursor < len(plan) and plan[cursor].at <= now:
                    self._apply(plan[cursor])
                    cursor += 1
                for triggered in self.triggers.due(now):
                    self._apply(triggered)
                if self.admin.pending:
                    self.admin.run(now, self.leader, self._step_and_send)
                self._deliver(now)
                self._tick_nodes(now)
                self.workload.tick(now, self._submit)
                self._check_liveness(now)
                for hook in self.at_tick_end.pop(now, ()):
                    hook()
                if now % ACK_CHECK_TICKS == 0:
                    self._check_new_acks()
                self.now += 1
            self.checker.final_replay(
                (a.client, a.seq, a.index, a.term, a.result) for a in self.workload.acks
            )
        except ViolationFound as found:
            self.violation = found.violation
        except Exception as exc:
            frames = traceback.extract_tb(exc.__traceback__)
            last = frames[-1] if frames else None
            where = f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno}" if last else ""
            self.violation = Violation("exception", self.now, "", f"{exc!r} at {where}")
        if self.violation is not None:
            self.trace.add(f"{self.now} VIOLATION {self.violation}")
        return self.violation

    def _check_new_acks(self) -> None:
        acks = self.workload.acks
        new = acks[self._acks_checked :]
        self.checker.check_acks((a.client, a.seq, a.index, a.term, a.result) for a in new)
        self._acks_checked = len(acks)

    def _deliver(self, now: int) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, m = heapq.heappop(heap)
            node = self.nodes.get(m.dst)
            if node is None or not node.up:
                self.trace.add(f"{now} X {m.src}>{m.dst} down")
                continue
            if self.network.blocked(m.src, m.dst, now, type(m.payload).__name__):
                self.trace.add(f"{now} X {m.src}>{m.dst} cut")
                continue
            if node.paused:
                self._inbox[m.dst].append(m)
                continue
            self._receive(node, m)

    def _tick_nodes(self, now: int) -> None:
        for nid in self.node_ids:
            node = self.nodes[nid]
            if node.paused:
                continue
            status = node.status
            if status is NodeStatus.UP:
                self._send(node.step(Tick()))
            elif status is NodeStatus.DEGRADED:
                since = self._degraded_since.get(nid, now)
                if (now - since) % self.config.degraded_retry == 0 and now > since:
                    self.trace.add(f"{now} N {nid} retry-storage")
                    self._start(node)
            elif status is NodeStatus.DOWN and self._restart_at.get(nid, now + 1) <= now:
                self._start(node)

    # --- clients ----------------------------------------------------------------------

    def _submit(self, nid: str, client_id: str, seq: int, data: bytes) -> Answer:
        node = self.nodes[nid]
        if node.paused:
            return Answer(outcome=Outcome.NO_ANSWER)
        if not node.up:
            return Answer(outcome=Outcome.DOWN)
        self._last_proposed = None
        self._captured = []
        self._capturing = nid
        try:
            out = node.step(Propose(data, client_id, seq))
        except NotLeader as exc:
            return Answer(outcome=Outcome.NOT_LEADER, hint=exc.leader)
        except ProposalRefused:
            return Answer(outcome=Outcome.REFUSED)
        finally:
            self._capturing = ""
        position = self._last_proposed
        self._send(out)
        if position is None:  # went down persisting it
            return Answer(outcome=Outcome.DOWN)
        return Answer(position=position, applied=tuple(self._captured))

    # --- liveness ---------------------------------------------------------------------

    def _check_liveness(self, now: int) -> None:
        if self.liveness.deadlines() is None:
            return
        corrupt = {n for n in self.node_ids if self.nodes[n].status is NodeStatus.CORRUPT}
        cores = (self.nodes[n].core for n in self.node_ids)
        voters, lost = worst_voter_set(voter_sets(self.config.founders, cores), corrupt)
        violation = self.liveness.check(
            now,
            has_leader=self.leader() is not None,
            probe_acked=self.workload.acked_by(PROBE_CLIENT) > 0,
            voters=voters,
            lost=lost,
        )
        if violation is not None:
            raise ViolationFound(violation)
