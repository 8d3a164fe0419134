"""The sans-IO federation handshake: the happy path, every refusal and its close code, replay,
reflection and tampering, and what crosses the wire."""

from __future__ import annotations

import cbor2
import pytest

from skulk.federation import (
    ClientHandshake,
    ClusterSecret,
    Established,
    RefusalReason,
    Refused,
    ReplayCache,
    ServerHandshake,
    Waiting,
)
from skulk.federation._machine import CLIENT_LABEL, FROM_CLIENT, FROM_SERVER, Binding
from skulk.federation._refusal import Refusal, refusal_from_close
from skulk.wire.federation import (
    HANDSHAKE_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    ClientHello,
    ClientProof,
    ServerChallenge,
    Welcome,
)
from tests._doubles import OTHER_SECRET as OTHER
from tests._doubles import SECRET, counter_rng

KEY = bytes(range(32))


def client(
    node_id: str = "client-1",
    secret: ClusterSecret = SECRET,
    seed: str = "c",
    **kwargs: object,
) -> ClientHandshake:
    return ClientHandshake(secret, node_id, rng=counter_rng(seed), **kwargs)  # type: ignore[arg-type]


def server(
    node_id: str = "server-1",
    secret: ClusterSecret = SECRET,
    *,
    cache: ReplayCache | None = None,
    now: float = 100.0,
    seed: str = "s",
    **kwargs: object,
) -> ServerHandshake:
    return ServerHandshake(
        secret,
        node_id,
        replay_cache=cache if cache is not None else ReplayCache(),
        now=now,
        rng=counter_rng(seed),
        **kwargs,  # type: ignore[arg-type]
    )


def exchange(c: ClientHandshake, s: ServerHandshake) -> list[bytes]:
    """Run the handshake over bytes until neither side has anything to send; returns every
    message, in order."""
    sent = [c.initial_bytes()]
    to_server = [sent[0]]
    while to_server:
        to_client = [out for msg in to_server for out in s.receive_bytes(msg)]
        sent += to_client
        to_server = [out for msg in to_client for out in c.receive_bytes(msg)]
        sent += to_server
    return sent


def refusal_of(machine: ClientHandshake | ServerHandshake) -> Refusal:
    state = machine.state
    assert isinstance(state, Refused), f"expected a refusal, state is {state!r}"
    return state.refusal


def assert_refused(machine: ClientHandshake | ServerHandshake, reason: RefusalReason) -> Refusal:
    refusal = refusal_of(machine)
    assert refusal.reason is reason, refusal
    assert refusal.close_code == reason.value
    line = refusal.log_line("10.0.0.7:40000")
    assert "\n" not in line
    assert reason.label in line and str(reason.value) in line and "10.0.0.7:40000" in line
    return refusal


# ---- the happy path --------------------------------------------------------------------------


def test_both_sides_establish_with_each_others_ids() -> None:
    c, s = client(), server()
    assert (c.state, s.state) == (Waiting("ServerChallenge"), Waiting("ClientHello"))
    messages = exchange(c, s)
    assert len(messages) == 4
    assert c.state == Established("server-1")
    assert s.state == Established("client-1")
    decoders = (FROM_CLIENT.decode, FROM_SERVER.decode)
    kinds = [type(decoders[i % 2](m)) for i, m in enumerate(messages)]
    assert kinds == [ClientHello, ServerChallenge, ClientProof, Welcome]


def test_typed_frames_work_like_bytes() -> None:
    c, s = client(), server()
    (challenge,) = s.receive(c.initial())
    assert isinstance(challenge, ServerChallenge)
    assert challenge.protocol_version == PROTOCOL_VERSION
    assert challenge.cluster_id == SECRET.cluster_id
    (proof,) = c.receive(challenge)
    assert (c.state,) == (Waiting("Welcome"),)
    (welcome,) = s.receive(proof)
    assert c.receive(welcome) == []
    assert c.state == Established("server-1") and s.state == Established("client-1")


def test_nonces_come_from_the_injected_rng() -> None:
    assert client(seed="x").initial_bytes() == client(seed="x").initial_bytes()
    assert client(seed="x").initial().nonce != client(seed="y").initial().nonce
    assert len(client().initial().nonce) == 32
    with pytest.raises(ValueError, match="32 bytes"):
        ClientHandshake(SECRET, "n", rng=lambda n: b"short")


def test_the_secret_never_crosses_the_wire() -> None:
    messages = exchange(client(), server())
    forms = [KEY, KEY.hex().encode(), KEY.hex().upper().encode(), SECRET.to_text().encode()]
    for message in messages:
        for form in forms:
            assert form not in message
    assert SECRET.cluster_id.encode() in messages[0]  # the id is meant to travel


def test_invalid_own_node_id_is_a_programming_error() -> None:
    for bad in ("", "x" * 129, "tab\there", "new\nline"):
        with pytest.raises(ValueError):
            ClientHandshake(SECRET, bad)


# ---- refusals ----------------------------------------------------------------------------------


def forged_hello(node_id: str = "mallory", nonce: bytes = b"\x07" * 32) -> ClientHello:
    """A hello naming the right cluster, from someone without the secret."""
    return ClientHello(PROTOCOL_VERSION, SECRET.cluster_id, node_id, nonce)


def test_server_refuses_a_client_without_the_secret() -> None:
    s = server()
    (challenge,) = s.receive(forged_hello())
    assert isinstance(challenge, ServerChallenge)
    assert s.receive(ClientProof(b"\x00" * 32)) == []
    refusal = assert_refused(s, RefusalReason.WRONG_SECRET)
    assert refusal.close_code == 4001
    assert refusal.peer_node_id == "mallory"
    assert "'mallory'" in refusal.log_line("peer")


def test_client_refuses_a_server_without_the_secret_and_proves_nothing() -> None:
    c = client()
    fake = ServerChallenge(
        PROTOCOL_VERSION, SECRET.cluster_id, "impostor", b"\x01" * 32, b"\x02" * 32
    )
    assert c.receive(fake) == []  # no ClientProof for an unverified server: no oracle
    assert assert_refused(c, RefusalReason.WRONG_SECRET).peer_node_id == "impostor"


def test_different_secrets_are_different_clusters() -> None:
    c, s = client(secret=OTHER), server()
    messages = exchange(c, s)
    assert len(messages) == 1
    refusal = assert_refused(s, RefusalReason.WRONG_CLUSTER)
    assert refusal.close_code == 4006
    assert OTHER.cluster_id in refusal.detail and SECRET.cluster_id in refusal.detail
    assert SECRET.cluster_id not in refusal.close_reason  # not told to a stranger
    assert isinstance(c.state, Waiting)  # the client learns it from the close frame:
    peer = refusal_from_close(refusal.close_code, refusal.close_reason)
    assert peer is not None and peer.by_peer and peer.reason is RefusalReason.WRONG_CLUSTER
    assert "refused by the peer" in peer.log_line("server:1")


def test_client_refuses_a_server_of_another_cluster() -> None:
    c = client()
    challenge = ServerChallenge(PROTOCOL_VERSION, OTHER.cluster_id, "s", b"\x01" * 32, b"\x02" * 32)
    c.receive(challenge)
    assert_refused(c, RefusalReason.WRONG_CLUSTER)


def test_version_mismatch_is_refused_with_both_versions_named() -> None:
    c, s = client(protocol_version=PROTOCOL_VERSION + 1), server()
    exchange(c, s)
    refusal = assert_refused(s, RefusalReason.VERSION_MISMATCH)
    assert refusal.close_code == 4003
    assert f"version {PROTOCOL_VERSION + 1}" in refusal.detail
    assert f"version {PROTOCOL_VERSION}" in refusal.detail
    assert str(PROTOCOL_VERSION) in refusal.close_reason


def test_client_refuses_a_server_of_another_version() -> None:
    c = client()
    future = ServerChallenge(
        PROTOCOL_VERSION + 1, SECRET.cluster_id, "s", b"\x01" * 32, b"\x02" * 32
    )
    assert c.receive(future) == []
    refusal = assert_refused(c, RefusalReason.VERSION_MISMATCH)
    assert f"server speaks federation protocol version {PROTOCOL_VERSION + 1}" in refusal.detail


def test_a_future_hello_with_other_fields_is_a_version_mismatch_not_malformed() -> None:
    body = cbor2.dumps(
        {"t": "ClientHello", "protocol_version": 99, "node_id": "n", "capabilities": ["x"]}
    )
    s = server()
    assert s.receive_bytes(body) == []
    assert "version 99" in assert_refused(s, RefusalReason.VERSION_MISMATCH).detail
    same_version = cbor2.dumps(
        {**FROM_CLIENT.unstructure(client().initial()), "capabilities": ["x"]}
    )
    s = server()
    s.receive_bytes(same_version)
    assert "unknown field" in assert_refused(s, RefusalReason.MALFORMED).detail


def test_replayed_handshake_is_refused_by_a_server_sharing_the_replay_cache() -> None:
    cache = ReplayCache()
    messages = exchange(client(), server(cache=cache))
    hello, proof = messages[0], messages[2]
    fresh = server(cache=cache, seed="s2", now=160.0)
    assert fresh.receive_bytes(hello) == []
    refusal = assert_refused(fresh, RefusalReason.REPLAYED)
    assert refusal.close_code == 4002
    assert fresh.receive_bytes(proof) == []  # ignored after the refusal
    assert refusal_of(fresh) is refusal


def test_replay_after_the_cache_forgot_still_fails_on_the_proof() -> None:
    cache = ReplayCache(ttl=60.0)
    messages = exchange(client(), server(cache=cache, now=100.0))
    late = server(cache=cache, seed="s3", now=161.0)  # the nonce expired from the cache
    assert len(late.receive_bytes(messages[0])) == 1
    assert late.receive_bytes(messages[2]) == []  # the old proof is bound to the old nonce
    assert_refused(late, RefusalReason.WRONG_SECRET)
    other_cache = server(cache=ReplayCache(), seed="s4")
    other_cache.receive_bytes(messages[0])
    other_cache.receive_bytes(messages[2])
    assert_refused(other_cache, RefusalReason.WRONG_SECRET)


def test_duplicate_node_id_is_refused_only_after_authentication() -> None:
    asked: list[str] = []

    def connected(node_id: str) -> bool:
        asked.append(node_id)
        return True

    s = server(is_connected=connected)
    s.receive(forged_hello("client-1"))
    s.receive(ClientProof(b"\x00" * 32))
    assert_refused(s, RefusalReason.WRONG_SECRET)
    assert asked == []  # an unauthenticated claim is never looked up

    c, s = client(), server(is_connected=connected)
    exchange(c, s)
    refusal = assert_refused(s, RefusalReason.DUPLICATE_NODE_ID)
    assert refusal.close_code == 4004 and asked == ["client-1"]
    assert isinstance(c.state, Waiting)  # it hears 4004 in the close frame


def test_client_refuses_a_second_link_to_a_linked_server() -> None:
    c, s = client(is_connected=lambda node: node == "server-1"), server()
    exchange(c, s)
    assert_refused(c, RefusalReason.DUPLICATE_NODE_ID)
    assert isinstance(s.state, Waiting)  # no ClientProof was sent


def test_a_node_that_dials_itself_refuses_the_link() -> None:
    c, s = client("node-a"), server("node-a")
    exchange(c, s)
    refusal = assert_refused(c, RefusalReason.OWN_NODE_ID)
    assert refusal.close_code == 4008 and "dialed itself" in refusal.detail


def test_server_refuses_an_authenticated_client_with_its_own_id() -> None:
    s = server("node-a")
    hello = ClientHello(PROTOCOL_VERSION, SECRET.cluster_id, "node-a", b"\x05" * 32)
    (challenge,) = s.receive(hello)
    assert isinstance(challenge, ServerChallenge)
    proof = Binding(
        PROTOCOL_VERSION, SECRET.cluster_id, "node-a", "node-a", hello.nonce, challenge.nonce
    ).proof(SECRET, CLIENT_LABEL)
    s.receive(ClientProof(proof))
    assert_refused(s, RefusalReason.OWN_NODE_ID)


@pytest.mark.parametrize(
    "frame",
    [ClientProof(b"\x00" * 32), ServerChallenge(1, "c", "n", b"", b""), Welcome()],
    ids=["proof-first", "challenge", "welcome"],
)
def test_server_refuses_frames_out_of_order(frame: object) -> None:
    s = server()
    s.receive(frame)  # type: ignore[arg-type]
    assert "expected ClientHello" in assert_refused(s, RefusalReason.MALFORMED).detail


def test_server_refuses_a_second_hello_and_client_a_second_challenge() -> None:
    c, s = client(), server()
    (challenge,) = s.receive(c.initial())
    s.receive(c.initial())
    assert_refused(s, RefusalReason.MALFORMED)
    c.receive(challenge)
    c.receive(challenge)
    assert "expected Welcome" in assert_refused(c, RefusalReason.MALFORMED).detail


def test_client_refuses_welcome_before_the_challenge() -> None:
    c = client()
    c.receive(Welcome())
    assert_refused(c, RefusalReason.MALFORMED)


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\xff",
        b"\xa1",  # a map with its entry missing
        b"garbage that is not cbor at all",
        cbor2.dumps([1, 2, 3]),
        cbor2.dumps({"t": "ServerChallenge"}),  # the other direction's frame
        b"\x00" * (HANDSHAKE_MAX_FRAME_SIZE + 1),
        "a text message",
    ],
    ids=["empty", "ff", "truncated-map", "ascii", "array", "wrong-direction", "huge", "text"],
)
def test_undecodable_input_is_malformed(data: bytes | str) -> None:
    for machine in (server(), client()):
        assert machine.receive_bytes(data) == []
        assert_refused(machine, RefusalReason.MALFORMED)


def test_truncated_hello_is_malformed() -> None:
    hello = client().initial_bytes()
    for cut in (1, len(hello) // 2, len(hello) - 1):
        s = server()
        s.receive_bytes(hello[:cut])
        assert_refused(s, RefusalReason.MALFORMED)
    s = server()
    s.receive_bytes(hello + b"\x00")
    assert "trailing" in assert_refused(s, RefusalReason.MALFORMED).detail


@pytest.mark.parametrize(
    "hello",
    [
        ClientHello(PROTOCOL_VERSION, SECRET.cluster_id, "n", b"\x01" * 31),
        ClientHello(PROTOCOL_VERSION, SECRET.cluster_id, "", b"\x01" * 32),
        ClientHello(PROTOCOL_VERSION, SECRET.cluster_id, "x" * 129, b"\x01" * 32),
        ClientHello(PROTOCOL_VERSION, SECRET.cluster_id, "evil\nINJECTED line", b"\x01" * 32),
        ClientHello(True, SECRET.cluster_id, "n", b"\x01" * 32),
        ClientHello(PROTOCOL_VERSION, 5, "n", "not bytes"),  # type: ignore[arg-type]
    ],
    ids=["short-nonce", "empty-id", "long-id", "newline-id", "bool-version", "wrong-types"],
)
def test_bad_field_values_are_malformed(hello: ClientHello) -> None:
    s = server()
    assert s.receive(hello) == []
    assert_refused(s, RefusalReason.MALFORMED)  # and its log line is one line


def test_bad_proof_sizes_are_malformed() -> None:
    c = client()
    c.receive(ServerChallenge(PROTOCOL_VERSION, SECRET.cluster_id, "s", b"\x01" * 32, b"\x02"))
    assert_refused(c, RefusalReason.MALFORMED)
    s = server()
    s.receive(forged_hello())
    s.receive(ClientProof(b"\x00" * 64))
    assert_refused(s, RefusalReason.MALFORMED)


# ---- reflection and tampering --------------------------------------------------------------------


def test_server_proof_reflected_as_a_client_proof_is_refused() -> None:
    s = server()
    (challenge,) = s.receive(forged_hello())
    assert isinstance(challenge, ServerChallenge)
    s.receive(ClientProof(challenge.proof))
    assert_refused(s, RefusalReason.WRONG_SECRET)


def test_client_direction_proof_offered_as_a_server_proof_is_refused() -> None:
    c = client()
    hello = c.initial()
    server_nonce = b"\x03" * 32
    client_direction = Binding(
        PROTOCOL_VERSION, SECRET.cluster_id, hello.node_id, "s", hello.nonce, server_nonce
    ).proof(SECRET, CLIENT_LABEL)
    c.receive(
        ServerChallenge(PROTOCOL_VERSION, SECRET.cluster_id, "s", server_nonce, client_direction)
    )
    assert_refused(c, RefusalReason.WRONG_SECRET)


@pytest.mark.parametrize("field", ["node_id", "nonce"])
def test_a_tampered_challenge_fails_the_proof(field: str) -> None:
    c, s = client(), server()
    (challenge,) = s.receive(c.initial())
    assert isinstance(challenge, ServerChallenge)
    value: object = "server-2" if field == "node_id" else b"\x09" * 32
    fields = {**FROM_SERVER.unstructure(challenge), field: value}
    c.receive_bytes(cbor2.dumps(fields))
    assert_refused(c, RefusalReason.WRONG_SECRET)


@pytest.mark.parametrize("field", ["node_id", "nonce"])
def test_a_tampered_hello_fails_the_proof(field: str) -> None:
    """An on-path attacker changes the client's claimed id (or nonce) on the way to the server:
    the server's proof then binds values the client did not send, and the client refuses."""
    c, s = client(), server()
    value: object = "client-9" if field == "node_id" else b"\x09" * 32
    fields = {**FROM_CLIENT.unstructure(c.initial()), field: value}
    (challenge,) = s.receive_bytes(cbor2.dumps(fields))
    assert c.receive_bytes(challenge) == []
    assert_refused(c, RefusalReason.WRONG_SECRET)


# ---- after the end, timeouts, codes --------------------------------------------------------------


def test_input_after_the_end_is_ignored() -> None:
    c, s = client(), server()
    messages = exchange(c, s)
    for message in messages:
        assert s.receive_bytes(message) == [] and c.receive_bytes(message) == []
        assert s.receive_bytes(b"\xff") == []
    assert c.state == Established("server-1") and s.state == Established("client-1")
    refused = server()
    refused.receive_bytes(b"\xff")
    first = refusal_of(refused)
    assert refused.receive_bytes(messages[0]) == [] and refused.receive(c.initial()) == []
    assert refusal_of(refused) is first
    assert refused.time_out() is None


def test_time_out_refuses_only_while_waiting() -> None:
    c, s = client(), server()
    s.receive(c.initial())
    refusal = s.time_out()
    assert refusal is not None and refusal is refusal_of(s)
    assert refusal.close_code == 4007 and "ClientProof" in refusal.detail
    assert_refused(s, RefusalReason.HANDSHAKE_TIMEOUT)
    c2, s2 = client(), server()
    exchange(c2, s2)
    assert c2.time_out() is None and s2.time_out() is None


def test_close_codes_are_distinct_private_codes() -> None:
    codes = {reason.close_code for reason in RefusalReason}
    assert len(codes) == len(RefusalReason)
    assert all(4000 <= code <= 4999 for code in codes)
    expected = {
        "wrong_secret": 4001,
        "replayed": 4002,
        "version_mismatch": 4003,
        "duplicate_node_id": 4004,
        "malformed": 4005,
        "wrong_cluster": 4006,
        "handshake_timeout": 4007,
        "own_node_id": 4008,
    }
    assert {r.label: r.close_code for r in RefusalReason} == expected
    for reason in RefusalReason:
        assert RefusalReason.from_close_code(reason.close_code) is reason
    assert RefusalReason.from_close_code(1000) is None
    assert refusal_from_close(1006, "") is None and refusal_from_close(None, None) is None


def test_close_reasons_fit_a_close_frame() -> None:
    for reason in RefusalReason:
        s = server()
        s._refuse(reason, "detail " * 100)  # every reason through the one constructor
        refusal = refusal_of(s)
        assert len(refusal.close_reason.encode()) <= 123
        assert refusal.close_reason.startswith(reason.label)
    long_peer = refusal_from_close(4001, "x" * 500)
    assert long_peer is not None and len(long_peer.log_line("p")) < 300
