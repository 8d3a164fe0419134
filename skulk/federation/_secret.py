"""The cluster secret: where it comes from, how it is stored, and the id it gives the cluster.

Every node of a cluster holds the same secret; it authenticates links (see
:mod:`skulk.federation._handshake`) and never crosses the wire. Sources, first match wins:

1. ``SKULK_CLUSTER_SECRET`` in the environment;
2. ``--cluster-secret-file PATH`` (the file must exist);
3. ``HOME/cluster-secret`` in the data dir, created on first start (32 random bytes) when
   absent.

Text form (environment and files alike): hex (64 or more hex digits) or unpadded/padded
base64url, surrounding whitespace ignored; at least :data:`MIN_SECRET_BYTES` bytes once decoded.
A string that is valid hex is read as hex. Files we write hold the hex form and a newline.

Files are refused (:class:`SecretError`) when group or others may read or write them, like
ssh does for private keys: a secret that other local users can read is not a secret, and
silently accepting it would teach operators to copy it carelessly. The fix is in the message
(``chmod 600 PATH``). The check applies to the data-dir file too.
"""

from __future__ import annotations

import base64
import binascii
import enum
import errno
import hashlib
import hmac
import os
import re
import secrets
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import NoReturn

import attrs

ENV_VAR = "SKULK_CLUSTER_SECRET"
SECRET_FILE_NAME = "cluster-secret"
MIN_SECRET_BYTES = 32
MAX_SECRET_BYTES = 1024
GENERATED_SECRET_BYTES = 32
_MAX_FILE_BYTES = 4 * MAX_SECRET_BYTES  # text forms are at most 2x the bytes, plus whitespace
_CLUSTER_ID_LABEL = b"skulk/cluster-id/v1\x00"
_HEX = re.compile(r"(?:[0-9a-fA-F]{2})+")
_B64URL = re.compile(r"[A-Za-z0-9_-]+={0,2}")


class SecretError(Exception):
    """The cluster secret cannot be loaded or stored; ``str()`` says what and how to fix it
    (never the secret itself)."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ClusterSecret:
    """The shared secret of a cluster: at least :data:`MIN_SECRET_BYTES` bytes.

    The bytes never leave the object except through :meth:`to_text` (for writing the secret
    file); use :meth:`mac` to authenticate. ``repr()``/``str()`` show only the cluster id.
    Comparison is constant-time.
    """

    __slots__ = ("_cluster_id", "_key")

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes):
            raise TypeError("ClusterSecret needs bytes")
        if not MIN_SECRET_BYTES <= len(key) <= MAX_SECRET_BYTES:
            raise ValueError(
                f"a cluster secret has {MIN_SECRET_BYTES}..{MAX_SECRET_BYTES} bytes, not {len(key)}"
            )
        self._key = key
        digest = hashlib.sha256(_CLUSTER_ID_LABEL + key).hexdigest()
        self._cluster_id = digest[:16]

    @classmethod
    def generate(cls, rng: Callable[[int], bytes] = secrets.token_bytes) -> ClusterSecret:
        """A fresh secret of :data:`GENERATED_SECRET_BYTES` bytes from ``rng``."""
        return cls(rng(GENERATED_SECRET_BYTES))

    @classmethod
    def from_text(cls, text: str, *, source: str) -> ClusterSecret:
        """Parse the hex or base64url form. ``source`` names where the text came from (an
        environment variable, a path) and starts every error message."""
        key = _parse_text(text, source)
        return cls(key)

    @property
    def cluster_id(self) -> str:
        """16 hex digits derived from the secret (SHA-256 over a label and the secret): nodes
        with different secrets are in different clusters. Safe to log and to send."""
        return self._cluster_id

    def mac(self, message: bytes) -> bytes:
        """HMAC-SHA256 of ``message`` under the secret (32 bytes)."""
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def to_text(self) -> str:
        """The hex form, for writing the secret file. Keep it out of logs."""
        return self._key.hex()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClusterSecret):
            return NotImplemented
        return hmac.compare_digest(self._key, other._key)

    def __repr__(self) -> str:
        return f"ClusterSecret(<redacted>, cluster_id={self._cluster_id!r})"

    __str__ = __repr__

    def __reduce__(self) -> NoReturn:
        raise TypeError("ClusterSecret is not picklable (keep the secret out of pickles)")


def _parse_text(text: str, source: str) -> bytes:
    value = text.strip()
    how = (
        f"expected at least {MIN_SECRET_BYTES} bytes written as hex"
        f" ({2 * MIN_SECRET_BYTES}+ hex digits) or base64url"
    )
    if not value:
        raise SecretError(f"{source}: the cluster secret is empty; {how}")
    if len(value) > 2 * MAX_SECRET_BYTES:
        raise SecretError(f"{source}: the cluster secret is too long ({len(value)} characters)")
    if _HEX.fullmatch(value):
        key = bytes.fromhex(value)
    elif _B64URL.fullmatch(value):
        try:
            key = base64.urlsafe_b64decode(value.rstrip("=") + "=" * (-len(value.rstrip("=")) % 4))
        except (binascii.Error, ValueError):
            raise SecretError(
                f"{source}: the cluster secret is not valid base64url; {how}"
            ) from None
    else:
        raise SecretError(f"{source}: the cluster secret is neither hex nor base64url; {how}")
    if len(key) < MIN_SECRET_BYTES:
        raise SecretError(f"{source}: the cluster secret is too short ({len(key)} bytes); {how}")
    if len(key) > MAX_SECRET_BYTES:
        raise SecretError(f"{source}: the cluster secret is too long ({len(key)} bytes)")
    return key


class SecretSource(enum.Enum):
    """Where :func:`load_or_create_secret` found the secret."""

    ENV = "env"  # SKULK_CLUSTER_SECRET
    FILE = "file"  # --cluster-secret-file
    DATA_DIR = "data_dir"  # HOME/cluster-secret, already there
    GENERATED = "generated"  # HOME/cluster-secret, created by this call


@attrs.frozen
class LoadedSecret:
    """A secret and where it came from. ``path`` is the file it was read from or written to
    (``None`` for the environment). When ``source`` is ``GENERATED``, print
    :func:`join_instructions` so the operator can add nodes."""

    secret: ClusterSecret
    source: SecretSource
    path: Path | None

    @property
    def cluster_id(self) -> str:
        return self.secret.cluster_id

    def describe(self) -> str:
        """One line for the start-up log: cluster id and source, never the secret."""
        where = {
            SecretSource.ENV: f"from ${ENV_VAR}",
            SecretSource.FILE: f"from {self.path}",
            SecretSource.DATA_DIR: f"from {self.path}",
            SecretSource.GENERATED: f"generated and stored in {self.path}",
        }[self.source]
        return f"cluster {self.cluster_id}: secret {where}"


def load_or_create_secret(
    home: Path,
    env: Mapping[str, str],
    secret_file: Path | None = None,
    *,
    rng: Callable[[int], bytes] = secrets.token_bytes,
) -> LoadedSecret:
    """The node's cluster secret: ``env[SKULK_CLUSTER_SECRET]``, else ``secret_file``, else
    ``home/cluster-secret``, which is created (mode 0600, atomically) if missing.

    Concurrent first starts on one data dir end with a single secret: the file is written
    complete under a temporary name and then hard-linked into place, which fails if another
    process got there first (its secret is then read and used). Raises :class:`SecretError` with
    a message naming the variable or file and the fix; never includes the secret.
    """
    text = env.get(ENV_VAR)
    if text is not None:
        return LoadedSecret(ClusterSecret.from_text(text, source=ENV_VAR), SecretSource.ENV, None)
    if secret_file is not None:
        try:
            return LoadedSecret(_read_secret_file(secret_file), SecretSource.FILE, secret_file)
        except FileNotFoundError:
            raise SecretError(
                f"{secret_file}: no such cluster secret file (--cluster-secret-file must name"
                " an existing file; copy it from a node of the cluster)"
            ) from None
    path = home / SECRET_FILE_NAME
    try:
        return LoadedSecret(_read_secret_file(path), SecretSource.DATA_DIR, path)
    except FileNotFoundError:
        pass
    secret = ClusterSecret.generate(rng)
    if _publish(home, path, secret):
        return LoadedSecret(secret, SecretSource.GENERATED, path)
    # Another process created it between our read and our write: its secret wins.
    try:
        return LoadedSecret(_read_secret_file(path), SecretSource.DATA_DIR, path)
    except FileNotFoundError:
        raise SecretError(f"{path}: the cluster secret file vanished while starting") from None


def _read_secret_file(path: Path) -> ClusterSecret:
    """Read a secret file; ``FileNotFoundError`` passes through, every other problem is a
    :class:`SecretError`."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SecretError(
                f"{path}: the cluster secret file is a symbolic link; point"
                " --cluster-secret-file at the file itself"
            ) from None
        raise SecretError(f"{path}: cannot open the cluster secret file ({exc.strerror})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretError(f"{path}: the cluster secret file is not a regular file")
        if os.name == "posix" and info.st_mode & 0o077:
            raise SecretError(
                f"{path}: the cluster secret file is accessible to group or others"
                f" (mode {stat.S_IMODE(info.st_mode):04o}); run `chmod 600 {path}`"
            )
        data = _read_at_most(fd, _MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SecretError(f"{path}: cannot read the cluster secret file ({exc.strerror})") from None
    finally:
        os.close(fd)
    if len(data) > _MAX_FILE_BYTES:
        raise SecretError(
            f"{path}: the cluster secret file is too large (over {_MAX_FILE_BYTES} B)"
        )
    try:
        text = data.decode("ascii")
    except UnicodeDecodeError:
        raise SecretError(
            f"{path}: the cluster secret file is not text (hex or base64url)"
        ) from None
    return ClusterSecret.from_text(text, source=str(path))


def _read_at_most(fd: int, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = os.read(fd, limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _publish(home: Path, path: Path, secret: ClusterSecret) -> bool:
    """Write ``secret`` to ``path`` unless it exists; ``True`` if this call created it."""
    try:
        home.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise SecretError(f"{home}: cannot create the data directory ({exc.strerror})") from None
    data = (secret.to_text() + "\n").encode("ascii")
    tmp = home / f".{SECRET_FILE_NAME}.{os.getpid()}.{secrets.token_hex(8)}.tmp"
    try:
        _write_new(tmp, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV):
                raise
            # No hard links here (some network/FUSE file systems): create in place. A
            # concurrent reader may then briefly see a short file and fail with a clear error.
            try:
                _write_new(path, data)
            except FileExistsError:
                return False
        return True
    except OSError as exc:
        raise SecretError(f"{path}: cannot store the cluster secret ({exc.strerror})") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def _write_new(path: Path, data: bytes) -> None:
    """Create ``path`` (must not exist) with mode 0600, write ``data`` and fsync it."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags, 0o600)
    try:
        os.fchmod(fd, 0o600)  # whatever the umask
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def join_instructions(secret_path: Path | None, listen_address: str, *, cluster_id: str) -> str:
    """What an operator runs to add another node to this cluster, for the console on first
    start. ``secret_path`` is the secret file (``None`` when the secret came from
    ``SKULK_CLUSTER_SECRET``); ``listen_address`` is this node's ``--listen HOST:PORT``.

    A node that listens on loopback (the default) cannot be joined from another machine, and
    most such nodes are someone trying Skulk out: one line pointing at the docs, not a to-do
    list. A node reachable from other machines gets the steps, several lines."""
    host, _, port = listen_address.rpartition(":")
    loopback = host in ("127.0.0.1", "localhost", "::1", "[::1]")
    wildcard = host in ("0.0.0.0", "::", "[::]", "")
    if loopback:
        return (
            f"skulk: nodes join on {listen_address} (this machine only; --listen "
            f"0.0.0.0:{port} for others): see docs/operations.md, Joining nodes into a cluster"
        )
    join_host = "THIS_HOST" if wildcard else host
    lines = [f"To add a node to cluster {cluster_id}:"]
    if secret_path is None:
        lines.append(
            f"  1. On the new node, set {ENV_VAR} to the same value it has here"
            " (keep it out of shell history and logs)."
        )
        secret_flag = ""
    else:
        lines.append(
            f"  1. Copy {secret_path} to the new node, readable only by its user:"
            f"\n       scp {secret_path} NEW_HOST:cluster-secret"
            "\n       ssh NEW_HOST chmod 600 cluster-secret"
        )
        secret_flag = " --cluster-secret-file cluster-secret"
    lines.append(
        f"  2. Start it:\n       python -m skulk serve{secret_flag} --join ws://{join_host}:{port}"
    )
    if join_host == "THIS_HOST":
        lines.append("     where THIS_HOST is this machine's address as the new node reaches it.")
    return "\n".join(lines)
