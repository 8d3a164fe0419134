"""``python -m skulk serve``: one node of the cluster, in one Trio tree. The one place that
wires the layers together.

    root nursery
    ├── signal watcher   SIGINT/SIGTERM → graceful shutdown
    ├── Mesh             federation: listener, dialers, one authenticated link per peer
    │                    (rpc: Raft submissions, control calls, route admissions; data streams)
    ├── Consensus        Raft over the mesh (durable log in $SKULK_HOME/raft) of the cluster State
    ├── RemoteRouting    serves requests other nodes route here; streams answers back
    ├── Reconciler       runs exactly the runners the State assigns here (one ModelService each)
    ├── Hypercorn        the Quart-Trio API (trio worker): any model, through the Router
    ├── TelemetryGossip  this node's readings, last-writer-wins gossip over the mesh
    ├── ModelDuties      Hub downloads the State gives this node; Hub models spread from holders
    └── ClusterControl   the leader's duties (liveness, re-placement, removal); --model's instance

Shutdown: hand Raft leadership over if this node leads, stop accepting, give open streams
``GRACEFUL_TIMEOUT`` seconds, then cancel everything; each model service's cancellation
terminates and reaps its runner's process group.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from skulk.api import (
    close_on_client_eof,
    create_app,
    envelope_hypercorn_errors,
    exposure_warning,
    routing_families,
    transfer_families,
)
from skulk.clock import wall
from skulk.cluster import ClusterMachine, State
from skulk.config import ServeConfig
from skulk.consensus import SUBMIT_METHOD, ConsensusService
from skulk.console import ProgressItem, progress_items, show_progress
from skulk.control import CONTROL_METHOD, ClusterControl, now_ms
from skulk.diagnostics import TIMELINE_METHOD, ClusterTimeline, journal_events, runner_events
from skulk.federation import (
    DataReceiver,
    Mesh,
    MeshAddressError,
    RpcFailed,
    SecretError,
    SecretSource,
    join_instructions,
    load_or_create_secret,
    parse_listen_address,
    tls_contexts,
)
from skulk.identity import load_or_create_node_id
from skulk.metrics import NodeMetrics
from skulk.models import ShardSlice
from skulk.routing import ASK_METHOD, ROUTE_METHOD, Admission, RemoteRouting, Router
from skulk.runner import CpuBlasUnavailable, RunnerConfig, openblas_library
from skulk.store import ModelStore, StoredModel
from skulk.telemetry import (
    FetchBoard,
    TelemetryGossip,
    TelemetryStore,
    TransferBoard,
    next_epoch,
    sample_readings,
)
from skulk.tracing import RequestJournal, enter_node
from skulk.transfer import (
    TRANSFER_METHODS,
    WeightClient,
    WeightServer,
    fetch_model,
    fetch_whole,
    is_transfer_stream,
)
from skulk.wire.cluster import ModelCard
from skulk.wire.diagnostics import TimelineEvent
from skulk.wire.runner import ShardSpec
from skulk.wire.telemetry import ComputePorts, NodeReadings
from skulk.worker import (
    Assignment,
    HubAccess,
    ModelDuties,
    ModelService,
    Reconciler,
    ServingSampler,
    SpreadProgress,
    local_card,
)

log = logging.getLogger("skulk")


def leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    """The exceptions in ``group``, however deeply nurseries nested it."""
    out: list[BaseException] = []
    for exc in group.exceptions:
        out.extend(leaves(exc) if isinstance(exc, BaseExceptionGroup) else [exc])
    return out


class StartupError(Exception):
    """The node cannot start (bad secret, address in use): printed without a traceback."""


GRACEFUL_TIMEOUT = 3.0


async def runners_of(config: ServeConfig) -> RunnerConfig:
    """The runners' settings; with ``--cpu-blas openblas``, the OpenBLAS they preload
    (written into ``<home>/cache/blas`` the first time)."""
    runners = config.runner_config()
    if config.cpu_blas != "openblas":
        return runners
    try:
        library = await trio.to_thread.run_sync(openblas_library, config.home / "cache" / "blas")
    except CpuBlasUnavailable as exc:
        raise StartupError(str(exc)) from None
    log.info("runners use OpenBLAS: %s", library)
    return attrs.evolve(runners, preload=str(library))


async def serve(
    config: ServeConfig, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run a node until SIGINT/SIGTERM (or cancellation); ``task_status`` gets the API URL."""
    if config.runner_faults:
        log.warning(
            "runner fault hooks are ON (%s): this node is for testing only", config.runner_faults
        )
    try:
        api_keys = config.api_keys()
    except ValueError as exc:  # the key file changed since the command line was read
        raise StartupError(str(exc)) from None
    if (warning := exposure_warning(config.host, has_keys=bool(api_keys))) is not None:
        # Printed, not logged: it must show whatever --log-level says.
        print(f"skulk: WARNING: {warning}", file=sys.stderr, flush=True)
    node_id = load_or_create_node_id(config.home)
    journal = RequestJournal()  # what happened to requests here (GET /v1/requests/{id})
    enter_node(node_id, journal)  # log lines of this node's tasks name it
    try:
        secret = load_or_create_secret(config.home, os.environ, config.cluster_secret_file)
    except SecretError as exc:
        raise StartupError(str(exc)) from None
    runner_config = await runners_of(config)
    handlers: dict[str, Callable[[str, bytes], Awaitable[bytes]]] = {}

    async def rpc(method: str, body: bytes) -> bytes:
        handler = handlers.get(method)
        if handler is None:
            raise RpcFailed("no_handler", f"unknown method {method[:64]!r}")
        return await handler(method, body)

    async def streams(peer: str, receiver: DataReceiver) -> None:
        if await is_transfer_stream(receiver):
            await weights_client.handle_stream(peer, receiver)
        else:
            await remote.handle_stream(peer, receiver)

    try:
        server_ssl, client_ssl = tls_contexts(config.tls_cert, config.tls_key, config.tls_ca)
        mesh = Mesh(
            node_id,
            secret.secret,
            listen=parse_listen_address(config.listen),
            join=config.join,
            link_config=config.link_config(),
            server_ssl=server_ssl,
            client_ssl=client_ssl,
            rpc_handler=rpc,
            stream_handler=streams,
        )
    except (ValueError, MeshAddressError) as exc:  # TlsConfigError is a ValueError
        raise StartupError(str(exc)) from None
    try:  # opening repairs what a crash left (blocking file I/O)
        store = await trio.to_thread.run_sync(
            partial(ModelStore, config.home / "store", config.store_budget)
        )
    except OSError as exc:
        where = config.home / "store"
        raise StartupError(f"cannot open the model store in {where}: {exc}") from None
    hub = HubAccess(os.environ.get("HF_TOKEN") or None, True if config.offline else None)
    # A node started without --join founds a cluster (if it has no Raft data yet).
    founder = not config.join
    consensus: ConsensusService[State] = ConsensusService(
        node_id,
        mesh,
        config.home / "raft",
        ClusterMachine(),
        founder=founder,
        config=config.raft_config(),
        segment_bytes=config.raft_segment_bytes,
    )
    scheme = "wss" if server_ssl is not None else "ws"
    addresses = {"listen": "", "api": ""}  # known once bound; read by each telemetry sample
    compute: list[ComputePorts] = []  # likewise: this node's compute host and port range
    fetches = FetchBoard()  # weight fetches in progress (and failed), published in the readings
    serving = ServingSampler()  # the runners this node hosts, published in the readings
    transfers = TransferBoard()  # whole models coming here (Hub downloads, spreads)

    def runner_bytes() -> int:
        """Memory this node's live runners use (their last heartbeat's RSS)."""
        total = 0
        for service in list(reconciler.services.values()):
            for runner in service.recent_runners():
                stats = runner.statistics()
                if stats.phase not in ("stopped", "failed") and stats.rss_bytes:
                    total += stats.rss_bytes
        return total

    def sample() -> NodeReadings:
        return sample_readings(
            node_id,
            (addresses["listen"],),
            addresses["api"],
            memory_limit=config.memory_limit,
            runner_bytes=runner_bytes() if config.memory_limit is not None else 0,
            compute=compute[0] if compute else None,
            fetches=fetches.snapshot(),
            serving=serving.sample(
                reconciler.assignments(), reconciler.services, trio.current_time()
            ),
            models_dir=config.home / "models",
            fetch_failures=fetches.failures(now=wall()),
            transfers=transfers.snapshot(),
            store=duties.store_reading(),
        )

    gossip = TelemetryGossip(
        mesh,
        TelemetryStore(node_id, next_epoch(config.home)),
        sample,
        fanout=config.gossip_fanout,
    )
    control = ClusterControl(
        node_id,
        consensus,
        mesh,
        lambda: {n: e.readings for n, e in gossip.store.view.items()},
        card_for=lambda model: local_card(model, config.home, node_id, store),
        hub_token=hub.token,
        offline=bool(hub.offline),
        ensure_model=config.ensured_model(founder=founder),
        config_changes=config.cluster_config_changes(),
    )

    weights_client = WeightClient(mesh)
    weights_server = WeightServer(
        mesh, lambda model: control.state.model(model), config.home, store=store
    )

    async def fetch_spread(
        card: ModelCard, holders: Sequence[str], progress: SpreadProgress
    ) -> StoredModel:
        return await fetch_whole(
            weights_client, card, config.home, store, holders=holders, progress=progress
        )

    duties = ModelDuties(
        node_id,
        control,
        store,
        transfers,
        fetch_spread,
        now_ms,
        hub=hub,
        declined=config.home / "declined-models.json",
    )

    def make_service(a: Assignment) -> ModelService:
        card, shard = a.card, a.shard
        part = ShardSlice(a.sharding, shard.start, shard.end, card.architecture.layers)

        async def resolve() -> Path:
            """The weights this rank needs, here (fetched from a holder if need be); a fetch
            that completed the whole model makes this node one of its holders."""
            completed: list[ModelCard] = []
            directory = await fetches.follow(  # progress, and failures for node health
                a.instance,
                a.rank,
                card.id,
                lambda progress: fetch_model(
                    weights_client,
                    card,
                    part,
                    config.home,
                    progress=progress,
                    store=store,
                    on_complete=completed.append,
                ),
            )
            if completed:
                await duties.hold(completed[0])
            return directory

        spec: ShardSpec | None = None
        if a.sharding != "single":
            connect, collective = config.shard_timeouts()
            hosts = tuple(s.address for s in a.shards)
            spec = ShardSpec(a.sharding, a.rank, hosts, shard.start, shard.end, connect, collective)
        return ModelService(
            card.id,
            resolve,
            runner_config,
            policy=config.restart_policy(),
            cooldown=config.cooldown_policy(),
            stream_interval=config.stream_interval,
            shard=spec,
            group_ready=None if spec is None else partial(reconciler.wait_group, a.instance),
        )

    reconciler = Reconciler(node_id, control, control.submit, make_service, now_ms)
    admission = Admission(config.max_queue)
    remote = RemoteRouting(mesh, reconciler.service, admission, timeouts=config.route_timeouts())
    metrics = NodeMetrics()  # GET /metrics; the app adds the sources it holds
    metrics.set_source("routing", partial(routing_families, remote, admission))
    metrics.set_source("transfer", partial(transfer_families, weights_client, weights_server))
    router = Router(
        node_id,
        lambda: control.state,
        reconciler.service,
        lambda peer: mesh.link(peer) is not None,
        remote,
        admission,
        load=lambda node: e.readings.load_1m if (e := gossip.store.view.get(node)) else 0.0,
        metrics=metrics,
        affinity_slack=config.route_affinity_slack,
        prefix_affinity=config.route_policy == "prefix",
    )

    def local_timeline() -> list[TimelineEvent]:
        """This node's runners' flight-recorder events, for the cluster timeline."""
        assigned = reconciler.assignments()
        events: list[TimelineEvent] = []
        for instance, service in list(reconciler.services.items()):
            rank = assigned[instance].rank if instance in assigned else 0
            events += runner_events(node_id, instance, rank, service.recent_runners())
        for gone, service in list(reconciler.retired):  # re-placed or deleted a moment ago
            events += runner_events(node_id, gone.instance, gone.rank, service.recent_runners())
        return events

    def progress_now() -> list[ProgressItem]:
        """This node's weight fetches and model loads, for the terminal's progress bars."""
        assigned = reconciler.assignments()
        services = [
            (instance, assigned[instance].rank if instance in assigned else 0, s.status())
            for instance, s in list(reconciler.services.items())
        ]
        return progress_items(fetches.snapshot(), services)

    timeline = ClusterTimeline(
        node_id,
        local_timeline,
        lambda: [n.id for n in control.state.nodes],
        mesh.link,
        requests=partial(journal_events, node_id, journal),
    )
    handlers.update(
        {
            SUBMIT_METHOD: consensus.handle_rpc,
            CONTROL_METHOD: control.handle_rpc,
            ROUTE_METHOD: remote.handle_rpc,
            ASK_METHOD: remote.handle_rpc,
            TIMELINE_METHOD: timeline.handle_rpc,
            **dict.fromkeys(TRANSFER_METHODS, weights_server.handle_rpc),
        }
    )
    app = create_app(
        router,
        reconciler,
        control=control,
        cluster=mesh,
        gossip=gossip,
        consensus=consensus,
        timeline=timeline,
        api_keys=api_keys,
        store=store,
    )
    envelope_hypercorn_errors()  # the answers Hypercorn gives without the app: the envelope too
    close_on_client_eof()  # a client's EOF closes its connection, not the keep-alive timeout
    hc = HypercornConfig()
    hc.bind = [_bind(config.host, config.port)]
    hc.graceful_timeout = GRACEFUL_TIMEOUT
    # The app logs each request once on "skulk.access" (skulk.api's RequestGuard); Hypercorn's
    # own access log writes a second "- -" line when a client closes as a response ends.
    hc.accesslog = None
    hc.errorlog = logging.getLogger("skulk.http")
    hc.keep_alive_timeout = 75
    shutdown = trio.Event()
    http_done = trio.Event()

    async def run_http(*, task_status: trio.TaskStatus[list[str]]) -> None:
        try:
            await hypercorn_serve(
                app,
                hc,
                shutdown_trigger=shutdown.wait,
                task_status=task_status,
            )
        finally:
            http_done.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(_watch_signals, shutdown, nursery.cancel_scope)
        nursery.start_soon(show_progress, progress_now)  # bars only when stderr is a TTY
        try:
            host, port = await nursery.start(mesh.run)
        except* OSError as group:  # the mesh's own nursery wraps its listener's error
            why = leaves(group)[0]
            raise StartupError(f"cannot listen for nodes on {config.listen}: {why}") from None
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        compute.append(
            ComputePorts(config.compute_host_for(host), *config.compute_port_range(port))
        )
        print(
            f"skulk: node {node_id} of {secret.describe()}; "
            f"federation listening on {scheme}://{listen}",
            flush=True,
        )
        if secret.source is SecretSource.GENERATED:
            instructions = join_instructions(secret.path, listen, cluster_id=secret.cluster_id)
            if server_ssl is not None:
                instructions = instructions.replace(
                    " --join ws://", " --tls-ca CA_FILE --join wss://"
                )
            print(instructions, flush=True)
        await nursery.start(consensus.run)  # StorageCorrupt: refuses to start (see __main__)
        await nursery.start(remote.run)
        await nursery.start(weights_server.run)
        await nursery.start(reconciler.run)
        await nursery.start(duties.run)
        binds: list[str] = await nursery.start(run_http)
        url = binds[0] if binds else f"http://{config.host}:{config.port}"
        addresses.update(listen=config.advertise or f"{scheme}://{listen}", api=url)
        await nursery.start(gossip.run)
        await nursery.start(control.run)
        ensured = control.ensure_model or "none (capacity only)"
        print(f"skulk: API listening on {url} (model {ensured})", flush=True)
        task_status.started(url)
        await shutdown.wait()
        log.info("shutting down")
        await consensus.step_down(timeout=GRACEFUL_TIMEOUT)
        # Hypercorn returns once open requests finished or its graceful timeout cut them.
        with trio.move_on_after(GRACEFUL_TIMEOUT + 2):
            await http_done.wait()
        nursery.cancel_scope.cancel()
    log.info("stopped")


def _bind(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _watch_signals(shutdown: trio.Event, everything: trio.CancelScope) -> None:
    """First SIGINT/SIGTERM: graceful shutdown. Second: stop at once (still reaping runners)."""
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info("received %s", signal.Signals(signum).name)
            if shutdown.is_set():
                print("skulk: second signal, stopping now", file=sys.stderr, flush=True)
                everything.cancel()
            shutdown.set()
