"""The file operations storage needs, behind one small interface.

:class:`Disk` is a flat directory of named files. :class:`OsDisk` is the real one;
``skulk.sim`` has a simulated one that loses what was not synced when its node crashes, tears
the last write, fills up and fails fsync on demand. Storage logic (:mod:`._storage`) is written
against this interface only, so the simulator runs the same code as a live node.

Durability contract (the POSIX one): data written to a file is durable once :meth:`Disk.fsync`
of that file returns; a created, renamed or removed *name* is durable once
:meth:`Disk.fsync_dir` returns. Errors: :class:`DiskFull` (ENOSPC) and :class:`DiskError`
(anything else, including a failed fsync, after which the file's durable content is unknown).
"""

from __future__ import annotations

from typing import Protocol


class DiskError(OSError):
    """An I/O error. After a failed fsync nothing about the file's durability is known: the
    caller must treat the process as crashed (restart and recover from what is on disk)."""


class DiskFull(DiskError):
    """No space left (ENOSPC): the write did not happen (or happened partially; see
    :meth:`Disk.append`)."""


class Disk(Protocol):
    def list(self) -> tuple[str, ...]:
        """Names of the files in the directory, sorted."""
        ...

    def read(self, name: str) -> bytes:
        """The whole content of ``name`` as this process sees it."""
        ...

    def size(self, name: str) -> int: ...

    def append(self, name: str, data: bytes) -> None:
        """Append ``data`` to ``name``, creating it if missing. On :class:`DiskFull` a prefix
        of ``data`` may have been written; the caller truncates back to the old size."""
        ...

    def truncate(self, name: str, size: int) -> None: ...

    def fsync(self, name: str) -> None: ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically replace ``dst`` with ``src`` (durable after :meth:`fsync_dir`)."""
        ...

    def remove(self, name: str) -> None: ...

    def fsync_dir(self) -> None: ...
