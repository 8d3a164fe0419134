"""The real :class:`~skulk.consensus._disk.Disk`: one directory on the local file system."""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

from ._disk import DiskError, DiskFull

__all__ = ["OsDisk"]

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


@contextlib.contextmanager
def _translated(path: Path) -> Iterator[None]:
    """Turn ``OSError`` into :class:`DiskFull` (no space, or over quota) or :class:`DiskError`,
    keeping errno and chaining the original."""
    try:
        yield
    except DiskError:
        raise
    except OSError as exc:
        kind = DiskFull if exc.errno in _FULL_ERRNOS else DiskError
        raise kind(exc.errno or errno.EIO, exc.strerror or str(exc), str(path)) from exc


class OsDisk:
    """``directory`` (created if missing) as a :class:`~skulk.consensus._disk.Disk`.

    Files are appended through file descriptors kept open between calls (closed when the file
    is truncated, renamed or removed, and by :meth:`close`), so a stream of small appends costs
    one ``write`` each. Names are plain file names: no ``/``, not ``.`` or ``..``. Every method
    raises :class:`DiskFull` for ENOSPC/EDQUOT and :class:`DiskError` for any other
    ``OSError``, with the original chained as ``__cause__``.

    Use as a context manager, or call :meth:`close` when done.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        with _translated(self.directory):
            self.directory.mkdir(parents=True, exist_ok=True)
        self._fds: dict[str, int] = {}

    def __enter__(self) -> OsDisk:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close every cached file descriptor (the directory stays usable: a later append
        opens it again)."""
        while self._fds:
            _, fd = self._fds.popitem()
            with contextlib.suppress(OSError):
                os.close(fd)

    def _path(self, name: str) -> Path:
        if not name or name in (".", "..") or "/" in name or "\0" in name:
            raise ValueError(f"not a plain file name: {name!r}")
        return self.directory / name

    def _forget(self, name: str) -> None:
        fd = self._fds.pop(name, None)
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def list(self) -> tuple[str, ...]:
        with _translated(self.directory), os.scandir(self.directory) as it:
            return tuple(sorted(e.name for e in it if e.is_file(follow_symlinks=False)))

    def read(self, name: str) -> bytes:
        path = self._path(name)
        with _translated(path):
            return path.read_bytes()

    def size(self, name: str) -> int:
        path = self._path(name)
        with _translated(path):
            return path.stat().st_size

    def append(self, name: str, data: bytes) -> None:
        """Append ``data`` (a short ``write`` is continued; on :class:`DiskFull` what was
        written stays written, as the protocol says)."""
        path = self._path(name)
        with _translated(path):
            fd = self._fds.get(name)
            if fd is None:
                flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                fd = self._fds[name] = os.open(path, flags, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]

    def truncate(self, name: str, size: int) -> None:
        path = self._path(name)
        self._forget(name)
        with _translated(path):
            os.truncate(path, size)

    def fsync(self, name: str) -> None:
        path = self._path(name)
        with _translated(path):
            fd = self._fds.get(name)
            if fd is not None:
                os.fsync(fd)
                return
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def rename(self, src: str, dst: str) -> None:
        src_path, dst_path = self._path(src), self._path(dst)
        self._forget(src)
        self._forget(dst)
        with _translated(src_path):
            os.replace(src_path, dst_path)

    def remove(self, name: str) -> None:
        path = self._path(name)
        self._forget(name)
        with _translated(path):
            os.unlink(path)

    def fsync_dir(self) -> None:
        with _translated(self.directory):
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
