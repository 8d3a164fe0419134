"""One simulated node: a real :class:`RaftCore` over real storage logic on a simulated disk.

:class:`SimNode` is the simulator's driver, doing what the Trio driver does, in the order
:class:`~skulk.consensus.Ready` prescribes:

1. ``core.step(input)``;
2. persist ``snapshot`` / ``entries`` / ``hard_state`` through storage (``DiskFull``: the node
   discards its core and becomes DEGRADED -- it ignores inputs until :meth:`SimNode.retry`
   finds the disk usable again and rebuilds a fresh core from what storage recovers;
   ``DiskError`` or a death inside the write, :class:`SimCrash`: the node crashes);
3. hand ``messages`` to the caller (the world sends them);
4. if ``restore``, replace the state machine from ``snapshot.data``; apply ``committed``;
5. compact (``Compact(applied, image)``) once ``compact_every`` entries were applied since the
   last snapshot.

Start-up: storage recovers; a founding member with nothing on disk persists the bootstrap
snapshot (index 0, the founders as voters) first; non-founders start empty and wait for the
leader's snapshot. ``core.initial_ready()`` then restores the snapshot and re-applies the
committed log (its snapshot is already on disk and is not persisted again).

Every observable moment is reported to a :class:`NodeObserver` (the invariant checker and the
world), which is how the simulator checks properties without the node knowing about them.
"""

from __future__ import annotations

import enum
import random
from collections.abc import Callable
from typing import Protocol

import attrs

from skulk.consensus import (
    Compact,
    ConfState,
    DiskError,
    DiskFull,
    Entry,
    HardState,
    Input,
    Message,
    RaftConfig,
    RaftCore,
    Ready,
    Recovered,
    Snapshot,
    SnapshotMeta,
    StorageCorrupt,
    StorageFailed,
)
from skulk.sim._crashdisk import CrashingDisk, SimCrash
from skulk.sim._disk import SimDisk
from skulk.sim._statemachine import (
    INITIAL,
    MACHINE,
    Machine,
    SmState,
    apply_entry,
    decode_state,
    encode_state,
)


class NodeStatus(enum.Enum):
    UP = "up"
    DOWN = "down"
    """Crashed (or not started yet): waits for a restart."""
    DEGRADED = "degraded"
    """Storage refused a write (disk full): no core; retries opening storage now and then."""
    CORRUPT = "corrupt"
    """Storage refused to open (checksum mismatch): out for good."""


class StorageLike(Protocol):
    """What the node needs from storage (``skulk.consensus.Storage``)."""

    def persist(
        self,
        *,
        snapshot: Snapshot | None = None,
        entries: tuple[Entry, ...] = (),
        hard_state: HardState | None = None,
        restore: bool = False,
    ) -> None: ...


OpenStorage = Callable[[CrashingDisk], tuple[StorageLike, Recovered]]
"""Open storage on a disk: returns it with what it recovered. Raises DiskError/DiskFull, or
StorageCorrupt (the node then refuses to start: CORRUPT)."""
MakeCore = Callable[[str, RaftConfig, random.Random, Recovered], RaftCore]


class NodeObserver(Protocol):
    """Told about everything a node does; implemented by the world (which forwards to the
    invariant checker and the workload)."""

    def on_recovered(self, node: SimNode, recovered: Recovered) -> None:
        """Storage opened and returned ``recovered`` (before any bootstrap)."""

    def on_persisted(self, node: SimNode, ready: Ready) -> None:
        """``ready``'s snapshot/entries/hard state are durable now."""

    def on_restored(self, node: SimNode, snapshot: Snapshot) -> None:
        """The state machine was replaced by ``snapshot``'s image (``node.state``)."""

    def on_applied(
        self, node: SimNode, entry: Entry, before: SmState, effective: bool, result: bytes
    ) -> None:
        """``entry`` was applied to ``before`` (``effective``: the sessions let it through to
        the cluster machine), answering ``result``; ``node.state`` is the state after it."""

    def on_stepped(self, node: SimNode, inp: Input | None, ready: Ready) -> None:
        """A step (``inp`` None: start-up) was fully handled and the node is still up."""

    def on_down(self, node: SimNode, status: NodeStatus, reason: str) -> None:
        """The node stopped (crash, degraded, corrupt storage)."""


@attrs.frozen
class NodeSettings:
    """How a node is built. ``founders`` are the voters of the bootstrap snapshot (None: not a
    founding member)."""

    raft: RaftConfig
    founders: tuple[str, ...] | None
    compact_every: int = 50
    impure_apply: bool = False


class SimNode:
    """A node's process (core, storage, state machine) and its disk, which outlives it."""

    def __init__(
        self,
        node_id: str,
        settings: NodeSettings,
        *,
        sim_disk: SimDisk,
        disk: CrashingDisk,
        open_storage: OpenStorage,
        make_core: MakeCore,
        seed: int,
        observer: NodeObserver,
        machine: Machine = MACHINE,
    ) -> None:
        self.node_id = node_id
        self.settings = settings
        self.sim_disk = sim_disk
        self.disk = disk
        self._open_storage = open_storage
        self._make_core = make_core
        self._seed = seed
        self._disk_rng = random.Random(f"{seed}:disk-crash:{node_id}")
        self._observer = observer
        self.machine = machine
        """Sessions around the cluster machine (a mutant's, in negative controls)."""
        self.status = NodeStatus.DOWN
        self.paused = False
        self.incarnation = 0
        self.core: RaftCore | None = None
        self.storage: StorageLike | None = None
        self.state: SmState = INITIAL
        self.clean = True
        """No write was interrupted since the last start: what storage recovers at the next
        start must be exactly what was persisted."""
        self.down_reason = ""

    def __repr__(self) -> str:
        return f"SimNode({self.node_id}, {self.status.value})"

    @property
    def up(self) -> bool:
        return self.status is NodeStatus.UP and self.core is not None

    # --- life cycle ---------------------------------------------------------------------

    def start(self) -> list[Message]:
        """Open storage and build a core (restart after a crash, or recovery from DEGRADED).
        Returns the messages to send (none, normally)."""
        self.incarnation += 1
        self.state = INITIAL
        try:
            storage, recovered = self._open_storage(self.disk)
        except StorageCorrupt as exc:
            self._stop(NodeStatus.CORRUPT, f"storage refused to open: {exc}")
            return []
        except DiskFull:
            self._stop(NodeStatus.DEGRADED, "disk full while opening storage")
            return []
        except (DiskError, StorageFailed, SimCrash) as exc:
            self.clean = False
            self._crash(f"died opening storage: {exc!r}")
            return []
        self._observer.on_recovered(self, recovered)
        self.clean = True
        self.storage = storage
        if self.settings.founders is not None and _empty(recovered):
            snap = Snapshot(
                SnapshotMeta(0, 0, ConfState(tuple(self.settings.founders))),
                encode_state(INITIAL, machine=self.machine),
            )
            boot = Ready(snapshot=snap)
            if not self._persist(boot):
                return []
            recovered = Recovered(HardState(), snap, ())
        rng = random.Random(f"{self._seed}:core:{self.node_id}:{self.incarnation}")
        self.core = self._make_core(self.node_id, self.settings.raft, rng, recovered)
        self.status = NodeStatus.UP
        self.down_reason = ""
        ready = self.core.initial_ready()
        out = self._handle(ready, initial=True)
        if self.up:
            self._observer.on_stepped(self, None, ready)
            out += self._maybe_compact()
        return out

    def crash(self, reason: str = "crash") -> None:
        """Kill the process: the core and everything not fsynced are lost."""
        if self.status is NodeStatus.CORRUPT:
            return
        self._crash(reason)

    def retry(self) -> list[Message]:
        """DEGRADED: try to open storage again (the world calls this every few ticks)."""
        if self.status is not NodeStatus.DEGRADED:
            return []
        return self.start()

    def _crash(self, reason: str) -> None:
        self.sim_disk.crash(self._disk_rng)
        self.disk.disarm()
        self._stop(NodeStatus.DOWN, reason)

    def _stop(self, status: NodeStatus, reason: str) -> None:
        self.core = None
        self.storage = None
        self.status = status
        self.down_reason = reason
        if status is NodeStatus.DEGRADED:
            self.clean = False  # storage gave up half way through a write
        self._observer.on_down(self, status, reason)

    # --- stepping -----------------------------------------------------------------------

    def step(self, inp: Input) -> list[Message]:
        """Feed one input to a running node; returns the messages to send. Proposals may raise
        ``NotLeader`` / ``ProposalRefused`` (nothing happened then)."""
        core = self.core
        assert core is not None, f"{self.node_id} is not running"
        ready = core.step(inp)
        if (
            not ready.messages
            and not ready.committed
            and ready.hard_state is None
            and not ready.entries
            and ready.snapshot is None
            and ready.proposed is None
        ):
            # Nothing to persist, send or apply (most ticks): the core's term, role, commit and
            # log did not change either, so there is nothing for the observer to check.
            return []
        out = self._handle(ready, initial=False)
        if self.up:
            self._observer.on_stepped(self, inp, ready)
            out += self._maybe_compact()
        return out

    def compact_now(self) -> list[Message]:
        """Snapshot the state machine now (if anything was applied since the last one)."""
        if not self.up:
            return []
        return self._compact()

    def _maybe_compact(self) -> list[Message]:
        core = self.core
        assert core is not None
        meta = core.snapshot_meta
        base = meta.index if meta is not None else 0
        if self.state.applied - base >= self.settings.compact_every:
            return self._compact()
        return []

    def _compact(self) -> list[Message]:
        core = self.core
        assert core is not None
        meta = core.snapshot_meta
        if meta is None or self.state.applied <= meta.index:
            return []
        inp = Compact(self.state.applied, encode_state(self.state, machine=self.machine))
        ready = core.step(inp)
        out = self._handle(ready, initial=False)
        if self.up:
            self._observer.on_stepped(self, inp, ready)
        return out

    def _persist(self, ready: Ready) -> bool:
        """Persist what ``ready`` asks; False if the node went down doing it."""
        if ready.snapshot is not None:
            self.disk.persisting_snapshot()
        storage = self.storage
        assert storage is not None
        try:
            storage.persist(
                snapshot=ready.snapshot,
                entries=ready.entries,
                hard_state=ready.hard_state,
                restore=ready.restore,
            )
        except DiskFull:
            self._stop(NodeStatus.DEGRADED, "disk full")
            return False
        except (DiskError, StorageFailed, SimCrash) as exc:
            self.clean = False
            self._crash(f"died writing: {exc!r}")
            return False
        self._observer.on_persisted(self, ready)
        return True

    def _handle(self, ready: Ready, *, initial: bool) -> list[Message]:
        if initial:
            # initial_ready's snapshot is already on disk: persist only what else it carries.
            rest = attrs.evolve(ready, snapshot=None, restore=False)
            if rest.must_persist() and not self._persist(rest):
                return []
        elif ready.must_persist() and not self._persist(ready):
            return []
        out = list(ready.messages)
        if ready.restore and ready.snapshot is not None:
            self.state = decode_state(ready.snapshot.data, machine=self.machine)
            self._observer.on_restored(self, ready.snapshot)
        salt = self.node_id.encode() if self.settings.impure_apply else b""
        for entry in ready.committed:
            before = self.state
            self.state, effective, result = apply_entry(
                before, entry, machine=self.machine, salt=salt
            )
            self._observer.on_applied(self, entry, before, effective, result)
        return out


def _empty(recovered: Recovered) -> bool:
    return (
        recovered.snapshot is None and not recovered.entries and recovered.hard_state == HardState()
    )
