"""Private namespaces for a run with link or disk faults.

With ``--links`` every node listens for other nodes on the wildcard address: gossip never
dials a wildcard (it says nothing about where a node is reachable), so the only links are the
ones each node dials through its ``--join`` URLs — the fault proxies. Listening on the wildcard
must not open ports on the machine's real interfaces, so the run first moves itself into a new
network namespace holding only its own loopback (unprivileged: inside a new user namespace
that maps the caller's own uid and gid). Every node, runner and client of the run is a child
and shares it; nothing outside can reach it, and it goes away with the run.

With disk faults the run also takes a private mount namespace, where each node's data dir is
a small ``tmpfs`` of its own (:func:`mount_small_fs`) that a fault fills (:mod:`skulk.chaos._disk`):
a real filesystem running out of space, seen by the node as ``ENOSPC`` from the kernel. The
mounts vanish with the run's namespace.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import socket
import struct
from pathlib import Path

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1


class NamespaceError(RuntimeError):
    """The kernel refused a new namespace or a mount (the message says why)."""


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        raise NamespaceError(f"{what}: {os.strerror(ctypes.get_errno())}")


def enter_private_namespaces(*, network: bool, mounts: bool) -> None:
    """Move this process (single-threaded: call it first) into a new network namespace (its
    loopback brought up) and/or a new mount namespace whose mounts do not propagate out.
    Unprivileged callers get a new user namespace mapping their own uid and gid. Linux only."""
    flags = (CLONE_NEWNET if network else 0) | (CLONE_NEWNS if mounts else 0)
    if not flags:
        return
    if os.geteuid() == 0:
        _check(_libc().unshare(flags), "unshare")
    else:
        uid, gid = os.getuid(), os.getgid()
        _check(_libc().unshare(CLONE_NEWUSER | flags), "unshare")
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"{uid} {uid} 1")
        Path("/proc/self/gid_map").write_text(f"{gid} {gid} 1")
    if mounts:  # nothing mounted here may reach the parent namespace
        _check(
            _libc().mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount --make-rprivate /"
        )
    if network:
        _loopback_up()


def mount_small_fs(path: Path, size_bytes: int) -> None:
    """Mount a ``tmpfs`` of ``size_bytes`` at ``path`` (inside :func:`enter_private_namespaces`
    with ``mounts``)."""
    options = f"size={size_bytes},mode=0700".encode()
    result = _libc().mount(b"tmpfs", str(path).encode(), b"tmpfs", MS_NOSUID | MS_NODEV, options)
    _check(result, f"mount tmpfs at {path}")


def unmount(path: Path) -> None:
    """Unmount what :func:`mount_small_fs` mounted at ``path`` (lazily: files may be open)."""
    _check(_libc().umount2(str(path).encode(), MNT_DETACH), f"umount {path}")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        req = struct.pack("16sh", b"lo", 0)
        flags = struct.unpack("16sh", fcntl.ioctl(sock, SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(sock, SIOCSIFFLAGS, struct.pack("16sh", b"lo", flags | IFF_UP))


def in_private_network() -> bool:
    """Whether only a loopback interface is visible (so a wildcard listener is private)."""
    return [name for _, name in socket.if_nameindex()] == ["lo"]
