"""TLS for node-to-node links (``wss://``): the contexts built from ``--tls-cert``,
``--tls-key`` and ``--tls-ca``.

* ``--tls-cert`` + ``--tls-key``: the listener speaks TLS with that certificate chain (PEM).
* ``--tls-ca``: dialers verify a ``wss://`` peer against that CA bundle (PEM), hostname
  checked: the peer's certificate must name the host (or IP address) in its ``--join`` URL.

Either may be given alone (a node that only listens with TLS, or only dials ``wss://``).
"""

from __future__ import annotations

import ssl
from pathlib import Path


class TlsConfigError(ValueError):
    """A TLS option that cannot be used; the message names the flag."""


class TlsHandshakeError(Exception):
    """A ``wss://`` dial whose TLS handshake failed (an untrusted certificate, a certificate
    that does not name the host dialed, a peer that does not speak TLS)."""


def tls_contexts(
    cert: Path | None, key: Path | None, ca: Path | None
) -> tuple[ssl.SSLContext | None, ssl.SSLContext | None]:
    """``(server context, client context)``, each ``None`` where its options are not given.

    Raises :class:`TlsConfigError` naming the flag: a certificate without its key (or the
    reverse), a file that is missing or unreadable, a certificate that does not match its key,
    a CA file with no usable certificate.
    """
    if (cert is None) != (key is None):
        given, missing = ("--tls-cert", "--tls-key") if key is None else ("--tls-key", "--tls-cert")
        raise TlsConfigError(f"{given} needs {missing} as well")
    server: ssl.SSLContext | None = None
    if cert is not None and key is not None:
        _readable("--tls-cert", cert)
        _readable("--tls-key", key)
        server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        try:
            server.load_cert_chain(certfile=cert, keyfile=key)
        except ssl.SSLError as exc:
            raise TlsConfigError(
                f"--tls-cert {str(cert)!r} / --tls-key {str(key)!r}: not a PEM certificate chain"
                f" and its matching private key ({exc.reason or exc})"
            ) from None
        except OSError as exc:
            raise TlsConfigError(f"--tls-cert/--tls-key: cannot read: {exc}") from None
    client: ssl.SSLContext | None = None
    if ca is not None:
        _readable("--tls-ca", ca)
        try:
            client = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
        except ssl.SSLError as exc:
            raise TlsConfigError(
                f"--tls-ca {str(ca)!r}: not a PEM CA bundle ({exc.reason or exc})"
            ) from None
        except OSError as exc:
            raise TlsConfigError(f"--tls-ca {str(ca)!r}: cannot read: {exc}") from None
        if not client.get_ca_certs():
            raise TlsConfigError(f"--tls-ca {str(ca)!r}: no CA certificate in the file")
        client.check_hostname = True
        client.verify_mode = ssl.CERT_REQUIRED
    return server, client


def _readable(flag: str, path: Path) -> None:
    if not path.is_file():
        raise TlsConfigError(f"{flag} {str(path)!r}: no such file")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise TlsConfigError(f"{flag} {str(path)!r}: cannot read: {exc.strerror or exc}") from None
