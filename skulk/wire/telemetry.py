"""Frames of the telemetry plane: node readings, gossiped last-writer-wins between nodes.

Telemetry is never in the Raft log: it is soft state, refreshed all the time. Each node samples
its own :class:`NodeReadings` and publishes them as a :class:`TelemetryEntry` stamped with a version
``(epoch, seq)``: ``epoch`` goes up by one every time the node starts (it is persisted in the
data dir), ``seq`` counts the node's publications within an epoch. Per node id the entry with
the greatest version wins, so a restarted node (new epoch, ``seq`` from 1 again) wins over any
entry of its previous life. ``NodeReadings.sampled_at`` is the sender's wall clock, shown to
operators only; it never orders anything.

Anti-entropy, on the ``telemetry`` topic of a federation link (push/pull by digest):

1. Every gossip interval a node sends each peer a :class:`TelemetryDigest`: the version of every
   entry it holds (``versions``), plus the versions it dropped on expiry and still remembers
   (``forgotten``, so the peer does not send them back).
2. The peer answers with a :class:`TelemetryPush` holding every entry it has that is newer than
   what the digest names for that node, or whose node the digest does not name at all (possibly
   no entries). If the digest names versions newer than the peer's own, the peer may send its
   own digest straight back rather than wait for its next interval.
3. A node may also send a :class:`TelemetryPush` unasked (its own fresh entry, say); receivers
   treat every push the same way.

Versions compare as ``(epoch, seq, fingerprint)``: ``fingerprint`` is the first 16 bytes of the
BLAKE2b hash of the canonical CBOR encoding of the entry's readings, computed by each receiver
(never taken from the sender's word) and carried in digests only. It makes two different readings
published under the same ``(epoch, seq)`` (a node id reused by two processes, a restored data
dir) merge the same way on every node. The pure merge logic lives in
:mod:`skulk.telemetry._view` (the merge) and :mod:`skulk.telemetry._store`.
"""

from __future__ import annotations

import attrs


@attrs.frozen
class ComputePorts:
    """Where a node's runners join compute groups: ``host`` (the host its peers reach it at)
    and the ports ``[first_port, last_port]`` it lets the leader give ranks placed on it."""

    host: str
    first_port: int
    last_port: int


@attrs.frozen
class FetchProgress:
    """A rank of ``instance`` placed on this node is fetching its weights from a peer:
    ``bytes_done`` of ``bytes_total`` are here."""

    instance: str
    rank: int
    bytes_done: int
    bytes_total: int


@attrs.frozen
class RunnerReading:
    """A runner this node hosts: rank ``rank`` of ``instance`` (of ``model``) in runner
    ``phase`` (the State's vocabulary: ``fetching``, ``connecting``, ``loading``, ``ready``,
    ``failed``, ...). From its engine's last counters: ``running`` requests admitted,
    ``waiting`` for KV room, ``kv_used_bytes`` of ``kv_capacity_bytes`` (0 of 0 before any, and
    on ranks other than 0 of a sharded instance). ``tokens_per_s``: tokens it generated per
    second over the last ~10 s; ``ttft_p50_s``: the median time to first token of its recent
    requests (``None`` before any). ``failure`` is the failure of a ``failed`` runner;
    ``retry_in_s`` the seconds left of its crash-loop cool-down (``None``: none running)."""

    instance: str
    model: str
    rank: int
    phase: str
    running: int
    waiting: int
    kv_used_bytes: int
    kv_capacity_bytes: int
    tokens_per_s: float
    ttft_p50_s: float | None = None
    failure: str | None = None
    retry_in_s: float | None = None


@attrs.frozen
class DiskReading:
    """The file system holding the node's models (``path``, its models directory):
    ``free_bytes`` of ``total_bytes`` are free (to an unprivileged writer)."""

    path: str
    free_bytes: int
    total_bytes: int


@attrs.frozen
class FetchFailure:
    """A weight fetch of rank ``rank`` of ``instance`` (of ``model``) on this node failed:
    ``reason`` is the typed failure (``no_holder_reachable``, ``disk_full``,
    ``manifest_mismatch``, ``no_manifest``, ``fetch_failed``), ``message`` says more (at most
    :data:`MAX_FAILURE_MESSAGE` characters), ``at`` is the node's wall clock then (display only)."""

    instance: str
    rank: int
    model: str
    reason: str
    message: str
    at: float


@attrs.frozen
class ModelTransfer:
    """A whole model coming onto this node: from the Hub (``source`` ``"hub"``) or from the
    cluster's holders (``"peers"``). ``bytes_done`` of ``bytes_total`` over all its files;
    ``file`` is the file in flight (``""``: none), ``file_done`` of ``file_total`` of it;
    ``rate_bps`` the bytes per second over the last few seconds; ``eta_s`` the seconds left
    at that rate (``None`` until bytes move); ``started_at`` the node's wall clock (display)."""

    model: str
    source: str
    bytes_done: int
    bytes_total: int
    file: str
    file_done: int
    file_total: int
    rate_bps: float
    eta_s: float | None
    started_at: float


@attrs.frozen
class StoredModelReading:
    """A model in the node's store: ``sha256`` (manifest hash, its identity), ``names`` it is
    known by, ``size`` (distinct files counted once), ``last_used`` (node wall clock)."""

    sha256: str
    names: tuple[str, ...]
    size: int
    last_used: float


@attrs.frozen
class StoreReading:
    """The node's model store: ``used_bytes`` of blobs, ``budget_bytes`` (``None``: the disk
    only), ``available_bytes`` a new model may take now without evicting anything, and
    ``models`` it holds (at most :data:`MAX_STORED`, most recently used first)."""

    used_bytes: int
    budget_bytes: int | None
    available_bytes: int
    models: tuple[StoredModelReading, ...] = ()


@attrs.frozen
class NodeReadings:
    """One sample of a node's state, taken by that node.

    ``platform`` is informational (``"linux-x86_64"``, ``"darwin-arm64"``). ``mlx_backends``
    lists the mlx backends usable on the node (``"cpu"`` always, ``"metal"`` / ``"cuda"`` when
    available); ``mlx_version`` is ``""`` when mlx is not importable. ``load_1m`` is the
    one-minute load average (0.0 where the platform has none). ``listen_addresses`` are the
    federation endpoints (``"ws://host:port"``), ``api_address`` the HTTP API's
    (``"http://host:port"``). ``sampled_at`` is the node's wall clock (seconds since the Unix
    epoch) when sampled: for display only, never for ordering. ``compute`` is where the node's
    runners can join compute groups (``None``: not advertised yet; the leader places no rank of
    a pipeline or tensor instance there until it is); ``fetches`` lists the ranks fetching
    weights from a peer now, with their progress (at most :data:`MAX_FETCHES`).

    For node health (``GET /v1/cluster/nodes``): ``serving`` lists the runners the node hosts
    (at most :data:`MAX_SERVING`), ``disk`` the free space where its models live (``None``:
    not read), ``fetch_failures`` its recent failed weight fetches, newest last (at most
    :data:`MAX_FETCH_FAILURES`; a later fetch of the same model that succeeds clears them).
    ``transfers`` lists whole models coming onto the node (Hub downloads and spreads from
    peers, at most :data:`MAX_TRANSFERS`), ``store`` its model store (``None``: not read).
    """

    node_id: str
    hostname: str
    platform: str
    memory_total_bytes: int
    memory_available_bytes: int
    mlx_version: str
    mlx_backends: tuple[str, ...]
    cpu_count: int
    load_1m: float
    listen_addresses: tuple[str, ...]
    api_address: str
    sampled_at: float
    compute: ComputePorts | None = None
    fetches: tuple[FetchProgress, ...] = ()
    serving: tuple[RunnerReading, ...] = ()
    disk: DiskReading | None = None
    fetch_failures: tuple[FetchFailure, ...] = ()
    transfers: tuple[ModelTransfer, ...] = ()
    store: StoreReading | None = None


#: The most fetches one node's readings list (the readings stay small whatever is placed).
MAX_FETCHES = 64
#: The most runners one node's readings list in ``serving``.
MAX_SERVING = 64
#: The most whole-model transfers one node's readings list.
MAX_TRANSFERS = 16
#: The most stored models one node's readings list.
MAX_STORED = 64
#: The most failed fetches one node's readings list (the newest are kept).
MAX_FETCH_FAILURES = 8
#: The longest ``FetchFailure.message`` a node publishes (longer ones are cut).
MAX_FAILURE_MESSAGE = 300


@attrs.frozen
class TelemetryEntry:
    """``readings`` of node ``node_id`` as published at version ``(epoch, seq)``.

    ``node_id`` must equal ``readings.node_id`` (receivers refuse the entry otherwise);
    ``epoch`` and ``seq`` are ``>= 0``.
    """

    node_id: str
    epoch: int
    seq: int
    readings: NodeReadings


@attrs.frozen
class TelemetryVersion:
    """The version of one node's entry: what a digest says its sender holds (or forgot)."""

    node_id: str
    epoch: int
    seq: int
    fingerprint: bytes


@attrs.frozen
class TelemetryDigest:
    """The sender's versions: ``versions`` of the entries it holds, ``forgotten`` of entries it
    dropped on expiry and will refuse if they come back. The receiver answers with a
    :class:`TelemetryPush` of what the sender lacks."""

    versions: tuple[TelemetryVersion, ...]
    forgotten: tuple[TelemetryVersion, ...]


@attrs.frozen
class TelemetryPush:
    """Entries for the receiver to merge (an answer to a digest, or unasked)."""

    entries: tuple[TelemetryEntry, ...]


TelemetryFrame = TelemetryDigest | TelemetryPush
