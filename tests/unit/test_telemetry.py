"""The telemetry plane's core: last-writer-wins merge, expiry, caps, gossip, epochs, sampler."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import attrs
import cbor2
import cddl_verifier
import pytest

from skulk.telemetry import (
    TelemetryConfig,
    TelemetryStore,
    TelemetryView,
    next_epoch,
    sample_readings,
)
from skulk.telemetry._epoch import EPOCH_FILE_NAME, EpochFileCorrupt
from skulk.telemetry._readings import parse_meminfo
from skulk.telemetry._store import TelemetryRefusal, TelemetryRefusalReason
from skulk.telemetry._view import FINGERPRINT_SIZE, telemetry_version
from skulk.wire import Codec, SchemaError
from skulk.wire.telemetry import (
    NodeReadings,
    TelemetryDigest,
    TelemetryEntry,
    TelemetryFrame,
    TelemetryPush,
    TelemetryVersion,
)

CODEC: Codec[TelemetryFrame] = Codec(TelemetryFrame)
SPEC_PATH = Path(__file__).resolve().parents[2] / "specs" / "wire.cddl"
CONFIG = TelemetryConfig(ttl=10.0, forget_after=40.0, max_nodes=8, max_forgotten=8)


def readings(node_id: str, *, load: float = 0.5, hostname: str = "host") -> NodeReadings:
    return NodeReadings(
        node_id=node_id,
        hostname=hostname,
        platform="linux-x86_64",
        memory_total_bytes=32 * 2**30,
        memory_available_bytes=16 * 2**30,
        mlx_version="0.32.4",
        mlx_backends=("cpu",),
        cpu_count=8,
        load_1m=load,
        listen_addresses=("ws://127.0.0.1:52416",),
        api_address="http://127.0.0.1:52415",
        sampled_at=1_700_000_000.0,
    )


def entry(node_id: str, epoch: int, seq: int, **kw: object) -> TelemetryEntry:
    return TelemetryEntry(node_id, epoch, seq, readings(node_id, **kw))  # type: ignore[arg-type]


def store(
    node_id: str = "self", epoch: int = 1, config: TelemetryConfig = CONFIG
) -> TelemetryStore:
    return TelemetryStore(node_id, epoch, config)


# ---- last writer wins ----------------------------------------------------------------------------


def test_a_newer_entry_replaces_an_older_one_and_an_older_one_is_ignored() -> None:
    s = store()
    old, new = entry("b", 1, 1, load=1.0), entry("b", 1, 2, load=2.0)
    assert s.apply([old], 0.0).accepted == (old,)
    assert s.apply([new], 1.0).accepted == (new,)
    outcome = s.apply([old], 2.0)
    assert outcome.accepted == () and outcome.stale == 1 and outcome.refused == ()
    assert s.view["b"] == new
    assert s.apply([new], 3.0).stale == 1  # a duplicate is stale too
    assert s.refreshed_at("b") == 1.0  # ...and does not refresh


def test_a_restarted_node_wins_over_any_seq_of_its_previous_epoch() -> None:
    s = store()
    before = entry("b", 1, 10_000, load=9.0)
    after = entry("b", 2, 1, load=0.1)
    s.apply([before], 0.0)
    assert s.apply([after], 1.0).accepted == (after,)
    assert s.apply([before], 2.0).stale == 1
    assert s.view["b"] == after
    assert TelemetryView([after, before]) == TelemetryView([before, after])


def test_same_version_with_other_readings_merges_the_same_way_everywhere() -> None:
    one, two = entry("b", 1, 1, hostname="one"), entry("b", 1, 1, hostname="two")
    assert telemetry_version(one).fingerprint != telemetry_version(two).fingerprint
    winner = max((one, two), key=lambda e: telemetry_version(e).fingerprint)
    assert TelemetryView([one]).merge(TelemetryView([two]))["b"] == winner
    assert TelemetryView([two]).merge(TelemetryView([one]))["b"] == winner
    x, y = store("x"), store("y")
    x.apply([one, two], 0.0)
    y.apply([two, one], 0.0)
    assert x.view == y.view and x.view["b"] == winner


def test_versions_carry_a_blake2b_fingerprint_of_the_readings_only() -> None:
    a = telemetry_version(entry("b", 1, 1))
    assert a == TelemetryVersion("b", 1, 1, a.fingerprint)
    assert len(a.fingerprint) == FINGERPRINT_SIZE
    assert telemetry_version(entry("b", 7, 9)).fingerprint == a.fingerprint
    assert telemetry_version(entry("b", 1, 1, load=0.25)).fingerprint != a.fingerprint
    # 0.0 and -0.0 are equal floats but different readings: the view tells them apart
    zero, minus = entry("b", 1, 1, load=0.0), entry("b", 1, 1, load=-0.0)
    assert zero == minus and TelemetryView([zero]) != TelemetryView([minus])


def test_a_view_is_an_immutable_snapshot_ordered_by_node_id() -> None:
    s = store()
    s.apply([entry("c", 1, 1), entry("a", 1, 1)], 0.0)
    before = s.view
    s.apply([entry("b", 1, 1), entry("a", 1, 2)], 1.0)
    assert list(before) == ["a", "c"] and before["a"].seq == 1
    assert list(s.view) == ["a", "b", "c"]
    assert [e.node_id for e in s.view.entries()] == ["a", "b", "c"]
    assert [v.node_id for v in s.view.versions()] == ["a", "b", "c"]
    assert s.view.version("zz") is None and "zz" not in s.view
    assert hash(s.view) == hash(TelemetryView(s.view.entries()))
    assert s.view != before


# ---- publishing this node ------------------------------------------------------------------------


def test_own_publishes_increasing_seqs_in_this_epoch_and_never_expires() -> None:
    s = store("self", epoch=4)
    assert s.version == (4, 0)
    first = s.own(readings("self"), 0.0)
    second = s.own(readings("self", load=3.0), 1.0)
    assert (first.epoch, first.seq, second.epoch, second.seq) == (4, 1, 4, 2)
    assert s.view["self"] == second and s.version == (4, 2)
    assert s.expire(1_000_000.0) == ()
    assert s.view["self"] == second
    with pytest.raises(ValueError, match="published as"):
        s.own(readings("other"), 2.0)


def test_own_jumps_past_a_newer_entry_published_under_this_id() -> None:
    s = store("self", epoch=2)
    s.own(readings("self"), 0.0)
    impostor = entry("self", 3, 50)  # e.g. a copy of this data dir running elsewhere
    assert s.apply([impostor], 1.0).accepted == (impostor,)
    mine = s.own(readings("self"), 2.0)
    assert (mine.epoch, mine.seq) == (3, 51)
    assert s.view["self"] == mine


# ---- expiry and resurrection ---------------------------------------------------------------------


def test_an_entry_expires_after_ttl_without_a_refresh() -> None:
    s = store()
    s.apply([entry("b", 1, 1)], 100.0)
    assert s.next_expiry() == 110.0
    assert s.expire(110.0) == ()  # live through refreshed + ttl
    assert s.expire(110.5) == ("b",)
    assert "b" not in s.view and s.refreshed_at("b") is None
    assert s.statistics().expired == 1


def test_a_refresh_keeps_an_entry_alive() -> None:
    s = store()
    for now, seq in ((0.0, 1), (8.0, 2), (16.0, 3), (24.0, 4)):
        s.apply([entry("b", 1, seq)], now)
        assert s.expire(now + 9.0) == ()
    assert s.refreshed_at("b") == 24.0
    assert s.expire(34.1) == ("b",)


def test_stale_gossip_does_not_resurrect_an_expired_node() -> None:
    s = store()
    last = entry("b", 1, 5)
    s.apply([entry("b", 1, 4)], 0.0)
    s.apply([last], 1.0)
    assert s.expire(20.0) == ("b",)
    assert s.digest().forgotten == (telemetry_version(last),)
    # a peer that has not expired b yet pushes what it has: the same or older versions
    outcome = s.apply([last, entry("b", 1, 4), entry("b", 0, 99)], 21.0)
    assert outcome.accepted == () and outcome.stale == 3
    assert "b" not in s.view
    # a peer holding b's latest must not send it back to us
    peer = store("peer")
    peer.apply([last], 21.0)
    assert peer.delta_for(s.digest()).entries == ()
    assert not s.needs(peer.digest())


def test_an_expired_node_that_comes_back_newer_is_accepted_again() -> None:
    s = store()
    s.apply([entry("b", 1, 5)], 0.0)
    s.expire(20.0)
    back = entry("b", 2, 1)  # restarted: new epoch
    assert s.apply([back], 21.0).accepted == (back,)
    assert s.view["b"] == back and s.digest().forgotten == ()
    assert s.expire(30.0) == ()


def test_dropped_versions_are_forgotten_after_forget_after_and_beyond_the_cap() -> None:
    s = store()
    s.apply([entry("b", 1, 1)], 0.0)
    s.expire(11.0)  # b dropped at 11
    assert s.next_expiry() == 51.0
    s.expire(51.0)
    assert len(s.digest().forgotten) == 1
    s.expire(51.5)
    assert s.digest().forgotten == () and s.next_expiry() is None
    # once forgotten, the old version is news again (peers dropped it long ago)
    assert s.apply([entry("b", 1, 1)], 52.0).accepted

    capped = store(config=attrs.evolve(CONFIG, max_forgotten=2))
    capped.apply([entry("old", 1, 1)], 0.0)
    capped.expire(11.0)
    capped.apply([entry("mid", 1, 1), entry("new", 1, 1)], 5.0)
    capped.expire(16.0)
    assert [v.node_id for v in capped.digest().forgotten] == ["mid", "new"]
    assert capped.statistics().forgotten == 2


# ---- the cap -------------------------------------------------------------------------------------


def test_unknown_nodes_are_refused_when_full_and_expiry_makes_room() -> None:
    s = store(config=attrs.evolve(CONFIG, max_nodes=3))
    outcome = s.apply([entry("a", 1, 1), entry("b", 1, 1), entry("c", 1, 1)], 0.0)
    assert [e.node_id for e in outcome.accepted] == ["a", "b"]
    assert outcome.refused == (TelemetryRefusal("c", TelemetryRefusalReason.FULL),)
    assert s.apply([entry("a", 1, 2)], 5.0).accepted  # known nodes keep updating
    s.own(readings("self"), 5.0)  # one slot is kept for this node
    assert len(s.view) == 3
    full_digest = TelemetryDigest((telemetry_version(entry("c", 1, 1)),), ())
    assert not s.needs(full_digest)  # nothing it could take
    assert s.expire(12.0) == ("b",)
    assert s.apply([entry("c", 1, 1)], 12.0).accepted
    assert s.statistics().refused == 1


def test_malformed_entries_are_refused_with_a_reason() -> None:
    s = store()
    mismatch = TelemetryEntry("a", 1, 1, readings("b"))
    negative = entry("a", -1, 1)
    nan = entry("a", 1, 1, load=math.nan)
    outcome = s.apply([mismatch, negative, nan], 0.0)
    assert [r.reason for r in outcome.refused] == [
        TelemetryRefusalReason.NODE_ID_MISMATCH,
        TelemetryRefusalReason.NEGATIVE_VERSION,
        TelemetryRefusalReason.NOT_ENCODABLE,
    ]
    assert len(s.view) == 0


def test_config_and_store_refuse_nonsense() -> None:
    with pytest.raises(ValueError):
        TelemetryConfig(ttl=0.0)
    with pytest.raises(ValueError):
        TelemetryConfig(ttl=math.nan)
    with pytest.raises(ValueError):
        TelemetryConfig(ttl=30.0, forget_after=10.0)
    with pytest.raises(ValueError):
        TelemetryConfig(max_nodes=0)
    with pytest.raises(ValueError):
        TelemetryStore("self", -1)
    assert TelemetryConfig(ttl=math.inf, forget_after=math.inf).ttl == math.inf


# ---- anti-entropy --------------------------------------------------------------------------------


def exchange(a: TelemetryStore, b: TelemetryStore, now: float) -> None:
    """One push/pull round both ways, through the codec."""
    for learner, source in ((a, b), (b, a)):
        digest = CODEC.decode(CODEC.encode(learner.digest()))
        assert isinstance(digest, TelemetryDigest)
        push = CODEC.decode(CODEC.encode(source.delta_for(digest)))
        assert isinstance(push, TelemetryPush)
        learner.apply(push.entries, now)


def test_digest_and_delta_bring_two_stores_to_the_same_view() -> None:
    a, b = store("a"), store("b")
    a.own(readings("a"), 0.0)
    b.own(readings("b"), 0.0)
    a.apply([entry("x", 1, 3), entry("y", 2, 1)], 0.0)
    b.apply([entry("x", 1, 4), entry("y", 1, 9), entry("z", 1, 1)], 0.0)
    assert b.needs(a.digest()) and a.needs(b.digest())
    delta = b.delta_for(a.digest())
    assert [(e.node_id, e.epoch, e.seq) for e in delta.entries] == [
        ("b", 1, 1),
        ("x", 1, 4),
        ("z", 1, 1),
    ]
    exchange(a, b, 1.0)
    assert a.view == b.view
    assert {k: (v.epoch, v.seq) for k, v in a.view.items()} == {
        "a": (1, 1),
        "b": (1, 1),
        "x": (1, 4),
        "y": (2, 1),
        "z": (1, 1),
    }
    assert a.delta_for(b.digest()).entries == () and not a.needs(b.digest())


def test_statistics_count_what_happened() -> None:
    s = store()
    s.own(readings("self"), 0.0)
    s.apply([entry("b", 1, 1), entry("b", 1, 1), TelemetryEntry("c", 1, 1, readings("d"))], 0.0)
    s.expire(11.0)
    stats = s.statistics()
    assert (stats.nodes, stats.forgotten, stats.published) == (1, 1, 1)
    assert (stats.accepted, stats.stale, stats.refused, stats.expired) == (1, 1, 1, 1)


# ---- epochs --------------------------------------------------------------------------------------


def test_next_epoch_counts_up_across_restarts_and_persists(tmp_path: Path) -> None:
    home = tmp_path / "data"
    assert [next_epoch(home) for _ in range(3)] == [1, 2, 3]
    assert (home / EPOCH_FILE_NAME).read_text() == "3\n"
    assert os.listdir(home) == [EPOCH_FILE_NAME]  # no temp files left behind


@pytest.mark.parametrize("content", [b"", b"twelve\n", b"-3\n", b"\xff\xfe", b"\xc2\xb2\n"])
def test_a_corrupt_epoch_file_is_a_typed_error(tmp_path: Path, content: bytes) -> None:
    (tmp_path / EPOCH_FILE_NAME).write_bytes(content)
    with pytest.raises(EpochFileCorrupt) as info:
        next_epoch(tmp_path)
    assert info.value.path == tmp_path / EPOCH_FILE_NAME
    assert (tmp_path / EPOCH_FILE_NAME).read_bytes() == content  # left for the operator


# ---- sampling and the wire -----------------------------------------------------------------------


def test_the_sampler_reads_sane_values_on_this_machine() -> None:
    r = sample_readings("n1", ["ws://127.0.0.1:52416"], "http://127.0.0.1:52415", sampled_at=5.0)
    assert r.node_id == "n1" and r.hostname
    assert r.platform.startswith(sys.platform)
    assert r.memory_total_bytes > 2**26
    assert 0 < r.memory_available_bytes <= r.memory_total_bytes
    assert r.cpu_count >= 1 and math.isfinite(r.load_1m) and r.load_1m >= 0.0
    assert r.mlx_backends[:1] == ("cpu",) and set(r.mlx_backends) <= {"cpu", "metal", "cuda"}
    assert r.mlx_version  # mlx is a dependency
    assert r.listen_addresses == ("ws://127.0.0.1:52416",)
    assert r.api_address == "http://127.0.0.1:52415" and r.sampled_at == 5.0


def test_meminfo_parsing() -> None:
    text = (
        "MemTotal:       16000 kB\nMemFree:  1000 kB\nMemAvailable:   8000 kB\nHugePages_Total: 0\n"
    )
    assert parse_meminfo(text) == (16000 * 1024, 8000 * 1024)
    assert parse_meminfo("MemTotal: 4 kB\nMemFree: 1 kB\n") == (4096, 1024)  # old kernels
    assert parse_meminfo("MemTotal: 4 kB\nMemAvailable: 9 kB\n") == (4096, 4096)
    assert parse_meminfo("garbage\n:\nMemFree: x kB\n") is None


def test_frames_round_trip_through_the_codec_and_match_the_spec() -> None:
    s = store("n1")
    s.own(sample_readings("n1", ["ws://[::1]:52416"], "http://127.0.0.1:52415"), 0.0)
    s.apply([entry("b", 1, 2)], 0.0)
    s.apply([entry("gone", 1, 1)], -20.0)
    s.expire(0.0)
    digest = s.digest()
    assert len(digest.versions) == 2 and len(digest.forgotten) == 1
    frames: list[TelemetryFrame] = [digest, s.delta_for(TelemetryDigest((), ())), TelemetryPush(())]
    validator = cddl_verifier.Validator(SPEC_PATH.read_text(encoding="utf-8"))
    for frame in frames:
        body = CODEC.encode(frame)
        assert CODEC.decode(body) == frame
        assert validator.validate(body, root_type="TelemetryFrame").valid, frame


def test_the_codec_refuses_a_frame_with_a_wrong_field() -> None:
    good = CODEC.unstructure(TelemetryPush((entry("b", 1, 1),)))
    good["entries"][0]["seq"] = 1.0
    with pytest.raises(SchemaError, match=r"entries\[0\]\.seq"):
        CODEC.decode(cbor2.dumps(good))


# ---- what a node offers placement: memory limit, compute ports, fetch progress -----------------


def test_a_memory_limit_caps_what_a_node_advertises() -> None:
    from skulk.telemetry._readings import cap_memory

    gib = 1 << 30
    assert cap_memory(16 * gib, 10 * gib, None, 5 * gib) == (16 * gib, 10 * gib)
    assert cap_memory(16 * gib, 10 * gib, 4 * gib) == (4 * gib, 4 * gib)
    assert cap_memory(16 * gib, 10 * gib, 4 * gib, 3 * gib) == (4 * gib, 1 * gib)
    assert cap_memory(16 * gib, 2 * gib, 8 * gib, 1 * gib) == (8 * gib, 2 * gib)  # real is less
    assert cap_memory(16 * gib, 10 * gib, 4 * gib, 9 * gib) == (4 * gib, 0)  # never below 0
    from skulk.config import ByteSize

    r = sample_readings("n1", [], "", memory_limit=ByteSize("1M"), runner_bytes=1 << 19)
    assert r.memory_total_bytes <= 1 << 20 and r.memory_available_bytes <= 1 << 19
    CODEC.encode(TelemetryPush((TelemetryEntry("n1", 1, 1, r),)))  # plain ints on the wire


def test_readings_carry_compute_ports_and_fetches_across_the_wire() -> None:
    from skulk.telemetry import FetchBoard
    from skulk.wire.telemetry import MAX_FETCHES, ComputePorts, FetchProgress

    board = FetchBoard()
    board.set("i2", 1, 50, 100)
    board.set("i1", 0, 150, 100)  # clamped to the total
    board.set("i1", 0, 70, 100)
    board.set("i3", 0, -5, 10)
    board.clear("i3", 0)
    board.clear("never", 9)
    assert board.snapshot() == (FetchProgress("i1", 0, 70, 100), FetchProgress("i2", 1, 50, 100))
    compute = ComputePorts("10.0.0.1", 53416, 53447)
    r = sample_readings("n1", [], "", compute=compute, fetches=board.snapshot())
    entry = TelemetryEntry("n1", 1, 1, r)
    decoded = CODEC.decode(CODEC.encode(TelemetryPush((entry,))))
    assert isinstance(decoded, TelemetryPush) and decoded.entries[0].readings == r
    assert TelemetryView([entry])["n1"].readings.compute == compute
    # Bounded: a board lists at most MAX_FETCHES, and readings never carry more.
    for i in range(MAX_FETCHES + 5):
        board.set(f"x{i:03d}", 0, 1, 2)
    assert len(board.snapshot()) == MAX_FETCHES
    assert board.statistics().refused == 7  # i1, i2 held two slots already
    many = [FetchProgress(f"y{i}", 0, 1, 2) for i in range(MAX_FETCHES + 3)]
    assert len(sample_readings("n1", [], "", fetches=many).fetches) == MAX_FETCHES
