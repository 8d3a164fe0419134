"""Downloading a checked :class:`~skulk.hub.HubPlan` into a staging directory, resumable and
verified.

Per file: a HEAD on ``resolve`` (huggingface_hub's ``get_hf_file_metadata``: the ETag, the
size, a redirect, Xet metadata), then the body with huggingface_hub's ``http_get`` into
``<staging>/.<name>.<etag[:16]>.part``, resumed with a ``Range`` from the part's size. Why
not ``hf_hub_download(local_dir=...)``: in huggingface_hub 2.4 it downloads into a
process-unique ``*.incomplete`` file and deletes it on any failure, so a download cut (or a
node killed) restarts from byte 0. ``http_get`` itself resumes a stream broken mid-file (up
to 5 times while no byte arrives), but bytes it holds in its read buffer when the stream
breaks are lost; that buffer is ``constants.DOWNLOAD_CHUNK_SIZE`` (10 MiB by default), which
this module lowers to :data:`CHUNK_BYTES` process-wide, so a cut re-sends at most that.

When the Hub serves a file through Xet (the HEAD carries Xet metadata and ``hf_xet`` is
installed), ``xet_get`` fetches it instead: its resume is hf_xet's chunk cache, its
progress comes from its "reconstructing" bar, and ``cancel_check`` is polled only between
files (not tested here: the local endpoint serves no Xet).

Bytes are written and hashed by a writer thread while the next ones arrive (a resumed part's
earlier bytes are read once), and a finished part is checked (its size, and the LFS sha256 or
the git blob sha1 of a small file) and fsynced before it is renamed to ``<staging>/<name>``;
one that does not match is deleted and fetched once more from zero, then :class:`HashMismatch`.
A file already in staging under its name is rehashed and kept when it matches. Everything is
blocking: run it in a worker thread.
"""

from __future__ import annotations

import hashlib
import os
import queue
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO, cast
from urllib.parse import urlsplit

from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url
from huggingface_hub.file_download import http_get, xet_get
from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # lazy export
from huggingface_hub.utils._runtime import is_xet_available

from skulk.hub._calls import DEFAULT_POLICY, HubPolicy, call_hub
from skulk.hub._errors import DownloadCancelled, HashMismatch, HubError
from skulk.hub._plan import HubFile, HubPlan
from skulk.hub._progress import Meter, ProgressCallback
from skulk.hub._tqdm import SilentTqdm, forwarding_tqdm

#: The read buffer of a body (what a broken stream can lose, so what a cut re-sends).
CHUNK_BYTES = 512 * 1024
_HASH_BLOCK = 8 * 1024 * 1024
#: Chunks received and not yet written (each at most :data:`CHUNK_BYTES`).
_WRITE_QUEUE = 8


def download(
    plan: HubPlan,
    staging_dir: Path,
    progress: ProgressCallback | None = None,
    cancel_check: Callable[[], bool] | None = None,
    *,
    token: str | None = None,
    policy: HubPolicy = DEFAULT_POLICY,
) -> dict[str, str]:
    """Download every file of ``plan`` into ``staging_dir`` (created if needed; partial
    files of an earlier attempt there are resumed) and return ``{name: sha256 hex}``, each
    file verified against the Hub's hash. ``progress`` is called from this thread at a
    file's start and end and every :data:`~skulk.hub._progress.REPORT_INTERVAL_S` while
    bytes move; ``cancel_check`` is polled as bytes arrive (``True`` raises
    :class:`DownloadCancelled`, leaving the part files). Raises :class:`HubError`
    subclasses; ``OSError`` from the disk (``ENOSPC``: the caller's ``disk_full``)."""
    # Process-wide, but only ever lowered: the buffer a broken stream loses (module doc).
    constants.DOWNLOAD_CHUNK_SIZE = min(constants.DOWNLOAD_CHUNK_SIZE, CHUNK_BYTES)
    staging_dir.mkdir(parents=True, exist_ok=True)
    meter = Meter(str(plan.ref), plan.total_bytes, progress)
    out: dict[str, str] = {}
    for file in plan.files:
        if cancel_check is not None and cancel_check():
            raise DownloadCancelled(str(plan.ref))
        out[file.name] = _download_file(plan, file, staging_dir, meter, cancel_check, token, policy)
    return out


def part_path(staging_dir: Path, file: HubFile) -> Path:
    """Where ``file``'s bytes accumulate until they verify (keyed by its hash, so a part
    of another revision's file is never resumed into this one)."""
    return staging_dir / f".{file.name}.{file.etag[:16]}.part"


def _download_file(
    plan: HubPlan,
    file: HubFile,
    staging: Path,
    meter: Meter,
    cancel_check: Callable[[], bool] | None,
    token: str | None,
    policy: HubPolicy,
) -> str:
    if not file.etag:
        raise HubError(str(plan.ref), f"Hub repo {plan.ref}: no hash listed for {file.name}")
    final = staging / file.name
    if final.is_file():
        sha256, ok = _verify(final, file)
        if ok:
            meter.start_file(file.name, file.size, file.size)
            meter.finish_file()
            return sha256
        final.unlink()
    part = part_path(staging, file)
    got = ""
    for _ in range(2):
        sha256, ok = call_hub(
            plan.ref,
            plan.endpoint,
            token,
            policy,
            lambda: _fetch(plan, file, part, meter, cancel_check, token, policy),
        )
        if ok:
            os.replace(part, final)
            meter.finish_file()
            return sha256
        got = sha256
        part.unlink()
        meter.set_file_done(0)
    raise HashMismatch(str(plan.ref), file.name, file.etag, got)


def _fetch(
    plan: HubPlan,
    file: HubFile,
    part: Path,
    meter: Meter,
    cancel_check: Callable[[], bool] | None,
    token: str | None,
    policy: HubPolicy,
) -> tuple[str, bool]:
    """One attempt: append what ``part`` lacks (or, with Xet, write it whole); returns
    what :func:`_verify` would (hashing the bytes as they are written, not reading them
    again)."""
    url = hf_hub_url(plan.ref.repo, file.name, revision=plan.commit, endpoint=plan.endpoint)
    headers = build_hf_headers(token=token, library_name="skulk")
    meta = get_hf_file_metadata(
        url, timeout=policy.call_timeout_s, headers=headers, endpoint=plan.endpoint
    )
    if meta.etag is not None and meta.etag != file.etag:
        raise HubError(
            str(plan.ref),
            f"Hub repo {plan.ref}: {file.name} has ETag {meta.etag[:16]}…, its listing "
            f"{file.etag[:16]}… (the Hub is inconsistent)",
        )
    if meta.xet_file_data is not None and is_xet_available():
        meter.start_file(file.name, file.size, 0)
        lock = threading.Lock()  # hf_xet reports from its own threads

        def written(n: int) -> None:
            with lock:
                meter.add(n)

        xet_get(
            incomplete_path=part,
            xet_file_data=meta.xet_file_data,
            headers=headers,
            expected_size=file.size,
            displayed_filename=file.name,
            tqdm_class=forwarding_tqdm(written),
        )
        return _verify(part, file)
    location = meta.location or url
    if _origin(location) != _origin(url):
        headers.pop("authorization", None)  # a signed CDN url: the token stays on the Hub
    with open(part, "ab") as f:
        have = f.tell()
        if have > file.size:  # not this file's bytes: start again
            f.truncate(0)
            have = 0
        meter.start_file(file.name, file.size, have)
        hashes = _Hashes(file)
        hashes.update_from(part, have)
        if have < file.size:
            sink = _Sink(f, part, hashes, meter, cancel_check, plan.ref.repo)
            try:
                http_get(
                    location,
                    cast(BinaryIO, sink),
                    resume_size=have,
                    headers=headers,
                    tqdm_class=SilentTqdm,
                )
            finally:
                sink.close()
        f.flush()
        os.fsync(f.fileno())
    return hashes.result()


class _Sink:
    """The file object ``http_get`` writes to (``f``, open on ``path`` for appending): counts
    the bytes and polls the cancel check after each write; a writer thread writes and hashes
    them, so the disk and the hash work while the next bytes arrive (at most
    :data:`_WRITE_QUEUE` chunks wait). Whatever was handed over before a cancellation or an
    error is written (it stays, for a resume); :meth:`close` waits for the writer and raises
    its error, if any."""

    def __init__(
        self,
        f: BinaryIO,
        path: Path,
        hashes: _Hashes,
        meter: Meter,
        cancel_check: Callable[[], bool] | None,
        repo: str,
    ) -> None:
        self._f = f
        self._path = path
        self._hashes = hashes
        self._meter = meter
        self._cancel_check = cancel_check
        self._repo = repo
        self._queue: queue.Queue[bytes | None] = queue.Queue(_WRITE_QUEUE)
        self._error: BaseException | None = None
        self._writer = threading.Thread(target=self._write_all, name="hub-writer", daemon=True)
        self._writer.start()

    def _write_all(self) -> None:
        while (data := self._queue.get()) is not None:
            if self._error is None:
                try:
                    self._f.write(data)
                    self._hashes.update(data)
                except BaseException as exc:  # handed to the downloading thread
                    self._error = exc
            self._queue.task_done()
        self._queue.task_done()

    def _drain(self) -> None:
        """Wait until every handed-over byte is written; raise the writer's error."""
        self._queue.join()
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Stop the writer once it has written everything; raise its error, if any."""
        self._queue.put(None)
        self._writer.join()
        if self._error is not None:
            raise self._error

    def write(self, data: bytes) -> int:
        if self._error is not None:
            raise self._error
        self._queue.put(bytes(data))
        self._meter.add(len(data))
        if self._cancel_check is not None and self._cancel_check():
            self._drain()
            raise DownloadCancelled(self._repo)
        return len(data)

    def tell(self) -> int:
        self._drain()
        return self._f.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        self._drain()
        return self._f.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        """(``http_get`` truncates when a server ignored its ``Range`` and sends from 0.)"""
        self._drain()
        n = self._f.truncate(size)
        self._f.flush()
        kept = self._f.tell() if size is None else size
        self._hashes.reset()
        self._hashes.update_from(self._path, kept)
        self._meter.set_file_done(kept)
        return n


class _Hashes:
    """A file's running hashes: sha256, plus the git blob sha1 for a small (git) file."""

    def __init__(self, file: HubFile) -> None:
        self._file = file
        self.reset()

    def reset(self) -> None:
        self._size = 0
        self._sha256 = hashlib.sha256()
        self._sha1 = None
        if self._file.sha256 is None:
            self._sha1 = hashlib.sha1(b"blob %d\0" % self._file.size, usedforsecurity=False)

    def update(self, data: bytes) -> None:
        self._size += len(data)
        self._sha256.update(data)
        if self._sha1 is not None:
            self._sha1.update(data)

    def update_from(self, path: Path, n: int) -> None:
        """Add the first ``n`` bytes of ``path``."""
        if n <= 0:
            return
        with open(path, "rb") as f:
            while n > 0 and (block := f.read(min(n, _HASH_BLOCK))):
                self.update(block)
                n -= len(block)

    def result(self) -> tuple[str, bool]:
        """``(sha256 hex, whether the bytes are what the Hub lists)``."""
        digest = self._sha256.hexdigest()
        if self._size != self._file.size:
            return digest, False
        if self._sha1 is not None:
            return digest, self._sha1.hexdigest() == self._file.git_sha1
        return digest, digest == self._file.sha256


def _verify(path: Path, file: HubFile) -> tuple[str, bool]:
    """Hash ``path`` as :class:`_Hashes` does."""
    hashes = _Hashes(file)
    hashes.update_from(path, path.stat().st_size)
    return hashes.result()


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port
