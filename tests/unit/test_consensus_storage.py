"""Durable Raft storage: round trips, crash at every disk operation, torn tails, bit rot,
disk full, compaction and compressed segments -- on the simulated and on the real disk."""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path

import attrs
import cbor2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skulk.consensus import (
    ConfChange,
    ConfState,
    Disk,
    DiskError,
    DiskFull,
    Entry,
    EntryKind,
    HardState,
    OsDisk,
    Recovered,
    Snapshot,
    SnapshotMeta,
    Storage,
    StorageCorrupt,
    StorageFailed,
    verified_regions,
)
from skulk.consensus._storage_format import _unframe
from skulk.sim import SimDisk, SimulatedCrash

# --- helpers --------------------------------------------------------------------------------


def _entries(first: int, n: int, term: int) -> tuple[Entry, ...]:
    return tuple(
        Entry(i, term, EntryKind.COMMAND, f"cmd {i}".encode(), "client", i)
        for i in range(first, first + n)
    )


def _snap(index: int, term: int, data: bytes = b"image") -> Snapshot:
    return Snapshot(SnapshotMeta(index, term, ConfState(("n1", "n2"), ("n3",))), data)


@attrs.define
class Model:
    """What storage must recover: the same rules, on plain lists."""

    hard_state: HardState = attrs.Factory(HardState)
    snapshot: Snapshot | None = None
    entries: list[Entry] = attrs.Factory(list)

    def term_at(self, index: int) -> int | None:
        base = 0 if self.snapshot is None else self.snapshot.meta.index
        if index == base:
            return 0 if self.snapshot is None else self.snapshot.meta.term
        return next((e.term for e in self.entries if e.index == index), None)

    @property
    def last_index(self) -> int:
        base = 0 if self.snapshot is None else self.snapshot.meta.index
        return self.entries[-1].index if self.entries else base

    def persist(
        self,
        snapshot: Snapshot | None = None,
        entries: Sequence[Entry] = (),
        hard_state: HardState | None = None,
        restore: bool = False,
    ) -> None:
        if snapshot is not None:
            meta = snapshot.meta
            keep = not restore and self.term_at(meta.index) == meta.term
            self.entries = [e for e in self.entries if e.index > meta.index] if keep else []
            self.snapshot = snapshot
        for e in entries:
            self.entries = [x for x in self.entries if x.index < e.index] + [e]
        if hard_state is not None:
            self.hard_state = hard_state

    def recovered(self) -> Recovered:
        return Recovered(self.hard_state, self.snapshot, tuple(self.entries))

    def copy(self) -> Model:
        return Model(self.hard_state, self.snapshot, list(self.entries))


class Disks:
    """Opens the same directory again after a (simulated) restart."""

    def __init__(self, kind: str, path: Path) -> None:
        self.kind = kind
        self.path = path
        self.sim = SimDisk(random.Random(0))
        self._os: OsDisk | None = None

    def fresh(self) -> Disk:
        if self.kind == "sim":
            return self.sim
        if self._os is not None:
            self._os.close()
        self._os = OsDisk(self.path)
        return self._os

    def close(self) -> None:
        if self._os is not None:
            self._os.close()


@pytest.fixture(params=["sim", "os"])
def disks(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Disks]:
    d = Disks(request.param, tmp_path / "data")
    yield d
    d.close()


# --- round trips ----------------------------------------------------------------------------


def test_empty_directory_recovers_nothing(disks: Disks) -> None:
    storage, rec = Storage.open(disks.fresh())
    assert rec == Recovered(HardState(), None, ())
    assert storage.statistics().segments == 1
    assert Storage.open(disks.fresh())[1] == rec


def test_round_trip_with_overwrite_and_snapshots(disks: Disks) -> None:
    model = Model()
    storage, _ = Storage.open(disks.fresh())
    conf = Entry(6, 2, EntryKind.CONF, conf=ConfChange("add_learner", "n4"))
    steps: list[dict[str, object]] = [
        {"snapshot": _snap(0, 0)},
        {"entries": _entries(1, 5, 1), "hard_state": HardState(1, "n1", 2)},
        {"entries": (*_entries(4, 2, 2), conf), "hard_state": HardState(2, None, 3)},
        {"snapshot": _snap(3, 1, b"compacted")},  # local compaction keeps 4..6
        {"entries": _entries(7, 1, 2)},
        {"hard_state": HardState(3, "n2", 5)},
    ]
    for step in steps:
        storage.persist(**step)  # type: ignore[arg-type]
        model.persist(**step)  # type: ignore[arg-type]
        assert Storage.open(disks.fresh())[1] == model.recovered()
    assert [e.index for e in model.entries] == [4, 5, 6, 7]
    assert model.entries[2].conf == ConfChange("add_learner", "n4")


def test_installed_snapshot_drops_the_log(disks: Disks) -> None:
    storage, _ = Storage.open(disks.fresh())
    storage.persist(entries=_entries(1, 5, 1), hard_state=HardState(1, None, 0))
    # the log holds (3, 1) but the snapshot was installed: restore drops everything
    storage.persist(snapshot=_snap(3, 1), restore=True, entries=_entries(4, 1, 1))
    assert [e.index for e in Storage.open(disks.fresh())[1].entries] == [4]
    # a snapshot whose entry the log does not hold drops the log even without restore
    storage, _ = Storage.open(disks.fresh())
    storage.persist(entries=_entries(5, 3, 1))
    storage.persist(snapshot=_snap(5, 7))
    rec = Storage.open(disks.fresh())[1]
    assert rec.entries == () and rec.snapshot == _snap(5, 7)
    assert rec.hard_state == HardState(1, None, 0)
    # while one that matches keeps the entries after it
    storage, _ = Storage.open(disks.fresh())
    storage.persist(entries=_entries(6, 3, 8))
    storage.persist(snapshot=_snap(7, 8))
    assert [e.index for e in Storage.open(disks.fresh())[1].entries] == [8]


def test_invalid_calls_are_refused(disks: Disks) -> None:
    storage, _ = Storage.open(disks.fresh())
    storage.persist(snapshot=_snap(5, 2), entries=_entries(6, 2, 2))
    for bad in [
        {"entries": _entries(9, 1, 2)},  # gap
        {"entries": _entries(5, 1, 2)},  # at the snapshot
        {"entries": (*_entries(7, 1, 2), *_entries(9, 1, 2))},  # not contiguous
        {"snapshot": _snap(4, 2)},  # older snapshot
        {"snapshot": _snap(5, 3)},  # same index, other term
    ]:
        with pytest.raises(ValueError):
            storage.persist(**bad)  # type: ignore[arg-type]
    storage.persist(entries=_entries(8, 1, 2))
    assert [e.index for e in Storage.open(disks.fresh())[1].entries] == [6, 7, 8]


def test_rotation_compression_and_compaction(disks: Disks) -> None:
    disk = disks.fresh()
    storage, _ = Storage.open(disk, segment_bytes=300)
    storage.persist(snapshot=_snap(0, 0), hard_state=HardState(5, "n1", 0))
    model = Model(HardState(5, "n1", 0), _snap(0, 0))
    for i in range(1, 41):
        storage.persist(entries=_entries(i, 1, 5))  # the hard state is never written again
        model.persist(entries=_entries(i, 1, 5))
    stats = storage.statistics()
    assert stats.segments > 5 and stats.compressed_segments == stats.segments - 1
    assert any(n.endswith(".seg.zst") for n in disk.list())
    assert Storage.open(disks.fresh(), segment_bytes=300)[1] == model.recovered()

    storage, _ = Storage.open(disks.fresh(), segment_bytes=300)
    storage.persist(snapshot=_snap(35, 5, b"late"))
    model.persist(snapshot=_snap(35, 5, b"late"))
    after = storage.statistics()
    assert after.segments_removed > 0 and after.segments < stats.segments
    names = disks.fresh().list()
    assert "0000000000000001.seg.zst" not in names
    assert [n for n in names if n.startswith("snap-")] == ["snap-00000000000000000035.snap"]
    rec = Storage.open(disks.fresh(), segment_bytes=300)[1]
    assert rec == model.recovered() and rec.hard_state == HardState(5, "n1", 0)
    assert [e.index for e in rec.entries] == list(range(36, 41))


def test_compaction_keeps_exactly_the_segments_still_needed(disks: Disks) -> None:
    storage, _ = Storage.open(disks.fresh(), segment_bytes=1)  # one batch per segment
    for i in range(1, 11):
        storage.persist(entries=_entries(i, 1, 1), hard_state=HardState(1, None, i - 1))
    assert storage.statistics().segments == 11  # the first holds only its header batch
    storage.persist(snapshot=_snap(5, 1))
    # segments 2..6 held entries 1..5; 7 (entry 6) and later stay
    assert storage.statistics().segments == 6 and storage.statistics().segments_removed == 6
    rec = Storage.open(disks.fresh(), segment_bytes=1)[1]
    assert [e.index for e in rec.entries] == [6, 7, 8, 9, 10]
    assert rec.hard_state == HardState(1, None, 9)


def test_plain_and_compressed_twins_prefer_the_plain_one(disks: Disks) -> None:
    disk = disks.fresh()
    storage, _ = Storage.open(disk, segment_bytes=100)
    for i in range(1, 6):
        storage.persist(entries=_entries(i, 1, 1), hard_state=HardState(1, None, i))
    packed = "0000000000000001.seg.zst"
    disk.append("0000000000000001.seg", _unframe(packed, disk.read(packed)))
    disk.append("0000000000000002.seg.zst.tmp", b"half a compressed segment")
    rec = Storage.open(disks.fresh(), segment_bytes=100)[1]
    assert [e.index for e in rec.entries] == [1, 2, 3, 4, 5]
    names = disks.fresh().list()
    assert "0000000000000001.seg" in names and packed not in names
    assert not any(n.endswith(".tmp") for n in names)


# --- damage ---------------------------------------------------------------------------------


def _some_history(disk: Disk, segment_bytes: int = 250) -> Model:
    storage, _ = Storage.open(disk, segment_bytes=segment_bytes)
    model = Model()
    for step in [
        {"snapshot": _snap(0, 0)},
        *({"entries": _entries(i, 2, 1), "hard_state": HardState(1, "n1", i)} for i in (1, 3)),
        *({"entries": _entries(i, 1, 2)} for i in range(4, 12)),
        {"snapshot": _snap(6, 2)},
        {"entries": _entries(12, 3, 3), "hard_state": HardState(3, "n2", 10)},
    ]:
        storage.persist(**step)  # type: ignore[arg-type]
        model.persist(**step)  # type: ignore[arg-type]
    return model


def _active(disk: Disk) -> str:
    return [n for n in disk.list() if n.endswith(".seg")][-1]


@pytest.mark.parametrize("garbage", [b"\x00\x00\x01", b"\x00" * 4096, b"\x00\x00\x00\x30abc"])
def test_torn_tail_is_cut(disks: Disks, garbage: bytes) -> None:
    disk = disks.fresh()
    model = _some_history(disk)
    active = _active(disk)
    size = disk.size(active)
    disk.append(active, garbage)
    storage, rec = Storage.open(disks.fresh())
    assert rec == model.recovered()
    assert disks.fresh().size(active) == size
    storage.persist(entries=_entries(15, 1, 3))
    assert Storage.open(disks.fresh())[1].entries[-1].index == 15


def test_incomplete_batch_is_cut(disks: Disks) -> None:
    disk = disks.fresh()
    model = _some_history(disk)
    active = _active(disk)
    before = disk.read(active)
    storage, _ = Storage.open(disk)
    storage.persist(entries=_entries(15, 2, 3), hard_state=HardState(3, "n2", 15))
    batch = disk.read(active)[len(before) :]
    # keep the entry records of the batch but not its closing hard-state record
    closing = 12 + len(cbor2.dumps([1, 3, "n2", 15]))
    disk.truncate(active, len(before))
    disk.append(active, batch[:-closing])
    assert Storage.open(disks.fresh())[1] == model.recovered()


def test_damage_in_the_middle_refuses_to_start(disks: Disks) -> None:
    disk = disks.fresh()
    _some_history(disk)
    active = _active(disk)
    data = bytearray(disk.read(active))
    data[40] ^= 0x10
    disk.truncate(active, 0)
    disk.append(active, bytes(data))
    with pytest.raises(StorageCorrupt) as info:
        Storage.open(disks.fresh())
    assert info.value.file == active
    message = str(info.value)
    assert active in message and "at byte" in message and "refusing to start" in message
    assert "re-add" in message


@pytest.mark.parametrize("seed", range(60))
def test_any_bit_flip_in_verified_regions_is_detected(seed: int) -> None:
    disk = SimDisk(random.Random(seed))
    _some_history(disk, segment_bytes=random.Random(seed).choice([150, 250, 100_000]))
    disk.crash(random.Random(seed), torn_probability=0.0)
    regions = verified_regions(disk)
    assert any(n.startswith("snap-") for n in regions)
    hit = disk.flip_random_bit(random.Random(seed), regions)
    assert hit is not None
    with pytest.raises(StorageCorrupt) as info:
        Storage.open(disk)
    assert info.value.file == hit[0]


def test_missing_files_refuse_to_start(disks: Disks) -> None:
    disk = disks.fresh()
    _some_history(disk, segment_bytes=100)
    segments = [n for n in disk.list() if ".seg" in n]
    disk.remove(segments[len(segments) // 2])
    with pytest.raises(StorageCorrupt, match="this segment file is missing"):
        Storage.open(disks.fresh(), segment_bytes=100)


def test_a_foreign_segment_refuses_to_start() -> None:
    mine, theirs = SimDisk(random.Random(1)), SimDisk(random.Random(2))
    for disk, n in ((mine, 1), (theirs, 2)):
        storage, _ = Storage.open(disk, segment_bytes=1)
        for i in range(1, 6):
            storage.persist(entries=_entries(1 + (i - 1) * n, n, 1))
    name = "0000000000000004.seg.zst"
    mine.remove(name)
    mine.append(name, theirs.read(name))
    with pytest.raises(StorageCorrupt, match="does not continue") as info:
        Storage.open(mine, segment_bytes=1)
    assert info.value.file == name


def test_missing_oldest_segment_refuses_to_start(disks: Disks) -> None:
    disk = disks.fresh()
    storage, _ = Storage.open(disk, segment_bytes=1)
    for i in range(1, 4):
        storage.persist(entries=_entries(i, 1, 1))
    disk.remove("0000000000000001.seg.zst")
    disk.remove("0000000000000002.seg.zst")
    with pytest.raises(StorageCorrupt, match="log entries before it are missing"):
        Storage.open(disks.fresh())


def test_missing_snapshot_refuses_to_start(disks: Disks) -> None:
    disk = disks.fresh()
    _some_history(disk)
    disk.remove("snap-00000000000000000006.snap")
    with pytest.raises(StorageCorrupt, match="snapshot in effect is missing"):
        Storage.open(disks.fresh())


# --- disk full and failed fsync -------------------------------------------------------------


def test_disk_full_acknowledges_nothing_and_recovers(disks: Disks) -> None:
    disk = disks.fresh()
    model = _some_history(disk, segment_bytes=300)
    storage, _ = Storage.open(disk, segment_bytes=300)
    for attempt in range(20):
        with _full(disks, disk):
            with pytest.raises(DiskFull):
                kwargs = [
                    {"entries": _entries(15, 3, 4), "hard_state": HardState(4, "n3", 12)},
                    {"snapshot": _snap(14, 3), "hard_state": HardState(4, "n3", 14)},
                ][attempt % 2]
                storage.persist(**kwargs)  # type: ignore[arg-type]
        assert Storage.open(disks.fresh(), segment_bytes=300)[1] == model.recovered()
    storage.persist(entries=_entries(15, 1, 4))  # the same instance goes on once space returns
    model.persist(entries=_entries(15, 1, 4))
    storage.persist(snapshot=_snap(14, 3))
    model.persist(snapshot=_snap(14, 3))
    assert Storage.open(disks.fresh(), segment_bytes=300)[1] == model.recovered()


class _full:
    """The disk is full: SimDisk's switch, or ENOSPC from os.write for OsDisk."""

    def __init__(self, disks: Disks, disk: Disk) -> None:
        self.disks, self.disk = disks, disk
        self.patch = pytest.MonkeyPatch()

    def __enter__(self) -> None:
        if isinstance(self.disk, SimDisk):
            self.disk.set_full(True)
            return
        real = os.write

        def write(fd: int, data: bytes | memoryview) -> int:
            real(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")

        self.patch.setattr(os, "write", write)

    def __exit__(self, *exc: object) -> None:
        if isinstance(self.disk, SimDisk):
            self.disk.set_full(False)
        self.patch.undo()


def test_os_errors_are_mapped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with OsDisk(tmp_path / "d") as disk:
        disk.append("f", b"x")

        def fail(fd: int) -> None:
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(os, "fsync", fail)
        with pytest.raises(DiskError) as info:
            disk.fsync("f")
        assert not isinstance(info.value, DiskFull) and info.value.errno == errno.EIO
        assert isinstance(info.value.__cause__, OSError)
        with pytest.raises(DiskError) as missing:
            disk.read("nope")
        assert missing.value.errno == errno.ENOENT
        with pytest.raises(ValueError):
            disk.append("../escape", b"x")


def test_failed_fsync_is_a_crash() -> None:
    disk = SimDisk(random.Random(1))
    model = _some_history(disk)
    storage, _ = Storage.open(disk)
    disk.fail_next_fsync()
    with pytest.raises(DiskError):
        storage.persist(entries=_entries(15, 1, 3))
    with pytest.raises(StorageFailed):
        storage.persist(entries=_entries(15, 1, 3))
    disk.crash(random.Random(1), torn_probability=0.0)
    assert Storage.open(disk)[1] == model.recovered()


# --- crashes --------------------------------------------------------------------------------

_SCENARIO: list[dict[str, object]] = [
    {"snapshot": _snap(0, 0)},
    {"entries": _entries(1, 3, 1), "hard_state": HardState(1, "n1", 0)},
    {"entries": _entries(4, 3, 1), "hard_state": HardState(1, "n1", 3)},
    {"entries": _entries(3, 2, 2), "hard_state": HardState(2, None, 3)},  # overwrite
    {"snapshot": _snap(3, 2), "entries": _entries(5, 2, 2)},  # compaction + append
    {"entries": _entries(7, 4, 2), "hard_state": HardState(2, "n2", 6)},
    {"snapshot": _snap(9, 4), "restore": True, "entries": _entries(10, 1, 4)},  # install
    {"entries": _entries(11, 2, 4), "hard_state": HardState(4, "n2", 11)},
]


def _run_scenario(disk: SimDisk) -> int:
    """Persist the scenario until the disk dies; returns how many calls returned."""
    done = 0
    try:
        storage, _ = Storage.open(disk, segment_bytes=120)
        for step in _SCENARIO:
            storage.persist(**step)  # type: ignore[arg-type]
            done += 1
    except SimulatedCrash:
        pass
    return done


def _models() -> list[Recovered]:
    model, out = Model(), [Model().recovered()]
    for step in _SCENARIO:
        model.persist(**step)  # type: ignore[arg-type]
        out.append(model.recovered())
    return out


def test_crash_at_every_disk_operation() -> None:
    models = _models()
    probe = SimDisk(random.Random(0))
    assert _run_scenario(probe) == len(_SCENARIO)
    total = probe.statistics().operations
    assert total > 60
    outcomes = set()
    for k in range(total):
        for seed in range(3):
            disk = SimDisk(random.Random(seed))
            disk.crash_after(k)
            done = _run_scenario(disk)
            assert done < len(_SCENARIO)
            disk.crash(random.Random(seed), torn_probability=[0.0, 1.0, 0.5][seed])
            if seed == 2:  # and die again while recovering
                disk.crash_after(random.Random(k).randrange(4))
                try:
                    Storage.open(disk, segment_bytes=120)
                except SimulatedCrash:
                    outcomes.add(-1)
                disk.crash(random.Random(k))
            storage, rec = Storage.open(disk, segment_bytes=120)
            assert rec in (models[done], models[done + 1]), (k, seed, done)
            outcomes.add(models.index(rec) - done)
            assert Storage.open(disk, segment_bytes=120)[1] == rec  # recovery is stable
            storage.persist(hard_state=HardState(9, None, 0))  # and writable
            assert Storage.open(disk, segment_bytes=120)[1].hard_state == HardState(9, None, 0)
    assert outcomes == {-1, 0, 1}  # some crashes hit recovery; both outcomes happen


# --- a model-based property -----------------------------------------------------------------

_KINDS = ["append"] * 6 + ["compact", "install", "crash", "crash", "full"]
_op = st.tuples(st.sampled_from(_KINDS), st.integers(0, 12), st.integers(0, 1000), st.booleans())


def _call(model: Model, op: str, a: int, b: int, flag: bool, term: int) -> dict[str, object]:
    """A valid persist call for ``model``'s state."""
    base = 0 if model.snapshot is None else model.snapshot.meta.index
    last = model.last_index
    if op == "compact":
        index = base + a % (last - base + 1)
        term_at = model.term_at(index)
        assert term_at is not None
        return {"snapshot": _snap(index, term_at, f"at {index}".encode())}
    if op == "install":
        index = max(last + a % 6 - 4, base + 1)
        return {
            "snapshot": _snap(index, term + 1),
            "restore": flag,
            "entries": _entries(index + 1, b % 4, term + 1),
            "hard_state": HardState(term + 1, None, index),
        }
    first = max(base + 1, last + 1 - a % 4)
    return {"entries": _entries(first, 1 + b % 5, term), "hard_state": HardState(term, "n1", b)}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(_op, min_size=5, max_size=60), segment_bytes=st.sampled_from([100, 400, 1 << 20])
)
def test_recovery_matches_a_model(
    ops: list[tuple[str, int, int, bool]], segment_bytes: int
) -> None:
    disk = SimDisk(random.Random(len(ops)))
    storage, _ = Storage.open(disk, segment_bytes=segment_bytes)
    model = Model()
    term = 1
    for kind, a, b, flag in ops:
        if kind in ("crash", "full"):
            call = _call(model, "append", a, b, False, term)
            after = model.copy()
            after.persist(**call)  # type: ignore[arg-type]
            if kind == "crash":
                disk.crash_after(a % 10)
                try:
                    storage.persist(**call)  # type: ignore[arg-type]
                    model = after
                except SimulatedCrash:
                    pass
                disk.crash(random.Random(b), torn_probability=0.5 if flag else 1.0)
                storage, rec = Storage.open(disk, segment_bytes=segment_bytes)
                assert rec in (model.recovered(), after.recovered())
                model = after if rec == after.recovered() else model
            else:
                disk.set_full(True)
                with pytest.raises(DiskFull):
                    storage.persist(**call)  # type: ignore[arg-type]
                disk.set_full(False)
                if b % 2:
                    storage, rec = Storage.open(disk, segment_bytes=segment_bytes)
                    assert rec == model.recovered()
            continue
        call = _call(model, kind, a, b, flag, term)
        storage.persist(**call)  # type: ignore[arg-type]
        model.persist(**call)  # type: ignore[arg-type]
        term += kind == "install" or (kind == "append" and flag)
    assert Storage.open(disk, segment_bytes=segment_bytes)[1] == model.recovered()
