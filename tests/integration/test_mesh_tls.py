"""TLS links (``wss://``) between in-process meshes on loopback, certificates from ``trustme``."""

from __future__ import annotations

import random
import ssl
from pathlib import Path

import pytest
import trio
import trustme

from skulk.federation import LinkView, Mesh, MeshAddressError, PeerState, tls_contexts
from skulk.federation._tls import TlsConfigError

from .test_mesh import BACKOFF, CONFIG, SECRET, echo, is_up, make_mesh, until


def write_pki(ca: trustme.CA, directory: Path, host: str = "127.0.0.1") -> tuple[Path, Path, Path]:
    """``(cert, key, ca)`` PEM files: a certificate for ``host`` (an IP SAN for an address)."""
    directory.mkdir(parents=True, exist_ok=True)
    issued = ca.issue_cert(host)
    cert, key, ca_file = directory / "cert.pem", directory / "key.pem", directory / "ca.pem"
    cert.write_bytes(b"".join(blob.bytes() for blob in issued.cert_chain_pems))
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    return cert, key, ca_file


@pytest.fixture
def pki(tmp_path: Path) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    server, client = tls_contexts(*write_pki(trustme.CA(), tmp_path / "pki"))
    assert server is not None and client is not None
    return server, client


def tls_mesh(
    node_id: str,
    contexts: tuple[ssl.SSLContext | None, ssl.SSLContext | None],
    join: tuple[str, ...] = (),
) -> Mesh:
    return Mesh(  # test_mesh's settings (fast timeouts, seeded backoff), with TLS
        node_id,
        SECRET,
        listen=("127.0.0.1", 0),
        join=join,
        link_config=CONFIG,
        rpc_handler=echo,
        rng=random.Random(node_id),
        backoff=BACKOFF,
        server_ssl=contexts[0],
        client_ssl=contexts[1],
    )


async def start(nursery: trio.Nursery, mesh: Mesh) -> str:
    host, port = await nursery.start(mesh.run)
    return f"wss://{host}:{port}"


def target_row(mesh: Mesh, url: str) -> LinkView:
    return next(view for view in mesh.links() if view.address == url)


async def test_two_meshes_link_over_wss(pki: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    async with trio.open_nursery() as nursery:
        a = tls_mesh("node-a", pki)
        a_url = await start(nursery, a)
        b = tls_mesh("node-b", pki, join=(a_url,))
        await start(nursery, b)
        await until(lambda: is_up(a, "node-b") and is_up(b, "node-a"))
        link = b.link("node-a")
        assert link is not None
        assert await link.call("ping", b"x", timeout=2.0) == b"ping:x"
        assert target_row(b, a_url).outbound is True
        nursery.cancel_scope.cancel()


async def test_an_untrusted_certificate_is_refused(
    pki: tuple[ssl.SSLContext, ssl.SSLContext], tmp_path: Path
) -> None:
    _, other_client = tls_contexts(None, None, write_pki(trustme.CA(), tmp_path / "other")[2])
    async with trio.open_nursery() as nursery:
        a = tls_mesh("node-a", pki)
        a_url = await start(nursery, a)
        stranger = tls_mesh("node-x", (None, other_client), join=(a_url,))
        await start(nursery, stranger)

        def failed() -> bool:
            view = target_row(stranger, a_url)
            return view.last_error is not None and view.state is not PeerState.UP

        await until(failed)
        view = target_row(stranger, a_url)
        assert view.peer_id is None
        assert view.last_error is not None and "CERTIFICATE_VERIFY_FAILED" in view.last_error
        assert a.link("node-x") is None and stranger.link("node-a") is None
        # Neither node crashed: a trusted peer still links to the listener.
        b = tls_mesh("node-b", pki, join=(a_url,))
        await start(nursery, b)
        await until(lambda: is_up(a, "node-b") and is_up(b, "node-a"))
        assert not is_up(a, "node-x")
        nursery.cancel_scope.cancel()


async def test_a_plain_dial_to_a_tls_listener_fails_without_harm(
    pki: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    async with trio.open_nursery() as nursery:
        a = tls_mesh("node-a", pki)
        a_url = await start(nursery, a)
        plain_url = a_url.replace("wss://", "ws://")
        plain = make_mesh("node-p", join=(plain_url,))
        await nursery.start(plain.run)
        await until(lambda: target_row(plain, plain_url).last_error is not None)
        assert a.link("node-p") is None
        b = tls_mesh("node-b", pki, join=(a_url,))
        await start(nursery, b)
        await until(lambda: is_up(a, "node-b"))
        nursery.cancel_scope.cancel()


def test_a_wss_join_needs_a_client_context(pki: tuple[ssl.SSLContext, ssl.SSLContext]) -> None:
    with pytest.raises(MeshAddressError, match="wss:// peer needs --tls-ca"):
        Mesh("node-a", SECRET, join=("wss://127.0.0.1:52416",))
    mesh = Mesh("node-a", SECRET, server_ssl=pki[0])
    with pytest.raises(MeshAddressError, match="--tls-ca"):
        mesh.add_peer("wss://127.0.0.1:52416")
    assert mesh.add_peer("ws://127.0.0.1:52416")
    assert Mesh("node-b", SECRET, client_ssl=pki[1]).add_peer("wss://127.0.0.1:52416")


def test_tls_contexts(tmp_path: Path) -> None:
    cert, key, ca = write_pki(trustme.CA(), tmp_path)
    assert tls_contexts(None, None, None) == (None, None)
    server, client = tls_contexts(cert, key, None)
    assert server is not None and client is None
    server, client = tls_contexts(None, None, ca)
    assert server is None and client is not None
    assert client.check_hostname and client.verify_mode is ssl.CERT_REQUIRED
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    missing = tmp_path / "missing.pem"
    cases: list[tuple[tuple[Path | None, Path | None, Path | None], str]] = [
        ((cert, None, None), "--tls-cert needs --tls-key"),
        ((None, key, None), "--tls-key needs --tls-cert"),
        ((missing, key, None), "--tls-cert .*missing.pem.*: no such file"),
        ((cert, missing, None), "--tls-key .*: no such file"),
        ((cert, tmp_path, None), "--tls-key .*: no such file"),
        ((None, None, missing), "--tls-ca .*: no such file"),
        ((garbage, key, None), "--tls-cert .* / --tls-key .*: not a PEM certificate chain"),
        ((cert, garbage, None), "--tls-cert .* / --tls-key .*: not a PEM certificate chain"),
        ((key, cert, None), "not a PEM certificate chain"),
        ((None, None, garbage), "--tls-ca .*: not a PEM CA bundle"),
    ]
    for args, message in cases:
        with pytest.raises(TlsConfigError, match=message):
            tls_contexts(*args)
    other_key = write_pki(trustme.CA(), tmp_path / "other")[1]
    with pytest.raises(TlsConfigError, match="not a PEM certificate chain"):
        tls_contexts(cert, other_key, None)  # a key that is not the certificate's
