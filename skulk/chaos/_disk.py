"""Disk faults: a node's data dir filling up.

With ``disks`` each node's data dir is a small ``tmpfs`` of its own (:data:`NODE_DISK_BYTES`,
mounted by :func:`~skulk.chaos._namespace.mount_small_fs` in the run's private mount
namespace). A ``disk`` fault writes a filler file into it until the kernel answers ``ENOSPC``,
so Raft storage, the model store and every other write of that node fail for real; healing
deletes the filler. The shared demo model is outside the data dir (``models/`` is a link), so
a full disk never hides the model from a node that already has it.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

#: The size of each node's data dir with disk faults.
NODE_DISK_BYTES = 256 << 20
FILLER = ".chaos-filler"
_CHUNK = b"\0" * (1 << 20)


def fill(home: Path) -> int:
    """Fill the filesystem of ``home`` to the last byte; the bytes written. ``home`` must be a
    mount point (the node's own small filesystem): never the machine's disk."""
    if not os.path.ismount(home):
        raise ValueError(f"{home} is not a filesystem of its own: not filling it")
    written = 0
    fd = os.open(home / FILLER, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (_CHUNK, b"\0" * 4096, b"\0"):  # then the last pages, then the last bytes
            while True:
                try:
                    written += os.write(fd, chunk)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return written


def free(home: Path) -> None:
    """Give the space back (heal a :func:`fill`)."""
    (home / FILLER).unlink(missing_ok=True)
