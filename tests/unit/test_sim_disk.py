"""The simulated disk keeps exactly what was synced, tears un-synced appends, fills up, fails
fsync on demand, dies on cue and rots bits -- deterministically."""

from __future__ import annotations

import errno
import random
from collections.abc import Callable

import pytest

from skulk.consensus import DiskError, DiskFull
from skulk.sim import SimDisk, SimulatedCrash


def _disk(seed: int = 0) -> SimDisk:
    return SimDisk(random.Random(seed))


def _durable_file(disk: SimDisk, name: str, data: bytes) -> None:
    disk.append(name, data)
    disk.fsync(name)
    disk.fsync_dir()


def test_reads_see_volatile_writes() -> None:
    disk = _disk()
    disk.append("b", b"12")
    disk.append("a", b"x")
    disk.append("b", b"34")
    assert disk.list() == ("a", "b")
    assert disk.read("b") == b"1234"
    assert disk.size("b") == 4
    disk.truncate("b", 1)
    assert disk.read("b") == b"1"
    disk.rename("b", "c")
    assert disk.list() == ("a", "c")
    disk.remove("a")
    assert disk.list() == ("c",)


@pytest.mark.parametrize("op", ["read", "size", "fsync", "remove", "truncate", "rename"])
def test_missing_file_is_enoent(op: str) -> None:
    disk = _disk()
    calls: dict[str, Callable[[], object]] = {
        "read": lambda: disk.read("nope"),
        "size": lambda: disk.size("nope"),
        "fsync": lambda: disk.fsync("nope"),
        "remove": lambda: disk.remove("nope"),
        "truncate": lambda: disk.truncate("nope", 0),
        "rename": lambda: disk.rename("nope", "x"),
    }
    with pytest.raises(DiskError) as info:
        calls[op]()
    assert info.value.errno == errno.ENOENT


def test_crash_loses_unsynced_appends() -> None:
    disk = _disk()
    _durable_file(disk, "f", b"synced")
    disk.append("f", b"-lost")
    disk.crash(random.Random(1), torn_probability=0.0)
    assert disk.read("f") == b"synced"


def test_synced_data_without_dir_sync_vanishes() -> None:
    disk = _disk()
    disk.append("new", b"data")
    disk.fsync("new")
    disk.crash(random.Random(1), torn_probability=0.0)
    assert disk.list() == ()


def test_dir_sync_without_data_sync_keeps_an_empty_file() -> None:
    disk = _disk()
    disk.append("new", b"data")
    disk.fsync_dir()
    disk.crash(random.Random(1), torn_probability=0.0)
    assert disk.read("new") == b""


def test_rename_and_remove_are_durable_only_after_dir_sync() -> None:
    disk = _disk()
    _durable_file(disk, "a", b"A")
    _durable_file(disk, "b", b"B")
    disk.rename("a", "b")
    disk.crash(random.Random(1))
    assert (disk.read("a"), disk.read("b")) == (b"A", b"B")
    disk.rename("a", "b")
    disk.fsync_dir()
    disk.crash(random.Random(1))
    assert disk.list() == ("b",) and disk.read("b") == b"A"
    disk.remove("b")
    disk.crash(random.Random(1))
    assert disk.list() == ("b",)


def test_truncate_below_synced_reverts_on_crash() -> None:
    disk = _disk()
    _durable_file(disk, "f", b"0123456789")
    disk.truncate("f", 3)
    disk.append("f", b"xyz")
    assert disk.read("f") == b"012xyz"
    assert disk.durable_content("f") == b"0123456789"
    disk.crash(random.Random(1), torn_probability=1.0)
    assert disk.read("f") == b"0123456789"


def test_torn_write_keeps_a_prefix_deterministically() -> None:
    kept = set()
    for seed in range(40):
        disk = _disk()
        _durable_file(disk, "f", b"head")
        disk.append("f", b"abcdefgh")
        disk.crash(random.Random(seed), torn_probability=1.0)
        data = disk.read("f")
        assert (b"head" + b"abcdefgh").startswith(data) and data.startswith(b"head")
        kept.add(len(data) - 4)
        # what survived a crash is durable: a second crash keeps it
        disk.crash(random.Random(seed), torn_probability=1.0)
        assert disk.read("f") == data
    assert len(kept) > 4  # prefixes of many lengths
    runs = []
    for _ in range(2):
        disk = _disk()
        _durable_file(disk, "f", b"")
        disk.append("f", bytes(range(200)))
        disk.crash(random.Random(7))
        runs.append(disk.read("f"))
    assert runs[0] == runs[1]


def test_full_disk_writes_a_prefix_and_refuses_creation() -> None:
    disk = _disk(3)
    _durable_file(disk, "f", b"ok")
    disk.set_full(True)
    with pytest.raises(DiskFull) as info:
        disk.append("f", b"0123456789")
    assert info.value.errno == errno.ENOSPC
    data = disk.read("f")
    assert data.startswith(b"ok") and len(data) < 12 and b"ok0123456789".startswith(data)
    with pytest.raises(DiskFull):
        disk.append("g", b"x")
    assert "g" not in disk.list()
    disk.truncate("f", 2)  # cleaning up needs no space
    disk.set_full(False)
    disk.append("f", b"!")
    assert disk.read("f") == b"ok!"
    assert disk.statistics().full_refusals == 2


def test_failed_fsync_syncs_nothing() -> None:
    disk = _disk()
    _durable_file(disk, "f", b"a")
    disk.append("f", b"b")
    disk.fail_next_fsync()
    with pytest.raises(DiskError) as info:
        disk.fsync("f")
    assert info.value.errno == errno.EIO
    assert disk.durable_content("f") == b"a"
    disk.fsync("f")  # only the next one fails
    assert disk.durable_content("f") == b"ab"


def test_failed_dir_fsync() -> None:
    disk = _disk()
    disk.append("f", b"a")
    disk.fail_next_fsync()
    with pytest.raises(DiskError):
        disk.fsync_dir()
    assert disk.durable_content("f") is None


def test_crash_after_n_operations() -> None:
    disk = _disk()
    disk.crash_after(2)
    disk.append("f", b"a")
    disk.fsync("f")
    with pytest.raises(SimulatedCrash):
        disk.fsync_dir()  # third mutating operation: dies, without effect
    with pytest.raises(SimulatedCrash):
        disk.list()  # dead until crash()
    disk.crash(random.Random(0))
    assert disk.list() == ()
    disk.append("f", b"alive again")


def test_crash_after_zero_dies_at_once() -> None:
    disk = _disk()
    disk.crash_after(0)
    with pytest.raises(SimulatedCrash):
        disk.append("f", b"a")
    disk.crash(random.Random(0))
    assert disk.list() == ()


def test_flip_bit_damages_durable_and_volatile() -> None:
    disk = _disk()
    _durable_file(disk, "f", b"\x00\x00")
    disk.flip_bit("f", 1, 3)
    assert disk.read("f") == b"\x00\x08"
    disk.crash(random.Random(0))
    assert disk.read("f") == b"\x00\x08"
    with pytest.raises(ValueError):
        disk.flip_bit("f", 2, 0)
    with pytest.raises(ValueError):
        disk.flip_bit("f", 0, 8)


def test_flip_random_bit_stays_in_synced_regions() -> None:
    disk = _disk()
    _durable_file(disk, "a", bytes(100))
    _durable_file(disk, "b", bytes(100))
    disk.append("b", bytes(50))  # not synced: never flipped
    for seed in range(200):
        hit = disk.flip_random_bit(random.Random(seed), {"a": (10, 20), "b": (90, 140)})
        assert hit is not None
        name, offset, bit = hit
        assert (name == "a" and 10 <= offset < 20) or (name == "b" and 90 <= offset < 100)
        disk.flip_bit(name, offset, bit)  # undo
    assert disk.read("a") == bytes(100) and disk.read("b") == bytes(150)
    assert disk.flip_random_bit(random.Random(0), {"b": (100, 150), "zz": (0, 9)}) is None


def test_statistics_count_operations() -> None:
    disk = _disk()
    _durable_file(disk, "f", b"abc")
    disk.rename("f", "g")
    disk.truncate("g", 1)
    disk.remove("g")
    stats = disk.statistics()
    assert (stats.appends, stats.bytes_appended, stats.fsyncs, stats.dir_fsyncs) == (1, 3, 1, 1)
    assert (stats.renames, stats.truncates, stats.removes, stats.operations) == (1, 1, 1, 6)
    assert (stats.files, stats.bytes_stored, stats.full) == (0, 0, False)
