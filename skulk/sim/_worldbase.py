"""The world's state and what its nodes report to it.

:class:`~skulk.sim._world.World` is assembled from this base (its records, the
:class:`~skulk.sim._node.NodeObserver` calls that feed the invariant checker, the trace and the
clients, and the primitives that start a node and carry its messages),
:mod:`._worldfaults` (the fault plan's actions) and :mod:`._world` (the loop). They are one
object: the split keeps each file about one part of the world.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence

from skulk.cluster import encode_command
from skulk.consensus import (
    Entry,
    Input,
    LogPosition,
    Message,
    Propose,
    Ready,
    Receive,
    Recovered,
    Role,
    Snapshot,
    Storage,
)
from skulk.sim._admin import Admin
from skulk.sim._commands import CommandMaker
from skulk.sim._config import SimConfig
from skulk.sim._crashdisk import CrashingDisk
from skulk.sim._disk import SimDisk
from skulk.sim._faults import Action
from skulk.sim._invariants import Checker, Violation
from skulk.sim._liveness import Liveness
from skulk.sim._mutants import NONE, Mutant
from skulk.sim._network import LinkParams, SimNetwork
from skulk.sim._node import NodeSettings, NodeStatus, OpenStorage, SimNode, StorageLike
from skulk.sim._statemachine import SmState
from skulk.sim._trace import Trace, describe
from skulk.sim._triggers import Triggers
from skulk.sim._workload import Workload

PROBE_CLIENT = "probe"
SCENARIO_CLIENT = "sc"
ACK_CHECK_TICKS = 100


class WorldBase:
    """The world's records, queries, node primitives and node observer (see the module doc)."""

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

    # --- queries ----------------------------------------------------------------------

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

    # --- driving nodes ----------------------------------------------------------------

    def _send(self, messages: list[Message]) -> None:
        now = self.now
        add = self.trace.add
        for m in messages:
            times = self.network.send(m.src, m.dst, now, type(m.payload).__name__)
            add(f"{now} S {describe(m)} {times}")
            for t in times:
                self._seq += 1
                heapq.heappush(self._heap, (t, self._seq, m))

    def _receive(self, node: SimNode, m: Message) -> None:
        self.counters["delivered"] += 1
        self.checker.on_deliver(m)
        self._send(node.step(Receive(m)))

    def _step_and_send(self, node: SimNode, inp: Input) -> None:
        self._send(node.step(inp))

    def _start(self, node: SimNode) -> None:
        self._restart_at.pop(node.node_id, None)
        self.trace.add(f"{self.now} N {node.node_id} start {node.incarnation + 1}")
        self.counters["restarts"] += 1
        self._send(node.start())

    # --- clients ----------------------------------------------------------------------

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

    _last_proposed: LogPosition | None = None

    # --- node observer ----------------------------------------------------------------

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
