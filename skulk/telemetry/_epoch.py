"""This node's telemetry epoch: bumped and made durable once per start-up, so that this life's
versions beat every version of earlier ones."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

EPOCH_FILE_NAME = "telemetry-epoch"
"""The file in the data dir holding the last epoch this node used (decimal, ASCII)."""


class EpochFileCorrupt(Exception):
    """The epoch file in the data dir does not hold a decimal epoch; Skulk does not guess one
    (a guess lower than the last epoch would make this node's fresh readings lose)."""

    def __init__(self, path: Path, detail: str) -> None:
        super().__init__(f"{path}: {detail}; delete it only if no other node state is kept there")
        self.path = path
        self.detail = detail


_MAX_EPOCH = 2**64 - 1


def next_epoch(home: Path) -> int:
    """Bump and return this node's telemetry epoch, kept in ``home / "telemetry-epoch"``.

    Call once per start-up, before publishing: the first call returns 1. The new value is on
    disk (temp file, fsync, rename, directory fsync) before it is returned, so a crash never
    reuses an epoch. Raises :class:`EpochFileCorrupt` for a file that is not a decimal number,
    and ``OSError`` when the data dir cannot be written.
    """
    home.mkdir(parents=True, exist_ok=True)
    path = home / EPOCH_FILE_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        previous = 0
    else:
        text = raw.decode("ascii", errors="replace").strip()
        if not text.isdigit() or not text.isascii() or len(text) > 20:
            raise EpochFileCorrupt(path, f"expected a decimal epoch, found {raw[:40]!r}")
        previous = int(text)
        if previous >= _MAX_EPOCH:
            raise EpochFileCorrupt(path, f"epoch {previous} is at the limit")
    epoch = previous + 1
    fd, tmp = tempfile.mkstemp(prefix=f".{EPOCH_FILE_NAME}.", dir=home)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(f"{epoch}\n".encode("ascii"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(home, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return epoch
