"""``python -m skulk serve``: one node — its model service and its HTTP API — in one Trio tree.

    root nursery
    ├── signal watcher   SIGINT/SIGTERM → graceful shutdown
    ├── Mesh             federation: listener, dialers, one authenticated link per peer
    ├── Consensus        Raft over the mesh (durable log in $SKULK_HOME/raft), leader duties
    ├── TelemetryGossip  this node's readings, last-writer-wins gossip over the mesh
    ├── ModelService     resolves the model, keeps its runner up
    └── Hypercorn        the Quart-Trio API (trio worker)

Shutdown: hand Raft leadership over if this node leads, stop accepting, give open streams
``GRACEFUL_TIMEOUT`` seconds, then cancel everything; the model service's cancellation
terminates and reaps the runner's process group.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from skulk.api import create_app, envelope_hypercorn_errors
from skulk.config import ServeConfig
from skulk.consensus import ConsensusService
from skulk.federation import (
    Mesh,
    MeshAddressError,
    SecretError,
    SecretSource,
    TelemetryGossip,
    TelemetryStore,
    join_instructions,
    load_or_create_secret,
    next_epoch,
    parse_listen_address,
    sample_readings,
    tls_contexts,
)
from skulk.identity import load_or_create_node_id
from skulk.models import resolve_model
from skulk.worker import ModelService

log = logging.getLogger("skulk")


class StartupError(Exception):
    """The node cannot start (bad secret, address in use): printed without a traceback."""


GRACEFUL_TIMEOUT = 3.0


async def serve(
    config: ServeConfig, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
) -> None:
    """Run a node until SIGINT/SIGTERM (or cancellation); ``task_status`` gets the API URL."""
    model_id, resolve = _resolver(config)
    if config.runner_faults:
        log.warning(
            "runner fault hooks are ON (%s): this node is for testing only", config.runner_faults
        )
    service = ModelService(
        model_id,
        resolve,
        config.runner_config(),
        policy=config.restart_policy(),
        cooldown=config.cooldown_policy(),
        stream_interval=config.stream_interval,
    )
    node_id = load_or_create_node_id(config.home)
    try:
        secret = load_or_create_secret(config.home, os.environ, config.cluster_secret_file)
    except SecretError as exc:
        raise StartupError(str(exc)) from None
    consensus: ConsensusService | None = None

    async def rpc(method: str, body: bytes) -> bytes:
        assert consensus is not None  # set below, before the mesh runs
        return await consensus.handle_rpc(method, body)

    try:
        server_ssl, client_ssl = tls_contexts(config.tls_cert, config.tls_key, config.tls_ca)
        mesh = Mesh(
            node_id,
            secret.secret,
            listen=parse_listen_address(config.listen),
            join=config.join,
            server_ssl=server_ssl,
            client_ssl=client_ssl,
            rpc_handler=rpc,
        )
    except (ValueError, MeshAddressError) as exc:  # TlsConfigError is a ValueError
        raise StartupError(str(exc)) from None
    # A node started without --join founds a cluster (if it has no Raft data yet).
    consensus = ConsensusService(node_id, mesh, config.home / "raft", founder=not config.join)
    scheme = "wss" if server_ssl is not None else "ws"
    addresses = {"listen": "", "api": ""}  # known once bound; read by each telemetry sample
    gossip = TelemetryGossip(
        mesh,
        TelemetryStore(node_id, next_epoch(config.home)),
        lambda: sample_readings(node_id, (addresses["listen"],), addresses["api"]),
    )
    app = create_app(service, mesh, gossip, consensus)
    envelope_hypercorn_errors()  # the answers Hypercorn gives without the app: the envelope too
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
        try:
            host, port = await nursery.start(mesh.run)
        except OSError as exc:
            raise StartupError(f"cannot listen for nodes on {config.listen}: {exc}") from None
        listen = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
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
        nursery.start_soon(service.run)
        binds: list[str] = await nursery.start(run_http)
        url = binds[0] if binds else f"http://{config.host}:{config.port}"
        addresses.update(listen=f"{scheme}://{listen}", api=url)
        await nursery.start(gossip.run)
        print(f"skulk: API listening on {url} (model {model_id})", flush=True)
        task_status.started(url)
        await shutdown.wait()
        log.info("shutting down")
        await consensus.step_down(timeout=GRACEFUL_TIMEOUT)
        # Hypercorn returns once open requests finished or its graceful timeout cut them.
        with trio.move_on_after(GRACEFUL_TIMEOUT + 2):
            await http_done.wait()
        nursery.cancel_scope.cancel()
    log.info("stopped")


def _resolver(config: ServeConfig) -> tuple[str, Callable[[], Path]]:
    """The model's id now, and a function (slow: may generate the demo model) for its path."""
    model, home = config.model, config.home
    model_id = Path(model).name if Path(model).is_dir() else model

    def resolve() -> Path:
        return resolve_model(model, home)[1]

    return model_id, resolve


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
