"""Sampling this node's :class:`~skulk.wire.telemetry.NodeReadings` (stdlib and mlx only).

The I/O edge of the telemetry plane: it reads ``/proc/meminfo``, ``os.sysconf``, the load
average and the clock. Reading is cheap (a few small reads, well under a millisecond) except the
first call, which imports ``mlx.core`` to read its version and backends (cached for the life of
the process: neither changes while it runs), so call it once at start-up, off the event loop if
the import is slow there.

A node given ``--memory-limit`` advertises at most that much memory (:func:`cap_memory`): what
the planner sees, so a test can make a model fit no single node on one machine.
"""

from __future__ import annotations

import functools
import importlib
import os
import platform
import shutil
import socket
import sys
from collections.abc import Iterable
from pathlib import Path

from skulk.clock import wall
from skulk.wire.telemetry import (
    MAX_FETCH_FAILURES,
    MAX_FETCHES,
    MAX_SERVING,
    MAX_TRANSFERS,
    ComputePorts,
    DiskReading,
    FetchFailure,
    FetchProgress,
    ModelTransfer,
    NodeReadings,
    RunnerReading,
    StoreReading,
)

_MEMINFO = "/proc/meminfo"


def sample_readings(
    node_id: str,
    listen_addresses: Iterable[str],
    api_address: str,
    *,
    sampled_at: float | None = None,
    memory_limit: int | None = None,
    runner_bytes: int = 0,
    compute: ComputePorts | None = None,
    fetches: Iterable[FetchProgress] = (),
    serving: Iterable[RunnerReading] = (),
    models_dir: Path | None = None,
    fetch_failures: Iterable[FetchFailure] = (),
    transfers: Iterable[ModelTransfer] = (),
    store: StoreReading | None = None,
) -> NodeReadings:
    """This node's readings now. ``sampled_at`` defaults to ``time.time()``. With
    ``memory_limit``, memory is capped as :func:`cap_memory` says (``runner_bytes``: what this
    node's runners use now). ``compute``, ``fetches``, ``serving`` and ``fetch_failures`` are
    published as given (at most :data:`~skulk.wire.telemetry.MAX_FETCHES` fetches,
    :data:`~skulk.wire.telemetry.MAX_SERVING` runners and the newest
    :data:`~skulk.wire.telemetry.MAX_FETCH_FAILURES` failures). With ``models_dir``, the free
    space of the file system holding it is read (:func:`disk_reading`; one ``statvfs``).
    ``transfers`` (at most :data:`~skulk.wire.telemetry.MAX_TRANSFERS`) and ``store`` are
    published as given.

    Memory comes from ``/proc/meminfo`` (``MemTotal``, ``MemAvailable``) on Linux, else from
    ``os.sysconf`` (physical pages; available pages where the platform has them, otherwise the
    total is reported as available: macOS has no portable stdlib reading of reclaimable memory).
    A reading that fails is 0 (``load_1m`` 0.0 where there is no load average), never an
    exception: a telemetry sample must not take the node down.
    """
    total, available = cap_memory(*_memory(), memory_limit, runner_bytes)
    mlx_version, backends = _mlx_info()
    return NodeReadings(
        node_id=node_id,
        hostname=_hostname(),
        platform=f"{sys.platform}-{platform.machine() or 'unknown'}",
        memory_total_bytes=total,
        memory_available_bytes=available,
        mlx_version=mlx_version,
        mlx_backends=backends,
        cpu_count=os.cpu_count() or 1,
        load_1m=_load_1m(),
        listen_addresses=tuple(listen_addresses),
        api_address=api_address,
        sampled_at=wall() if sampled_at is None else sampled_at,
        compute=compute,
        fetches=tuple(fetches)[:MAX_FETCHES],
        serving=tuple(serving)[:MAX_SERVING],
        disk=None if models_dir is None else disk_reading(models_dir),
        fetch_failures=tuple(fetch_failures)[-MAX_FETCH_FAILURES:],
        transfers=tuple(transfers)[:MAX_TRANSFERS],
        store=store,
    )


def disk_reading(models_dir: Path) -> DiskReading | None:
    """The free space of the file system holding ``models_dir`` (or its nearest existing
    parent: a new node has no models directory yet); ``None`` when nothing can be read."""
    path = Path(os.path.abspath(models_dir))
    probe = path
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError:
        return None
    return DiskReading(str(path), int(usage.free), int(usage.total))


def cap_memory(
    total: int, available: int, limit: int | None, runner_bytes: int = 0
) -> tuple[int, int]:
    """``(total, available)`` as a node with ``--memory-limit limit`` advertises them: at most
    ``limit`` in all, and available at most what the limit leaves beside the memory this
    node's runners use (``runner_bytes``); never below 0. ``limit`` ``None``: unchanged."""
    if limit is None:
        return total, available
    limit = int(limit)  # an int subclass (a parsed size) is not an int on the wire
    left = max(0, limit - max(0, int(runner_bytes)))
    return min(total, limit), max(0, min(available, left))


def _hostname() -> str:
    try:
        return socket.gethostname()
    except OSError:
        return ""


def _load_1m() -> float:
    try:
        return float(os.getloadavg()[0])
    except (OSError, AttributeError):
        return 0.0


def _memory() -> tuple[int, int]:
    """``(total, available)`` bytes."""
    meminfo = _read_meminfo(_MEMINFO)
    if meminfo is not None:
        return meminfo
    total = _sysconf_bytes("SC_PHYS_PAGES")
    available = _sysconf_bytes("SC_AVPHYS_PAGES") if total else 0
    return total, (available or total)


def _read_meminfo(path: str) -> tuple[int, int] | None:
    """``(MemTotal, MemAvailable)`` in bytes from a meminfo file, or ``None`` if unreadable."""
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read(65536)
    except OSError:
        return None
    return parse_meminfo(text)


def parse_meminfo(text: str) -> tuple[int, int] | None:
    """``(MemTotal, MemAvailable)`` in bytes from ``/proc/meminfo`` text; ``MemFree`` stands in
    for ``MemAvailable`` on kernels older than 3.14. ``None`` without ``MemTotal``."""
    fields: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        parts = rest.split()
        if parts and parts[0].isdigit():
            scale = 1024 if parts[1:2] == ["kB"] else 1
            fields[name.strip()] = int(parts[0]) * scale
    total = fields.get("MemTotal")
    if not total:
        return None
    available = fields.get("MemAvailable", fields.get("MemFree", 0))
    return total, min(available, total)


def _sysconf_bytes(name: str) -> int:
    try:
        pages = os.sysconf(name)
        page_size = os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0
    return max(pages, 0) * max(page_size, 0)


@functools.cache
def _mlx_info() -> tuple[str, tuple[str, ...]]:
    """``(mlx version, usable backends)``; ``("", ())`` without mlx."""
    try:
        mx = importlib.import_module("mlx.core")
    except Exception:  # a broken install must not stop telemetry
        return "", ()
    version = str(getattr(mx, "__version__", ""))
    backends = ["cpu"]
    for name in ("metal", "cuda"):
        if _backend_available(mx, name):
            backends.append(name)
    return version, tuple(backends)


def _backend_available(mx: object, name: str) -> bool:
    is_available = getattr(getattr(mx, name, None), "is_available", None)
    if not callable(is_available):
        return False
    try:
        return bool(is_available())
    except Exception:
        return False
