"""The raft-storage-full repro's full disk (:class:`skulk.repro._storage_faults.FullDisk`) on
real Raft storage: with one-byte segments every persist starts a new segment, the link to
``/dev/full`` makes that write fail ENOSPC from the kernel (``DiskFull``, nothing persisted),
storage removes the link, the full disk puts it back, and once it stops persisting works and
what was persisted before is recovered."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from skulk.consensus import DiskFull, Entry, EntryKind, HardState, OsDisk, Storage
from skulk.repro._storage_faults import FullDisk


def _entry(index: int) -> Entry:
    return Entry(index, 1, EntryKind.COMMAND, f"cmd {index}".encode(), "client", index)


def _wait(predicate: Callable[[], bool], seconds: float = 5.0) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.01)
    return False


def test_the_full_disk_fails_persists_with_enospc_until_it_stops(tmp_path: Path) -> None:
    raft = tmp_path / "raft"
    storage, _ = Storage.open(OsDisk(raft), segment_bytes=1)
    storage.persist(entries=[_entry(1)], hard_state=HardState(1, None, 1))
    disk = FullDisk(raft)
    disk.start()
    try:
        for _ in range(3):
            assert _wait(lambda: any(p.is_symlink() for p in raft.iterdir()))
            with pytest.raises(DiskFull) as info:
                storage.persist(entries=[_entry(2)])
            assert info.value.errno == 28  # ENOSPC, from the kernel
            assert storage.last_index == 1
        assert _wait(lambda: disk.hits >= 3)
    finally:
        disk.stop()
    assert not any(p.is_symlink() for p in raft.iterdir())
    storage.persist(entries=[_entry(2)])
    _, recovered = Storage.open(OsDisk(raft), segment_bytes=1)
    assert [e.index for e in recovered.entries] == [1, 2]
