"""Properties of the telemetry lattice and of gossip between telemetry stores.

* :meth:`TelemetryView.merge` is a join: commutative, associative, idempotent, over views that
  often hold different readings under the same ``(epoch, seq)`` (few node ids, few versions, a
  small pool of readings, ``0.0`` and ``-0.0`` included).
* A store's :meth:`~TelemetryStore.apply` is that join (while nothing expires and the cap is far).
* Gossip converges: 3-5 stores publish, restart (new epoch, empty memory) and pull from each other
  in any order through the real codec, sometimes hearing of a twin's other readings under a
  node's latest version; once every pair has exchanged both ways, all views are
  identical, equal to the join of what the stores held, and hold each node's latest publication.
* Expired entries stay dead: no version at or below the dropped one brings a node back.
"""

from __future__ import annotations

import itertools
import random

import attrs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skulk.telemetry import TelemetryConfig, TelemetryStore, TelemetryView
from skulk.wire import Codec
from skulk.wire.telemetry import (
    NodeReadings,
    TelemetryDigest,
    TelemetryEntry,
    TelemetryFrame,
    TelemetryPush,
)

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GOSSIP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

CODEC: Codec[TelemetryFrame] = Codec(TelemetryFrame)
NEVER = TelemetryConfig(ttl=float("inf"), forget_after=float("inf"))

NODE_IDS = ("a", "b", "c")


def _readings(node_id: str, variant: int) -> NodeReadings:
    return NodeReadings(
        node_id=node_id,
        hostname=("h1", "h2")[variant % 2],
        platform="linux-x86_64",
        memory_total_bytes=(2**34, 2**64 - 1)[variant % 2],
        memory_available_bytes=2**33,
        mlx_version="0.32.4",
        mlx_backends=(("cpu",), ("cpu", "cuda"))[variant // 2 % 2],
        cpu_count=2,
        load_1m=(0.0, -0.0, 0.5, 1e300)[variant % 4],
        listen_addresses=((), ("ws://127.0.0.1:52416",))[variant // 4 % 2],
        api_address="http://127.0.0.1:52415",
        sampled_at=1.5,
    )


# Several distinct readings per node (0.0 and -0.0 loads among them), so that different
# readings under one (epoch, seq) are common. Built once: generating them field by field makes
# hypothesis, not the code under test, the slow part.
READINGS = {node_id: tuple(_readings(node_id, v) for v in range(8)) for node_id in NODE_IDS}


@st.composite
def entries(draw: st.DrawFn) -> TelemetryEntry:
    node_id = draw(st.sampled_from(NODE_IDS))
    return TelemetryEntry(
        node_id,
        draw(st.integers(0, 2)),
        draw(st.integers(0, 2)),
        draw(st.sampled_from(READINGS[node_id])),
    )


views = st.lists(entries(), max_size=6).map(TelemetryView)


@FAST
@given(views, views)
def test_merge_is_commutative(a: TelemetryView, b: TelemetryView) -> None:
    assert a.merge(b) == b.merge(a)
    assert a.merge(b).entries() == b.merge(a).entries()


@FAST
@given(views, views, views)
def test_merge_is_associative(a: TelemetryView, b: TelemetryView, c: TelemetryView) -> None:
    assert a.merge(b).merge(c) == a.merge(b.merge(c))


@FAST
@given(views, views)
def test_merge_is_idempotent_and_an_upper_bound(a: TelemetryView, b: TelemetryView) -> None:
    assert a.merge(a) == a
    joined = a.merge(b)
    assert joined.merge(a) == joined
    assert joined.merge(b) == joined
    assert set(joined) == set(a) | set(b)


@FAST
@given(st.lists(entries(), max_size=8), st.randoms(use_true_random=False))
def test_a_view_does_not_depend_on_entry_order(
    items: list[TelemetryEntry], rnd: random.Random
) -> None:
    shuffled = list(items)
    rnd.shuffle(shuffled)
    assert TelemetryView(items) == TelemetryView(shuffled)
    assert TelemetryView(items) == TelemetryView([]).merge(TelemetryView(reversed(items)))


@FAST
@given(st.lists(st.lists(entries(), max_size=4), max_size=5))
def test_store_apply_is_the_join(batches: list[list[TelemetryEntry]]) -> None:
    store = TelemetryStore("self", 1, NEVER)
    expected = TelemetryView()
    for now, batch in enumerate(batches):
        outcome = store.apply(batch, float(now))
        assert not outcome.refused
        expected = expected.merge(TelemetryView(batch))
        assert store.view == expected


@FAST
@given(entries(), st.lists(entries(), max_size=8))
def test_an_expired_version_never_comes_back(
    first: TelemetryEntry, later: list[TelemetryEntry]
) -> None:
    store = TelemetryStore("self", 1, TelemetryConfig(ttl=1.0, forget_after=100.0))
    store.apply([first], 0.0)
    assert store.expire(2.0) == (first.node_id,)
    dropped = store.digest().forgotten[0]
    store.apply(later, 3.0)
    back = store.view.get(first.node_id)
    if back is not None:
        assert (back.epoch, back.seq) >= (dropped.epoch, dropped.seq)
        version = store.view.version(first.node_id)
        assert version is not None
        assert (version.epoch, version.seq, version.fingerprint) > (
            dropped.epoch,
            dropped.seq,
            dropped.fingerprint,
        )


# ---- gossip convergence --------------------------------------------------------------------------


def pull(learner: TelemetryStore, source: TelemetryStore, now: float) -> None:
    """``learner`` sends its digest to ``source`` and applies the answer, all through the codec."""
    digest = CODEC.decode(CODEC.encode(learner.digest()))
    assert isinstance(digest, TelemetryDigest)
    push = CODEC.decode(CODEC.encode(source.delta_for(digest)))
    assert isinstance(push, TelemetryPush)
    learner.apply(push.entries, now)


ops = st.one_of(
    st.tuples(st.just("own"), st.integers(0, 4), st.integers(0, 3)),
    st.tuples(st.just("pull"), st.integers(0, 4), st.integers(0, 4)),
    st.tuples(st.just("restart"), st.integers(0, 4), st.just(0)),
    st.tuples(st.just("twin"), st.integers(0, 4), st.integers(0, 4)),
)


@GOSSIP
@given(
    st.integers(3, 5),
    st.lists(ops, min_size=5, max_size=40),
    st.randoms(use_true_random=False),
)
def test_gossip_converges_once_every_pair_has_exchanged(
    n: int, script: list[tuple[str, int, int]], rnd: random.Random
) -> None:
    node_ids = [f"node-{i}" for i in range(n)]
    epochs = [1] * n
    stores = [TelemetryStore(node_ids[i], 1, NEVER) for i in range(n)]
    latest: dict[str, TelemetryEntry] = {}  # each node's last publication in its current life
    twinned: set[str] = set()  # nodes whose latest version has a twin with other readings
    now = 0.0

    def sample(i: int, load: int) -> NodeReadings:
        return NodeReadings(
            node_ids[i], "host", "linux-x86_64", 2**34, 2**33, "0.32.4", ("cpu",), 2,
            load / 2, (), "", now,
        )  # fmt: skip

    for op, i, k in script:
        now += 1.0
        i %= n
        if op == "own":
            latest[node_ids[i]] = stores[i].own(sample(i, k), now)
            twinned.discard(node_ids[i])
        elif op == "pull":
            pull(stores[i], stores[k % n], now)
        elif op == "twin":
            # Another process with node k's id (a copied data dir) published other readings
            # under k's latest version; store i heard of it.
            twin_of = node_ids[k % n]
            if twin_of in latest:
                mine = latest[twin_of]
                twin = attrs.evolve(mine, readings=attrs.evolve(mine.readings, hostname="twin"))
                stores[i].apply([twin], now)
                twinned.add(twin_of)
        else:  # a restart: a new epoch, and the store's memory is gone
            epochs[i] += 1
            stores[i] = TelemetryStore(node_ids[i], epochs[i], NEVER)
            latest.pop(node_ids[i], None)

    expected = TelemetryView()
    for store in stores:
        expected = expected.merge(store.view)
    pairs = list(itertools.combinations(range(n), 2))
    rnd.shuffle(pairs)
    for i, j in pairs:
        now += 1.0
        first, second = (i, j) if rnd.random() < 0.5 else (j, i)
        pull(stores[first], stores[second], now)
        pull(stores[second], stores[first], now)

    final = [store.view for store in stores]
    assert all(view == expected for view in final), final
    for node_id, entry in latest.items():
        if node_id not in twinned:
            assert expected[node_id] == entry
    # Converged stores have nothing left to say to each other.
    for a, b in itertools.permutations(stores, 2):
        assert a.delta_for(b.digest()).entries == ()
        assert not a.needs(b.digest())
