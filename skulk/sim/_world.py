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
"""

from __future__ import annotations

import heapq
import random
import traceback
from collections.abc import Callable, Sequence

from skulk.cluster import encode_command
from skulk.consensus import (
    Entry,
    Input,
    LogPosition,
    Message,
    NotLeader,
    ProposalRefused,
    Propose,
    Ready,
    Receive,
    Recovered,
    Role,
    Snapshot,
    Storage,
    StorageCorrupt,
    Tick,
    verified_regions,
)
from skulk.sim._admin import Admin
from skulk.sim._commands import CommandMaker
from skulk.sim._config import SimConfig
from skulk.sim._crashdisk import CrashingDisk
from skulk.sim._disk import SimDisk
from skulk.sim._faults import Action, bind_leader, names_leader
from skulk.sim._invariants import Checker, Violation, ViolationFound
from skulk.sim._liveness import Liveness, voter_sets, worst_voter_set
from skulk.sim._mutants import NONE, Mutant
from skulk.sim._network import NETWORK_OPS, LinkParams, SimNetwork
from skulk.sim._node import NodeSettings, NodeStatus, OpenStorage, SimNode, StorageLike
from skulk.sim._statemachine import SmState
from skulk.sim._trace import Trace, describe
from skulk.sim._triggers import Triggers
from skulk.sim._workload import Answer, Outcome, Workload

PROBE_CLIENT = "probe"
SCENARIO_CLIENT = "sc"
ACK_CHECK_TICKS = 100


class World:
    """One simulation run. Build it, then :meth:`run` it once."""

    def __init__(
        self,
        seed: int,
        config: SimConfig,
        plan: Sequence[Action],
        *,
        mutant: Mutant = NONE,
        storage: OpenStorage | None = None,
        trace_sink: Callable[[str], None] | None = None,
    ) -> None:
        self.seed = seed
        self.config = config
        self.plan = tuple(sorted(plan, key=lambda a: a.at))
        self.mutant = mutant
        self.now = 0
        self.trace = Trace(trace_sink)
        self.node_ids = config.node_ids
        self.network = SimNetwork(
            random.Random(f"{seed}:network"),
            self.node_ids,
            LinkParams(config.drop, config.dup, config.delay_lo, config.delay_hi),
        )
        self.checker = Checker(
            lambda: self.now, require_pre_vote=config.pre_vote, machine=mutant.machine("replay")
        )
        self.commands = CommandMaker(
            random.Random(f"{seed}:commands"), self.node_ids, running=self._running
        )
        self.workload = Workload(
            random.Random(f"{seed}:workload"),
            self.node_ids,
            clients=config.clients,
            rate=config.command_rate,
            timeout=config.timeout,
            trace=self.trace.add,
            compose=self._compose,
        )
        raft = mutant.raft(config.raft())
        segment_bytes = config.segment_bytes

        def open_storage(disk: CrashingDisk) -> tuple[StorageLike, Recovered]:
            return Storage.open(disk, segment_bytes=segment_bytes)

        opener = mutant.open_storage(storage or open_storage)
        founders = config.founders
        self.disks: dict[str, SimDisk] = {}
        self.nodes: dict[str, SimNode] = {}
        for nid in self.node_ids:
            disk = SimDisk(random.Random(f"{seed}:disk:{nid}"))
            self.disks[nid] = disk
            self.nodes[nid] = SimNode(
                nid,
                NodeSettings(
                    raft=raft,
                    founders=founders if nid in founders else None,
                    compact_every=config.compact_every,
                    impure_apply=config.impure_apply,
                ),
                sim_disk=disk,
                disk=CrashingDisk(disk, skip_fsync=mutant.skip_fsync),
                open_storage=opener,
                make_core=mutant.make_core(),
                seed=seed,
                observer=self,
                machine=mutant.machine(nid),
            )
        self._heap: list[tuple[int, int, Message]] = []
        self._seq = 0
        self._inbox: dict[str, list[Message]] = {n: [] for n in self.node_ids}
        self._restart_at: dict[str, int] = {}
        self._degraded_since: dict[str, int] = {}
        self.admin = Admin(self.trace.add)
        self.triggers = Triggers()
        self._acks_checked = 0
        self._capturing = ""
        """The node a submission is being made to: entries it applies meanwhile are captured."""
        self._captured: list[tuple[Entry, bytes]] = []
        self.liveness = Liveness(window=5 * config.election_timeout_max)
        self.violation: Violation | None = None
        self.error: Exception | None = None
        """The exception behind an ``exception`` violation (for debugging)."""
        self.counters: dict[str, int] = {
            "crashes": 0,
            "restarts": 0,
            "degraded": 0,
            "corrupt": 0,
            "restores": 0,
            "applied": 0,
            "persists": 0,
            "delivered": 0,
            "elections": 0,
        }
        self.at_tick_end: dict[int, list[Callable[[], None]]] = {}
        """Callbacks run at the end of a tick (scenario checks); they may raise
        ViolationFound."""
        self.crashes_by_node: dict[str, int] = dict.fromkeys(self.node_ids, 0)
        """Crashes of any kind (planned, I/O error, death during a write)."""
        self.degraded_by_node: dict[str, int] = dict.fromkeys(self.node_ids, 0)
        """Times storage refused a write (disk full) and the node dropped its core."""
        self.restores_by_node: dict[str, int] = dict.fromkeys(self.node_ids, 0)
        """Snapshots installed from a leader (not counting the restore at start-up)."""

    # --- queries ------------------------------------------------------------------------

    def leader(self) -> SimNode | None:
        """The running leader with the highest term (None if no node leads)."""
        best: SimNode | None = None
        for nid in self.node_ids:
            node = self.nodes[nid]
            core = node.core
            if node.up and not node.paused and core is not None and core.role is Role.LEADER:
                if best is None or (best.core is not None and core.term > best.core.term):
                    best = node
        return best

    # --- the loop -----------------------------------------------------------------------

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

    def _send(self, messages: list[Message]) -> None:
        now = self.now
        add = self.trace.add
        for m in messages:
            times = self.network.send(m.src, m.dst, now, type(m.payload).__name__)
            add(f"{now} S {describe(m)} {times}")
            for t in times:
                self._seq += 1
                heapq.heappush(self._heap, (t, self._seq, m))

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

    def _receive(self, node: SimNode, m: Message) -> None:
        self.counters["delivered"] += 1
        self.checker.on_deliver(m)
        self._send(node.step(Receive(m)))

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

    def _step_and_send(self, node: SimNode, inp: Input) -> None:
        self._send(node.step(inp))

    def _start(self, node: SimNode) -> None:
        self._restart_at.pop(node.node_id, None)
        self.trace.add(f"{self.now} N {node.node_id} start {node.incarnation + 1}")
        self.counters["restarts"] += 1
        self._send(node.start())

    # --- clients ------------------------------------------------------------------------

    def _running(self, nid: str) -> bool:
        node = self.nodes[nid]
        return node.up and not node.paused

    def _compose(self, nid: str, client_id: str, seq: int, now: int) -> bytes:
        """The cluster command ``nid`` proposes for ``(client_id, seq)``, decided from its own
        applied State and clock (nothing, when it cannot take a proposal now)."""
        node = self.nodes[nid]
        core = node.core
        if not self._running(nid) or core is None or core.role is not Role.LEADER:
            return b""
        command = self.commands.make(node.state.cluster, nid, client_id, seq, now)
        self.trace.add(f"{now} K {client_id} {seq} {nid} {type(command).__name__}")
        return encode_command(command)

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

    _last_proposed: LogPosition | None = None

    # --- node observer ------------------------------------------------------------------

    def on_recovered(self, node: SimNode, recovered: Recovered) -> None:
        self.checker.on_recovered(node.node_id, recovered, node.clean)
        snap = recovered.snapshot.meta.index if recovered.snapshot else None
        self.trace.add(
            f"{self.now} R {node.node_id} hs={recovered.hard_state.term}/"
            f"{recovered.hard_state.vote}/{recovered.hard_state.commit} snap={snap} "
            f"n={len(recovered.entries)}"
        )

    def on_persisted(self, node: SimNode, ready: Ready) -> None:
        core = node.core
        role = core.role if core is not None else Role.FOLLOWER
        term = core.term if core is not None else 0
        self.counters["persists"] += 1
        self.checker.on_persisted(node.node_id, ready, role, term)
        hs = ready.hard_state
        snap = ready.snapshot
        first = ready.entries[0].index if ready.entries else 0
        self.trace.add(
            f"{self.now} P {node.node_id} e{first}+{len(ready.entries)} "
            f"{f'hs{hs.term}/{hs.vote}/{hs.commit}' if hs else ''}"
            f"{f' s{snap.meta.index}@{snap.meta.term}' if snap else ''}"
        )

    def on_restored(self, node: SimNode, snapshot: Snapshot) -> None:
        self.counters["restores"] += 1
        if self.checker.track(node.node_id).role is not None:  # not the start-up restore
            self.restores_by_node[node.node_id] += 1
        self.checker.on_restored(node.node_id, snapshot, node.state)
        self.workload.on_restored(node.node_id, snapshot.meta.index, self.now)
        self.trace.add(f"{self.now} r {node.node_id} {snapshot.meta.index}")

    def on_applied(
        self, node: SimNode, entry: Entry, before: SmState, effective: bool, result: bytes
    ) -> None:
        core = node.core
        assert core is not None
        self.counters["applied"] += 1
        self.checker.on_applied(
            node.node_id,
            entry,
            core.commit,
            node.state,
            before=before,
            effective=effective,
            result=result,
        )
        if node.node_id == self._capturing:
            self._captured.append((entry, result))
        self.workload.on_applied(node.node_id, entry, self.now, result)

    def on_stepped(self, node: SimNode, inp: Input | None, ready: Ready) -> None:
        core = node.core
        assert core is not None
        nid = node.node_id
        if isinstance(inp, Propose):
            self._last_proposed = ready.proposed
            if ready.proposed is not None and self.triggers.waiting:
                self.triggers.fire("proposed", nid, self.now)
        if core.role is Role.LEADER:
            event = self.triggers.observe_leader(nid, core.term, core.commit, self.now)
            self.counters["elections"] += event == "elected"
        self.checker.on_stepped(
            nid,
            inp,
            role=core.role,
            term=core.term,
            vote=core.vote,
            commit=core.commit,
            first_index=core.first_index,
            last_index=core.last_index,
            last_term=core.term_at(core.last_index),
            voters=core.conf.voters,
        )

    def on_down(self, node: SimNode, status: NodeStatus, reason: str) -> None:
        nid = node.node_id
        self.trace.add(f"{self.now} N {nid} {status.value} {reason}")
        self._last_proposed = None
        self._inbox[nid] = []
        node.paused = False
        self.workload.on_node_down(nid, self.now)
        if status is NodeStatus.DEGRADED:
            self.counters["degraded"] += 1
            self.degraded_by_node[nid] += 1
            self._degraded_since[nid] = self.now
        elif status is NodeStatus.CORRUPT:
            self.counters["corrupt"] += 1
        else:
            self.counters["crashes"] += 1
            self.crashes_by_node[nid] += 1
            if reason.startswith("died"):  # not a planned crash: a supervisor restarts it
                self._restart_at[nid] = self.now + self.config.restart_delay

    # --- actions ------------------------------------------------------------------------

    def _apply(self, a: Action) -> None:
        self.trace.add(f"{self.now} A {sorted(a.to_json().items())}")
        if a.on:
            self.triggers.arm(a)
            return
        if names_leader(a):
            leader = self.leader()
            if leader is None:
                self.trace.add(f"{self.now} A skipped: no leader")
                return
            a = bind_leader(a, leader.node_id)
            self.trace.add(f"{self.now} A @leader={leader.node_id}")
        node = self.nodes.get(a.node)
        op = a.op
        if op in NETWORK_OPS:
            self.network.apply(a, self.now)
        elif op == "heal_all":
            self._heal_all()
        elif op in ("transfer", "add_learner", "promote", "remove"):
            self.admin.request(a, self.now)
        elif op == "propose":
            if a.node:
                self.workload.add_client(SCENARIO_CLIENT).hint = a.node
            self.workload.enqueue(SCENARIO_CLIENT, a.n or 1)
        else:
            assert node is not None, f"{op} needs a node"
            self._node_action(op, node, a)

    def _node_action(self, op: str, node: SimNode, a: Action) -> None:
        nid = node.node_id
        if op == "crash":
            if node.status is not NodeStatus.CORRUPT:
                self._restart_at.pop(nid, None)
                node.crash("crash (planned)")
        elif op == "restart":
            if node.status is NodeStatus.DOWN:
                self._start(node)
        elif op == "pause":
            if node.status in (NodeStatus.UP, NodeStatus.DEGRADED):
                node.paused = True
        elif op == "resume":
            self._resume(node)
        elif op == "crash_during_write":
            if node.up:
                node.disk.crash_after(a.n)
        elif op == "crash_on_snapshot":
            node.disk.crash_on_next_snapshot(a.n or 1)
        elif op == "disk_full":
            self.disks[nid].set_full(True)
        elif op == "disk_ok":
            self.disks[nid].set_full(False)
        elif op == "fsync_error":
            node.disk.fail_next_fsync()
        elif op == "flip_bit":
            self._flip_bit(node, a)
        elif op == "compact":
            self._send(node.compact_now())
        else:  # pragma: no cover - validate() refuses unknown ops
            raise AssertionError(f"unknown op {op}")

    def _resume(self, node: SimNode) -> None:
        if not node.paused:
            return
        node.paused = False
        queued, self._inbox[node.node_id] = self._inbox[node.node_id], []
        for m in queued:
            if node.up and not node.paused:
                self._receive(node, m)

    def _flip_bit(self, node: SimNode, a: Action) -> None:
        """Flip a durable bit where storage promises to notice, then crash and restart the
        node: storage must refuse to start (CORRUPT) or recover exactly what it persisted."""
        if node.status is NodeStatus.CORRUPT:
            return
        disk = self.disks[node.node_id]
        rng = random.Random(f"{self.seed}:flip:{a.at}:{a.n}")
        if node.up:
            node.crash("crash (to notice a bit flip)")
        try:
            regions = verified_regions(node.disk)
        except StorageCorrupt:
            regions = {}  # already refused: nothing more to damage
        flipped = disk.flip_random_bit(rng, regions)
        self.trace.add(f"{self.now} F {node.node_id} {flipped}")
        self._start(node)

    def _heal_all(self) -> None:
        self.triggers.clear()
        self.network.heal()
        self.network.reset_params()
        for nid in self.node_ids:
            node = self.nodes[nid]
            self.disks[nid].set_full(False)
            node.disk.disarm()
            self._resume(node)
            if node.status is NodeStatus.DOWN:
                self._start(node)
        if self.config.liveness and self.liveness.healed_at is None:
            self.liveness.start(self.now)
            self.workload.add_client(PROBE_CLIENT).timeout = 2 * self.config.election_timeout_max
            self.workload.enqueue(PROBE_CLIENT, 1)

    # --- liveness -----------------------------------------------------------------------

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
