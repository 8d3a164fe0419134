"""Hostile input to the federation handshake.

Arbitrary bytes, arbitrary well-formed CBOR, mutated valid frames and ill-typed frame objects fed
to either machine at any step only ever leave it waiting (for a frame that could still be valid)
or refused with a typed reason; nothing raises, nothing is established without the secret, and
a side that is established always names the real peer. The replay cache stays within its bound
and never calls a fresh nonce a replay.
"""

from __future__ import annotations

from typing import Any

import cbor2
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from skulk.federation import (
    ClientHandshake,
    Established,
    RefusalReason,
    Refused,
    ReplayCache,
    ServerHandshake,
    Waiting,
)
from skulk.federation._machine import FROM_CLIENT, FROM_SERVER
from skulk.wire.federation import (
    HANDSHAKE_MAX_FRAME_SIZE,
    PROTOCOL_VERSION,
    ClientHello,
    ClientProof,
    ServerChallenge,
    Welcome,
)
from tests._doubles import SECRET, counter_rng

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

Machine = ClientHandshake | ServerHandshake


def fresh_pair() -> tuple[ClientHandshake, ServerHandshake]:
    c = ClientHandshake(SECRET, "client-1", rng=counter_rng("c"))
    s = ServerHandshake(
        SECRET, "server-1", replay_cache=ReplayCache(), now=0.0, rng=counter_rng("s")
    )
    return c, s


STAGES = ["server-fresh", "server-challenged", "client-fresh", "client-proved"]


def machine_at(stage: str) -> tuple[Machine, dict[str, Any]]:
    """A machine at ``stage`` and the plain value of the frame it expects next (valid)."""
    c, s = fresh_pair()
    hello = c.initial()
    if stage == "server-fresh":
        return s, FROM_CLIENT.unstructure(hello)
    (challenge,) = s.receive(hello)
    if stage == "server-challenged":
        (proof,) = c.receive(challenge)
        return s, FROM_CLIENT.unstructure(proof)
    if stage == "client-fresh":
        return c, FROM_SERVER.unstructure(challenge)
    (proof,) = c.receive(challenge)
    (welcome,) = s.receive(proof)
    return c, FROM_SERVER.unstructure(welcome)


def check_invariants(machine: Machine) -> None:
    state = machine.state
    assert isinstance(state, Waiting | Refused), state
    if isinstance(state, Refused):
        refusal = state.refusal
        assert isinstance(refusal.reason, RefusalReason)
        assert 4000 <= refusal.close_code <= 4999
        assert len(refusal.close_reason.encode()) <= 123
        line = refusal.log_line("192.0.2.1:1")
        assert "\n" not in line and "\r" not in line
        assert SECRET.to_text() not in line


def feed_all(machine: Machine, messages: list[bytes | str]) -> None:
    first_refusal = None
    for message in messages:
        out = machine.receive_bytes(message)
        check_invariants(machine)
        if isinstance(machine.state, Refused):
            assert out == []
            if first_refusal is None:
                first_refusal = machine.state.refusal
            assert machine.state.refusal is first_refusal  # refusals are final


# ---- strategies --------------------------------------------------------------------------------

FIELD_NAMES = ["t", "protocol_version", "cluster_id", "node_id", "nonce", "proof"]
TAGS = ["ClientHello", "ClientProof", "ServerChallenge", "Welcome", "Hello", ""]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=40),
    st.binary(max_size=64),
    st.sampled_from(TAGS),
    st.just(SECRET.cluster_id),
    st.just(PROTOCOL_VERSION),
    st.binary(min_size=32, max_size=32),
)
cbor_values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=8)), inner, max_size=6
        ),
    ),
    max_leaves=20,
)
messages = st.one_of(
    st.binary(max_size=300),
    st.binary(min_size=HANDSHAKE_MAX_FRAME_SIZE - 2, max_size=HANDSHAKE_MAX_FRAME_SIZE + 2),
    cbor_values.map(cbor2.dumps),
    st.text(max_size=40),
)


@st.composite
def mutated(draw: st.DrawFn, valid: dict[str, Any]) -> dict[str, Any]:
    """``valid`` with one to three changes: a field replaced, dropped or added."""
    value = dict(valid)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        action = draw(st.sampled_from(["replace", "drop", "add"]))
        key = draw(st.sampled_from(sorted(value) or ["t"]))
        if action == "replace":
            value[key] = draw(cbor_values)
        elif action == "drop":
            value.pop(key, None)
        else:
            value[draw(st.sampled_from([*FIELD_NAMES, "extra"]))] = draw(cbor_values)
    return value


anything = st.one_of(cbor_values, st.binary(max_size=40), st.integers(), st.text(max_size=10))
ill_typed_frames = st.one_of(
    st.builds(ClientHello, anything, anything, anything, anything),
    st.builds(ClientProof, anything),
    st.builds(ServerChallenge, anything, anything, anything, anything, anything),
    st.just(Welcome()),
    anything,
)


# ---- properties ----------------------------------------------------------------------------------


@FAST
@given(stage=st.sampled_from(STAGES), data=st.lists(messages, min_size=1, max_size=5))
def test_arbitrary_messages_only_ever_refuse(stage: str, data: list[bytes | str]) -> None:
    machine, _ = machine_at(stage)
    feed_all(machine, data)


@FAST
@given(stage=st.sampled_from(STAGES), data=st.data())
def test_mutated_valid_frames_refuse_or_wait(stage: str, data: st.DataObject) -> None:
    machine, valid = machine_at(stage)
    value = data.draw(mutated(valid))
    assume(value != valid)
    out = machine.receive_bytes(cbor2.dumps(value))
    check_invariants(machine)
    if isinstance(machine.state, Waiting):
        # Only a server reading a hello can accept a changed frame (another node's hello).
        assert stage == "server-fresh" and len(out) == 1
    # Whatever happened, a valid continuation never establishes a mutated peer by accident.
    assert not isinstance(machine.state, Established)


@FAST
@given(stage=st.sampled_from(STAGES), frames=st.lists(ill_typed_frames, min_size=1, max_size=4))
def test_ill_typed_frame_objects_never_raise(stage: str, frames: list[Any]) -> None:
    machine, _ = machine_at(stage)
    for frame in frames:
        machine.receive(frame)
        state = machine.state
        assert isinstance(state, Waiting | Refused | Established)
        if isinstance(state, Established):  # only a genuine Welcome can do that
            assert stage == "client-proved" and state.peer_id == "server-1"
        else:
            check_invariants(machine)


@FAST
@given(
    index=st.integers(min_value=0, max_value=3),
    position=st.integers(min_value=0, max_value=10_000),
    flip=st.integers(min_value=1, max_value=255),
    replace=st.one_of(st.none(), messages),
)
def test_tampering_in_flight_never_authenticates_a_wrong_peer(
    index: int, position: int, flip: int, replace: bytes | str | None
) -> None:
    """An on-path attacker changes one message of a genuine handshake (one byte, or the whole
    message): nothing raises, and any side that still ends established names the real peer."""
    c, s = fresh_pair()
    sent = 0

    def tamper(message: bytes) -> bytes | str:
        nonlocal sent
        current, sent = sent, sent + 1
        if current != index:
            return message
        if replace is not None:
            return replace
        i = position % len(message)
        return message[:i] + bytes([message[i] ^ flip]) + message[i + 1 :]

    to_server = [tamper(c.initial_bytes())]
    while to_server:
        to_client = [tamper(out) for msg in to_server for out in s.receive_bytes(msg)]
        to_server = [tamper(out) for msg in to_client for out in c.receive_bytes(msg)]
    for machine, peer in ((c, "server-1"), (s, "client-1")):
        state = machine.state
        if isinstance(state, Established):
            assert state.peer_id == peer
        else:
            check_invariants(machine)
    if index < 3 and replace is None:  # a changed hello, challenge or proof never fully passes
        assert not (isinstance(c.state, Established) and isinstance(s.state, Established))


@FAST
@given(
    max_entries=st.integers(min_value=1, max_value=16),
    ops=st.lists(
        st.tuples(st.integers(min_value=0, max_value=40), st.floats(min_value=0, max_value=30)),
        max_size=120,
    ),
)
def test_replay_cache_is_bounded_and_never_invents_a_replay(
    max_entries: int, ops: list[tuple[int, float]]
) -> None:
    ttl = 60.0
    cache = ReplayCache(max_entries=max_entries, ttl=ttl)
    accepted_at: dict[bytes, float] = {}
    now = 0.0
    for which, step in ops:
        now += step
        nonce = which.to_bytes(32, "big")
        fresh = cache.check_and_remember(nonce, now)
        assert len(cache) <= max_entries
        last = accepted_at.get(nonce)
        if not fresh:
            assert last is not None and now - last < ttl  # a real replay within the ttl
        elif last is not None and now - last < ttl:
            assert cache.statistics().evicted > 0  # forgotten only by eviction
        if fresh:
            accepted_at[nonce] = now
            assert not cache.check_and_remember(nonce, now)  # the newest entry is kept
    stats = cache.statistics()
    assert stats.entries == len(cache) <= max_entries


def test_many_distinct_hellos_keep_the_shared_cache_bounded() -> None:
    cache = ReplayCache(max_entries=256)
    for i in range(5000):
        s = ServerHandshake(SECRET, "server-1", replay_cache=cache, now=float(i) / 100)
        hello = ClientHello(PROTOCOL_VERSION, SECRET.cluster_id, f"n{i}", i.to_bytes(32, "big"))
        assert len(s.receive(hello)) == 1
    stats = cache.statistics()
    assert stats.entries == 256 and stats.remembered == 5000 and stats.evicted == 5000 - 256
