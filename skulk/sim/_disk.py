"""An in-memory :class:`~skulk.consensus.Disk` that loses what was not synced.

:class:`SimDisk` models a device under a process that may die at any moment:

* every file has *volatile* content (what reads see) and *durable* content (what a crash
  leaves); ``fsync(name)`` makes the file's content durable;
* the directory has a volatile and a durable name -> file map; creating (the first
  ``append``), ``rename`` and ``remove`` change the volatile map only, ``fsync_dir`` makes the
  whole map durable. A file's data and its name are durable independently, as in POSIX: a
  synced file whose creation was never ``fsync_dir``-ed vanishes in a crash;
* :meth:`SimDisk.crash` reverts everything to the durable state, except that a random prefix
  of each file's un-synced *appended* bytes may survive (a torn write);
* :meth:`SimDisk.set_full` makes appends fail with :class:`DiskFull` after writing a random
  prefix (a partial write), and file creation fail outright;
* :meth:`SimDisk.fail_next_fsync` makes the next ``fsync``/``fsync_dir`` fail with
  :class:`DiskError` (nothing becomes durable); the simulator then crashes the node;
* :meth:`SimDisk.crash_after` kills the process at the next-but-``n`` mutating operation with
  :class:`SimulatedCrash`; the disk refuses everything until :meth:`SimDisk.crash`;
* :meth:`SimDisk.flip_bit` / :meth:`SimDisk.flip_random_bit` damage synced bytes (bit rot).

Everything is deterministic given the ``random.Random`` instances passed in: no clock, no
global random state, sorted iteration.
"""

from __future__ import annotations

import errno
import random
from collections.abc import Mapping

import attrs

from skulk.consensus import DiskError, DiskFull

__all__ = ["SimDisk", "SimDiskStatistics", "SimulatedCrash"]


class SimulatedCrash(BaseException):
    """The simulated process died at a disk operation (see :meth:`SimDisk.crash_after`).

    A ``BaseException`` so that no ``except Exception`` in storage code can swallow a death.
    """


@attrs.frozen
class SimDiskStatistics:
    """Counters of a :class:`SimDisk` since it was built (a crash does not reset them)."""

    files: int
    """Files in the volatile directory now."""
    bytes_stored: int
    """Total volatile size of those files now."""
    appends: int
    bytes_appended: int
    fsyncs: int
    dir_fsyncs: int
    truncates: int
    renames: int
    removes: int
    operations: int
    """Mutating operations attempted (append, truncate, fsync, rename, remove, fsync_dir)."""
    crashes: int
    torn_writes: int
    """Files that kept a non-empty prefix of un-synced bytes in a crash."""
    full_refusals: int
    failed_fsyncs: int
    bit_flips: int
    full: bool


class _Inode:
    """One file's content. ``data`` is volatile. The durable content is ``durable`` when set,
    else ``data[:synced]`` (kept implicit so that append + fsync is O(appended bytes))."""

    __slots__ = ("data", "durable", "synced")

    def __init__(self) -> None:
        self.data = bytearray()
        self.synced = 0
        self.durable: bytes | None = None

    def durable_bytes(self) -> bytes:
        if self.durable is not None:
            return self.durable
        return bytes(self.data[: self.synced])

    def truncate(self, size: int) -> None:
        if self.durable is None and size < self.synced:
            self.durable = bytes(self.data[: self.synced])
        del self.data[size:]

    def sync(self) -> None:
        self.durable = None
        self.synced = len(self.data)

    def unsynced_appends(self) -> bytes:
        """Bytes appended since the last sync (empty if the file was truncated below it)."""
        if self.durable is None:
            return bytes(self.data[self.synced :])
        if self.data.startswith(self.durable):
            return bytes(self.data[len(self.durable) :])
        return b""

    def recover(self, kept: int, unsynced: bytes) -> None:
        """After a crash: the durable content plus the first ``kept`` un-synced bytes."""
        self.data = bytearray(self.durable_bytes() + unsynced[:kept])
        self.sync()

    def flip(self, offset: int, bit: int) -> None:
        mask = 1 << bit
        if offset < len(self.data):
            self.data[offset] ^= mask
        if self.durable is not None and offset < len(self.durable):
            damaged = bytearray(self.durable)
            damaged[offset] ^= mask
            self.durable = bytes(damaged)


def _missing(name: str) -> DiskError:
    return DiskError(errno.ENOENT, "no such file", name)


class SimDisk:
    """A deterministic in-memory directory implementing the ``Disk`` protocol.

    ``rng`` decides how much of a write lands before :class:`DiskFull` when the disk is full.
    Reads return copies; mutating the result does not touch the disk.
    """

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._dir: dict[str, _Inode] = {}
        self._durable_dir: dict[str, _Inode] = {}
        self._full = False
        self._fail_fsync = False
        self._countdown: int | None = None
        self._dead = False
        self._counts = dict.fromkeys(
            (
                "appends",
                "bytes_appended",
                "fsyncs",
                "dir_fsyncs",
                "truncates",
                "renames",
                "removes",
                "operations",
                "crashes",
                "torn_writes",
                "full_refusals",
                "failed_fsyncs",
                "bit_flips",
            ),
            0,
        )

    # --- fault controls -----------------------------------------------------------------

    def crash(self, rng: random.Random, *, torn_probability: float = 0.5) -> None:
        """The machine lost power: every file reverts to its durable content and the directory
        to its durable map. For each file, with ``torn_probability``, a prefix of its
        un-synced appended bytes (``rng.randrange(n + 1)`` of them) survives; after the
        crash what survived counts as synced. Also revives a dead disk and clears a pending
        :meth:`crash_after` and :meth:`fail_next_fsync` (being full is the device's state:
        it stays)."""
        self._counts["crashes"] += 1
        seen: set[int] = set()
        for name in sorted(self._durable_dir):
            inode = self._durable_dir[name]
            if id(inode) in seen:
                continue
            seen.add(id(inode))
            unsynced = inode.unsynced_appends()
            kept = 0
            if unsynced and rng.random() < torn_probability:
                kept = rng.randrange(len(unsynced) + 1)
                self._counts["torn_writes"] += kept > 0
            inode.recover(kept, unsynced)
        self._dir = dict(self._durable_dir)
        self._dead = False
        self._countdown = None
        self._fail_fsync = False

    def set_full(self, full: bool) -> None:
        """While full, ``append`` writes a random strict prefix of its data and raises
        :class:`DiskFull`, and an ``append`` that would create a file raises it at once."""
        self._full = full

    def fail_next_fsync(self) -> None:
        """The next ``fsync`` or ``fsync_dir`` raises :class:`DiskError` and syncs nothing."""
        self._fail_fsync = True

    def crash_after(self, n_ops: int) -> None:
        """Let ``n_ops`` more mutating operations happen; the one after raises
        :class:`SimulatedCrash` without taking effect, and so does every operation (reads
        included) until :meth:`crash` is called."""
        if n_ops < 0:
            raise ValueError("n_ops must be >= 0")
        self._countdown = n_ops

    def flip_bit(self, name: str, offset: int, bit: int) -> None:
        """Flip bit ``bit`` (0-7) of byte ``offset`` of ``name``, in both its volatile and its
        durable content (wherever that byte exists)."""
        if not 0 <= bit < 8:
            raise ValueError("bit must be in 0..7")
        inode = self._dir.get(name)
        if inode is None:
            raise _missing(name)
        if not 0 <= offset < max(len(inode.data), len(inode.durable_bytes())):
            raise ValueError(f"offset {offset} is outside {name}")
        inode.flip(offset, bit)
        self._counts["bit_flips"] += 1

    def flip_random_bit(
        self, rng: random.Random, regions: Mapping[str, tuple[int, int]]
    ) -> tuple[str, int, int] | None:
        """Flip one random bit of a *synced* byte inside ``regions`` (name -> ``[start, end)``
        byte range), chosen uniformly over all eligible bytes. Synced: within the durable
        content and equal to the volatile byte. Returns ``(name, offset, bit)``, or None if
        no byte is eligible. ``skulk.consensus.verified_regions`` gives the regions in
        which storage promises to detect damage."""
        spans: list[tuple[str, int, int]] = []
        for name in sorted(regions):
            inode = self._dir.get(name)
            if inode is None:
                continue
            start, end = regions[name]
            end = min(end, self._synced_prefix(inode))
            if end > start >= 0:
                spans.append((name, start, end))
        total = sum(end - start for _, start, end in spans)
        if total == 0:
            return None
        pick = rng.randrange(total)
        bit = rng.randrange(8)
        for name, start, end in spans:
            if pick < end - start:
                self.flip_bit(name, start + pick, bit)
                return name, start + pick, bit
            pick -= end - start
        raise AssertionError("unreachable")

    @staticmethod
    def _synced_prefix(inode: _Inode) -> int:
        if inode.durable is None:
            return inode.synced
        durable, data = inode.durable, inode.data
        n = min(len(durable), len(data))
        same = 0
        while same < n and durable[same] == data[same]:
            same += 1
        return same

    def statistics(self) -> SimDiskStatistics:
        return SimDiskStatistics(
            files=len(self._dir),
            bytes_stored=sum(len(inode.data) for inode in self._dir.values()),
            full=self._full,
            **self._counts,
        )

    def durable_content(self, name: str) -> bytes | None:
        """What ``name`` would hold after a crash without torn writes (None: it would not
        exist). For tests and invariant checks; not part of the ``Disk`` protocol."""
        inode = self._durable_dir.get(name)
        return None if inode is None else inode.durable_bytes()

    # --- the Disk protocol --------------------------------------------------------------

    def _alive(self) -> None:
        if self._dead:
            raise SimulatedCrash("the simulated process is dead; call SimDisk.crash()")

    def _mutating(self) -> None:
        self._alive()
        self._counts["operations"] += 1
        if self._countdown is not None:
            if self._countdown == 0:
                self._dead = True
                self._countdown = None
                raise SimulatedCrash("the simulated process died at a disk operation")
            self._countdown -= 1

    def _inode(self, name: str) -> _Inode:
        inode = self._dir.get(name)
        if inode is None:
            raise _missing(name)
        return inode

    def list(self) -> tuple[str, ...]:
        self._alive()
        return tuple(sorted(self._dir))

    def read(self, name: str) -> bytes:
        self._alive()
        return bytes(self._inode(name).data)

    def size(self, name: str) -> int:
        self._alive()
        return len(self._inode(name).data)

    def append(self, name: str, data: bytes) -> None:
        self._mutating()
        inode = self._dir.get(name)
        if inode is None:
            if self._full:
                self._counts["full_refusals"] += 1
                raise DiskFull(errno.ENOSPC, "no space left on device (simulated)", name)
            inode = self._dir[name] = _Inode()
        if self._full and data:
            self._counts["full_refusals"] += 1
            inode.data += data[: self._rng.randrange(len(data))]
            raise DiskFull(errno.ENOSPC, "no space left on device (simulated)", name)
        inode.data += data
        self._counts["appends"] += 1
        self._counts["bytes_appended"] += len(data)

    def truncate(self, name: str, size: int) -> None:
        self._mutating()
        inode = self._inode(name)
        if size < 0:
            raise ValueError("size must be >= 0")
        if size > len(inode.data):
            inode.data += bytes(size - len(inode.data))
        else:
            inode.truncate(size)
        self._counts["truncates"] += 1

    def _fsync_fault(self, name: str) -> None:
        if self._fail_fsync:
            self._fail_fsync = False
            self._counts["failed_fsyncs"] += 1
            raise DiskError(errno.EIO, "fsync failed (simulated)", name)

    def fsync(self, name: str) -> None:
        self._mutating()
        inode = self._inode(name)
        self._fsync_fault(name)
        inode.sync()
        self._counts["fsyncs"] += 1

    def rename(self, src: str, dst: str) -> None:
        self._mutating()
        inode = self._inode(src)
        del self._dir[src]
        self._dir[dst] = inode
        self._counts["renames"] += 1

    def remove(self, name: str) -> None:
        self._mutating()
        self._inode(name)
        del self._dir[name]
        self._counts["removes"] += 1

    def fsync_dir(self) -> None:
        self._mutating()
        self._fsync_fault(".")
        self._durable_dir = dict(self._dir)
        self._counts["dir_fsyncs"] += 1
