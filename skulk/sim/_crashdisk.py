"""A :class:`~skulk.consensus.Disk` wrapper for process-level faults on a :class:`SimDisk`.

The simulated disk (:mod:`skulk.sim._disk`) models the *device*: lost un-fsynced data, torn
writes, ENOSPC. This wrapper adds the faults that kill the *process* at a chosen point -- a
death at the ``n``-th next mutating operation, raising :class:`SimulatedCrash` wherever storage
code is (half way through appending a record, between writing a snapshot file and renaming
it, before a directory fsync) -- and a failed fsync, armed here rather than on the device so
that the world can take them back, plus what needs to know *what* is being written:

* :meth:`CrashingDisk.crash_after` and :meth:`CrashingDisk.fail_next_fsync` are armed here so
  that :meth:`CrashingDisk.disarm` (``heal_all``) can cancel them: after
  healing, no fault armed earlier may still go off;
* :meth:`CrashingDisk.crash_on_next_snapshot` arms a death for when the node starts persisting
  a Ready that carries a snapshot (a local compaction or an installed leader snapshot);
* the ``skip-fsync`` negative control: with ``skip_fsync`` set, ``fsync`` and ``fsync_dir``
  return without syncing.
"""

from __future__ import annotations

import errno

from skulk.consensus import DiskError
from skulk.sim._disk import SimDisk, SimulatedCrash

SimCrash = SimulatedCrash
"""The exception a simulated process death raises (a BaseException: storage cannot swallow it)."""


class CrashingDisk:
    """``inner`` seen through the storage's eyes, with snapshot-triggered deaths."""

    def __init__(self, inner: SimDisk, *, skip_fsync: bool = False) -> None:
        self.inner = inner
        self.skip_fsync = skip_fsync
        self._on_snapshot = 0
        self._countdown = 0
        self._fail_fsync = False

    # --- arming ---------------------------------------------------------------------------

    def crash_after(self, n: int) -> None:
        """Die at the ``n``-th next mutating operation (``n >= 1``), before it happens."""
        self._countdown = max(1, n)

    def fail_next_fsync(self) -> None:
        """The next ``fsync`` or ``fsync_dir`` raises ``DiskError`` (EIO) and syncs nothing."""
        self._fail_fsync = True

    def crash_on_next_snapshot(self, n: int) -> None:
        """Arm :meth:`crash_after` ``n`` for when the node starts persisting a snapshot."""
        self._on_snapshot = max(1, n)

    def persisting_snapshot(self) -> None:
        """Called by the node before it persists a Ready carrying a snapshot."""
        if self._on_snapshot:
            self.crash_after(self._on_snapshot)
            self._on_snapshot = 0

    def disarm(self) -> None:
        """Cancel every armed death and fsync failure."""
        self._on_snapshot = 0
        self._countdown = 0
        self._fail_fsync = False

    def _mutating(self) -> None:
        if self._countdown:
            self._countdown -= 1
            if self._countdown == 0:
                raise SimulatedCrash("the simulated process died at a disk operation")

    def _fsync_fault(self, name: str) -> None:
        if self._fail_fsync:
            self._fail_fsync = False
            raise DiskError(errno.EIO, "fsync failed (simulated)", name)

    # --- the Disk protocol ------------------------------------------------------------------

    def list(self) -> tuple[str, ...]:
        return self.inner.list()

    def read(self, name: str) -> bytes:
        return self.inner.read(name)

    def size(self, name: str) -> int:
        return self.inner.size(name)

    def append(self, name: str, data: bytes) -> None:
        self._mutating()
        self.inner.append(name, data)

    def truncate(self, name: str, size: int) -> None:
        self._mutating()
        self.inner.truncate(name, size)

    def fsync(self, name: str) -> None:
        self._mutating()
        self._fsync_fault(name)
        if not self.skip_fsync:
            self.inner.fsync(name)

    def rename(self, src: str, dst: str) -> None:
        self._mutating()
        self.inner.rename(src, dst)

    def remove(self, name: str) -> None:
        self._mutating()
        self.inner.remove(name)

    def fsync_dir(self) -> None:
        self._mutating()
        self._fsync_fault(".")
        if not self.skip_fsync:
            self.inner.fsync_dir()
