"""Fetching weights from a peer vs copying the same bytes locally (``python -m skulk.bench
transfer``; ``python -m skulk.bench distributed`` calls :func:`run` too).

A holder node and a fetching node, each a :class:`~skulk.federation.Mesh` over one loopback
link; the holder runs in a subprocess of its own (``python -m skulk.bench._transfer``), as it
would on another machine, so the two ends do not share one Python thread. The model is one
safetensors file of ``mib`` MiB in 64 tensors (random bytes) plus a ``config.json``; each
round fetches every tensor into a fresh data dir (:func:`~skulk.transfer.fetch_model`: rpc,
credit-controlled chunks (1 MiB by default), sha256 of every tensor, fsync, the record), and
copies the same file with ``shutil.copyfile`` (and once more followed by an fsync, which the
fetch does too), and once more in Python as the fetch handles the bytes it receives (1 MiB
reads, sha256 of every tensor, writes at their offsets, fsync: a *verified copy*, the cost of
the verification alone with no link). Rounds are interleaved; medians are reported, with the
ratios fetch ÷ copy, and the fetching process's CPU seconds during a fetch (all its threads).

By default the fetcher dials the holder, so the holder is the WebSocket server and its data
frames go unmasked; ``--holder-dials`` turns the link around (the fetcher listens, the holder
joins it), so every data frame is masked by the holder and unmasked by the fetcher, as on the
half of a cluster's links whose holder dialed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import attrs
import numpy as np
import trio

from skulk.federation import ClusterSecret, DataReceiver, Mesh, RpcFailed
from skulk.models import ShardSlice, card_from_directory, local_manifest
from skulk.transfer import (
    CHUNK_SIZE,
    TRANSFER_METHODS,
    FetchPolicy,
    WeightClient,
    WeightServer,
    fetch_model,
)
from skulk.wire.cluster import ModelCard, PathSource

_SECRET = ClusterSecret(bytes(range(32)))
_TENSORS = 64
_HOLDER = "bench-holder"
_FETCHER = "bench-fetcher"


def write_model(directory: Path, mib: int, seed: int = 0) -> Path:
    """A directory with ``model.safetensors`` (``mib`` MiB of float32 in 64 tensors, random
    bytes) and a minimal ``config.json``."""
    import mlx.core as mx

    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    per = max(1, mib * 1024 * 1024 // 4 // _TENSORS)
    tensors = {
        f"model.layers.{i}.weight": mx.array(rng.standard_normal(per, dtype=np.float32))
        for i in range(_TENSORS)
    }
    mx.save_safetensors(str(directory / "model.safetensors"), tensors, metadata={"format": "mlx"})
    config = {
        "model_type": "llama",
        "num_hidden_layers": _TENSORS,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "vocab_size": 1024,
    }
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _card(directory: Path, home: Path) -> ModelCard:
    manifest = local_manifest(directory, home)
    return card_from_directory(
        "bench-weights",
        directory,
        PathSource(str(directory)),
        manifest_sha256=manifest.sha256,
        holders=(_HOLDER,),
    )


async def _holder(
    directory: Path, home: Path, port_file: Path, chunk: int, dial: bool = False
) -> None:
    """Serve ``directory``; listen (writing the port to ``port_file``), or with ``dial`` wait
    for the fetcher's port in ``port_file`` and join it."""
    card = _card(directory, home)
    server: WeightServer | None = None

    async def rpc(method: str, body: bytes) -> bytes:
        if server is None or method not in TRANSFER_METHODS:
            raise RpcFailed("no_handler", method)
        return await server.handle_rpc(method, body)

    join: list[str] = []
    if dial:
        text = ""
        with trio.fail_after(60):
            while not text:  # another process writes the file: poll it
                await trio.sleep(0.05)
                if await trio.Path(port_file).exists():
                    text = await trio.Path(port_file).read_text()
        join = [f"ws://127.0.0.1:{text}"]
    mesh = Mesh(_HOLDER, _SECRET, listen=("127.0.0.1", 0), join=join, rpc_handler=rpc)
    server = WeightServer(mesh, lambda m: card if m == card.id else None, home, chunk_size=chunk)
    async with trio.open_nursery() as nursery:
        _host, port = await nursery.start(mesh.run)
        await nursery.start(server.run)
        if not dial:
            await trio.Path(port_file).write_text(str(port))
        await trio.sleep_forever()


async def _fetch_rounds(
    url: str | Path,
    card: ModelCard,
    source: Path,
    homes: list[Path],
    copy: Path,
    fsync_copy: Path,
    policy: FetchPolicy,
) -> list[tuple[float, float, float, float, float]]:
    client: WeightClient | None = None

    async def streams(peer: str, receiver: DataReceiver) -> None:
        assert client is not None
        await client.handle_stream(peer, receiver)

    join = [url] if isinstance(url, str) else []  # a Path: the file to write our port to
    mesh = Mesh(_FETCHER, _SECRET, listen=("127.0.0.1", 0), join=join, stream_handler=streams)
    client = WeightClient(mesh)
    remote = attrs.evolve(card, source=PathSource("/nonexistent/bench-weights"))
    shard = ShardSlice("single", 0, _TENSORS, _TENSORS)
    results: list[tuple[float, float, float, float, float]] = []
    async with trio.open_nursery() as nursery:
        _host, port = await nursery.start(mesh.run)
        if isinstance(url, Path):
            await trio.Path(url).write_text(str(port))
        with trio.fail_after(30):
            while mesh.link(_HOLDER) is None:  # noqa: ASYNC110 - polling with a deadline
                await trio.sleep(0.01)
        for home in homes:
            copied, copied_fsync = await trio.to_thread.run_sync(_copies, source, copy, fsync_copy)
            await trio.to_thread.run_sync(_clean_files, copy, fsync_copy)
            verified = await trio.to_thread.run_sync(_verified_copy, source, copy)
            start, cpu = time.perf_counter(), time.process_time()
            await fetch_model(client, remote, shard, home, policy=policy)
            fetched = time.perf_counter() - start
            cpu = time.process_time() - cpu
            results.append((fetched, copied, copied_fsync, verified, cpu))
            await trio.to_thread.run_sync(_clean, home, copy, fsync_copy)
        nursery.cancel_scope.cancel()
    return results


def _copies(source: Path, copy: Path, fsync_copy: Path) -> tuple[float, float]:
    """Seconds to copy ``source`` with ``shutil.copyfile``, and to copy it and fsync."""
    start = time.perf_counter()
    shutil.copyfile(source, copy)
    copied = time.perf_counter() - start
    start = time.perf_counter()
    shutil.copyfile(source, fsync_copy)
    with open(fsync_copy, "rb+") as f:
        os.fsync(f.fileno())
    return copied, time.perf_counter() - start


def _verified_copy(source: Path, copy: Path, chunk: int = 1 << 20) -> float:
    """Seconds to copy ``source`` as a fetch writes what it receives: ``chunk``-sized
    reads, the sha256 of each of the 64 tensor-sized pieces, writes at their offsets, fsync.
    The floor of a verified fetch on this machine, with no link."""
    size = source.stat().st_size
    piece = max(1, size // _TENSORS)
    start = time.perf_counter()
    with open(source, "rb") as src, open(copy, "wb") as dst:
        hasher, in_piece, at = hashlib.sha256(), 0, 0
        while data := src.read(chunk):
            view = memoryview(data)
            while view:
                take = view[: piece - in_piece]
                os.pwrite(dst.fileno(), take, at)
                hasher.update(take)
                at, in_piece, view = at + len(take), in_piece + len(take), view[len(take) :]
                if in_piece == piece:
                    hasher.digest()
                    hasher, in_piece = hashlib.sha256(), 0
        hasher.digest()
        os.fsync(dst.fileno())
    return time.perf_counter() - start


def _clean_files(*files: Path) -> None:
    for f in files:
        f.unlink(missing_ok=True)


def _clean(home: Path, *files: Path) -> None:
    shutil.rmtree(home)
    _clean_files(*files)


def run(
    mib: int = 256,
    rounds: int = 3,
    chunk_kib: int = CHUNK_SIZE // 1024,
    policy: FetchPolicy = FetchPolicy(),  # noqa: B008 - frozen
    holder_dials: bool = False,
) -> dict[str, object]:
    """Fetch ``mib`` MiB of tensors over one loopback link vs ``shutil.copyfile`` of the same
    bytes, ``rounds`` interleaved rounds; medians and ratios (``fetch_vs_copy`` is fetch MB/s
    ÷ copy MB/s: 1.0 would be as fast as a local copy). ``chunk_kib``: the holder's chunk size;
    ``holder_dials``: the holder is the link's WebSocket client (its frames masked)."""
    with tempfile.TemporaryDirectory(prefix="skulk-bench-transfer-") as tmp:
        root = Path(tmp)
        directory = write_model(root / "model", mib)
        card = _card(directory, root / "holder-home")
        size = sum((directory / n).stat().st_size for n in ("model.safetensors", "config.json"))
        port_file = root / "port"
        holder = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "skulk.bench._transfer",
                str(directory),
                str(root / "holder-home"),
                str(port_file),
                str(chunk_kib * 1024),
                *(["--dial"] if holder_dials else []),
            ],
        )
        try:
            url: str | Path = port_file  # the holder dials: the fetcher writes its port there
            deadline = time.monotonic() + 60
            while not holder_dials and (not port_file.exists() or not port_file.read_text()):
                if holder.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the holder process did not start")
                time.sleep(0.05)
            if not holder_dials:
                url = f"ws://127.0.0.1:{port_file.read_text()}"
            homes = [root / f"fetch-{i}" for i in range(rounds)]
            results = trio.run(
                _fetch_rounds,
                url,
                card,
                directory / "model.safetensors",
                homes,
                root / "copy",
                root / "copy-fsync",
                policy,
            )
        finally:
            holder.terminate()
            holder.wait(10)
    mb = size / 1e6
    fetch = statistics.median(mb / r[0] for r in results)
    copy = statistics.median(mb / r[1] for r in results)
    copy_fsync = statistics.median(mb / r[2] for r in results)
    verified = statistics.median(mb / r[3] for r in results)
    return {
        "bytes": size,
        "chunk_bytes": chunk_kib * 1024,
        "streams_per_holder": policy.streams_per_holder,
        "batch_bytes": policy.batch_bytes,
        "holder_dials": holder_dials,
        "rounds": rounds,
        "fetch_mb_s": round(fetch, 1),
        "copy_mb_s": round(copy, 1),
        "copy_fsync_mb_s": round(copy_fsync, 1),
        "fetch_vs_copy": round(fetch / copy, 3),
        "fetch_vs_copy_fsync": round(fetch / copy_fsync, 3),
        "verified_copy_mb_s": round(verified, 1),
        "fetch_vs_verified_copy": round(fetch / verified, 3),
        "fetch_cpu_s": round(statistics.median(r[4] for r in results), 3),
        "fetch_s": [round(r[0], 3) for r in results],
        "copy_s": [round(r[1], 3) for r in results],
    }


def main(args: argparse.Namespace) -> int:
    """``python -m skulk.bench transfer``: :func:`run` with the command line's settings."""
    defaults = FetchPolicy()
    policy = attrs.evolve(
        defaults,
        streams_per_holder=args.streams or defaults.streams_per_holder,
        batch_bytes=(args.batch_mib << 20) if args.batch_mib else defaults.batch_bytes,
    )
    chunk_kib = args.chunk_kib or CHUNK_SIZE // 1024
    result = run(args.mib, args.rounds, chunk_kib, policy, holder_dials=args.holder_dials)
    print(json.dumps(result, indent=None if args.json else 2))
    return 0


def _main(argv: list[str] | None = None) -> int:
    """The holder process: ``python -m skulk.bench._transfer DIR HOME PORT_FILE CHUNK``."""
    parser = argparse.ArgumentParser(prog="python -m skulk.bench._transfer")
    parser.add_argument("directory", type=Path)
    parser.add_argument("home", type=Path)
    parser.add_argument("port_file", type=Path)
    parser.add_argument("chunk", type=int)
    parser.add_argument("--dial", action="store_true", help="join the fetcher (PORT_FILE)")
    args = parser.parse_args(argv)
    try:
        trio.run(_holder, args.directory, args.home, args.port_file, args.chunk, args.dial)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(_main())
