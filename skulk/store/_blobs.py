"""Blob file primitives: copy while hashing, link or copy into a model directory, hash."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path

_BLOCK = 8 * 1024 * 1024
#: A hard link refused for these reasons falls back to a copy (a file system without links,
#: a different file system, too many links to one inode).
_NO_LINK = frozenset(
    {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EACCES}
)
READ_ONLY = stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH


def copy_hashing(src: Path, dst: Path, progress: Callable[[int], None] | None = None) -> str:
    """Copy ``src`` to ``dst`` (replaced), fsync it, and return the sha256 (hex) of the bytes
    written: the copy's true content, whatever happens to ``src`` meanwhile. ``progress`` gets
    the bytes copied so far after each block."""
    digest = hashlib.sha256()
    done = 0
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        buf = bytearray(_BLOCK)
        view = memoryview(buf)
        while n := fin.readinto(buf):
            fout.write(view[:n])
            digest.update(view[:n])
            done += n
            if progress is not None:
                progress(done)
        fout.flush()
        os.fsync(fout.fileno())
    return digest.hexdigest()


def hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        buf = bytearray(_BLOCK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def link_or_copy(src: Path, dst: Path) -> bool:
    """Make ``dst`` a hard link to ``src``; where the file system refuses, a read-only, fsynced
    copy, written aside and renamed (so ``dst`` never holds part of the bytes). Returns whether
    it is a link."""
    try:
        os.link(src, dst)
        return True
    except OSError as exc:
        if exc.errno not in _NO_LINK:
            raise
    tmp = dst.with_name(f".{dst.name}.{secrets.token_hex(4)}.tmp")
    try:
        shutil.copyfile(src, tmp)
        os.chmod(tmp, READ_ONLY)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return False


def same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False
