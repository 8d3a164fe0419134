"""One replica of the Raft benchmark (``python -m skulk.bench._raftnode ...``), either system.

``--system skulk``: a :class:`~skulk.consensus.RaftDriver` over the federation
:class:`~skulk.federation.Mesh` (authenticated WebSockets on loopback; the cluster secret comes
from ``SKULK_CLUSTER_SECRET``) with storage on ``--dir`` (fsync on).
``--system pysyncobj``: a pysyncobj ``SyncObj`` with its journal in ``--dir``, patched to fsync
it before it acknowledges or replicates entries (pysyncobj itself never syncs; see
:func:`_pysyncobj_fsync`), so that both sides pay for durability (``--no-fsync``: as shipped).
A replica exits by itself when the process that started it goes away.

Both replicate the same counter with the same exactly-once sessions, and both answer the same
control protocol on ``127.0.0.1:--control``: newline-delimited JSON, one request at a time per
connection::

    {"op": "submit", "client": "c1", "seq": 1, "timeout": 1.0}
        -> {"ok": true, "result": "42"}  |  {"ok": false, "error": "NoQuorum"}
    {"op": "status"} -> {"id": "n1", "leader": "n2" | null, "commit": 17, ...}

(``commit`` is the last applied index; skulk replicas add their driver statistics.)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import attrs
import trio

Json = dict[str, Any]
Submit = Callable[[str, int, float], Awaitable[Json]]
MAX_LINE = 64 * 1024


async def read_json(stream: trio.SocketStream, buffer: bytearray) -> Json | None:
    """The next JSON line from ``stream`` (``None`` at EOF); ``buffer`` keeps what follows."""
    while b"\n" not in buffer:
        if len(buffer) > MAX_LINE:
            raise ValueError("control line too long")
        chunk = await stream.receive_some(65536)
        if not chunk:
            return None
        buffer += chunk
    line, _, rest = bytes(buffer).partition(b"\n")
    buffer[:] = rest
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError("a control message is a JSON object")
    return value


async def write_json(stream: trio.SocketStream, value: Json) -> None:
    await stream.send_all(json.dumps(value).encode() + b"\n")


async def serve_control(port: int, submit: Submit, status: Callable[[], Json]) -> None:
    async def connection(stream: trio.SocketStream) -> None:
        buffer = bytearray()
        try:
            while (request := await read_json(stream, buffer)) is not None:
                if request.get("op") == "submit":
                    reply = await submit(
                        str(request["client"]), int(request["seq"]), float(request["timeout"])
                    )
                else:
                    reply = status()
                await write_json(stream, reply)
        except (trio.BrokenResourceError, ValueError, KeyError):
            pass

    await trio.serve_tcp(connection, port, host="127.0.0.1")


# --- skulk ---------------------------------------------------------------------------------


async def run_skulk(args: argparse.Namespace, nodes: dict[str, tuple[str, int]]) -> None:
    from skulk.consensus import (
        ConsensusError,
        DriverConfig,
        MeshTransport,
        OsDisk,
        RaftConfig,
        RaftDriver,
        Storage,
    )
    from skulk.consensus._machine import Counter  # a test machine the face does not export
    from skulk.federation import ClusterSecret, Mesh

    secret = ClusterSecret(bytes.fromhex(os.environ["SKULK_CLUSTER_SECRET"]))
    transport: MeshTransport | None = None

    async def rpc(method: str, body: bytes) -> bytes:
        assert transport is not None
        return await transport.handle_rpc(method, body)

    me = args.id
    join = [f"ws://{h}:{p}" for n, (h, p) in nodes.items() if n != me]
    mesh = Mesh(me, secret, listen=nodes[me], join=join, rpc_handler=rpc)
    transport = MeshTransport(mesh)
    directory = Path(args.dir)
    config = DriverConfig(
        tick_seconds=args.tick, raft=RaftConfig(election_ticks=args.election_ticks)
    )
    driver = RaftDriver(
        me,
        voters=tuple(nodes),
        machine=Counter(),
        open_storage=lambda: Storage.open(OsDisk(directory)),
        transport=transport,
        config=config,
    )

    async def submit(client: str, seq: int, budget: float) -> Json:
        try:
            result = await driver.submit(b"incr", client_id=client, seq=seq, timeout=budget)
        except ConsensusError as exc:
            return {"ok": False, "error": type(exc).__name__}
        return {"ok": True, "result": result.decode()}

    def status() -> Json:
        stats = driver.statistics()
        details = {k: v for k, v in attrs.asdict(stats).items() if not isinstance(v, dict)}
        return {"id": me, "leader": stats.leader, "commit": stats.applied, "driver": details}

    async with trio.open_nursery() as nursery:
        await nursery.start(mesh.run)
        await nursery.start(transport.run)
        await nursery.start(driver.run)
        nursery.start_soon(serve_control, args.control, submit, status)


# --- pysyncobj -----------------------------------------------------------------------------


def _pysyncobj_fsync() -> None:
    """Make pysyncobj durable the way Raft needs: its journal (an mmap'd file it never syncs)
    is synced before a follower acknowledges appended entries and before a leader sends
    entries, once per batch, and its term/vote file is synced before it is renamed."""
    from pysyncobj import journal, syncobj

    original_add = journal.FileJournal.add

    def add(self: Any, *args: Any) -> None:
        original_add(self, *args)
        self._bench_dirty = True

    def sync(log: Any) -> None:
        if getattr(log, "_bench_dirty", False):
            log._bench_dirty = False
            log.flush()  # msync of the mapping
            os.fsync(log._FileJournal__journalFile._ResizableFile__f.fileno())

    send_next = syncobj.SyncObj._SyncObj__sendNextNodeIdx
    send_append = syncobj.SyncObj._SyncObj__sendAppendEntries

    def send_next_synced(self: Any, *args: Any, **kwargs: Any) -> None:
        sync(self._SyncObj__raftLog)
        send_next(self, *args, **kwargs)

    def send_append_synced(self: Any) -> None:
        sync(self._SyncObj__raftLog)
        send_append(self)

    def store_meta(self: Any, meta: Any) -> None:
        path = self._MetaStorer__path
        with open(path + ".tmp", "wb") as f:
            f.write(journal.dumps(meta))
            f.flush()
            os.fsync(f.fileno())
        os.replace(path + ".tmp", path)

    journal.FileJournal.add = add
    journal.MetaStorer.storeMeta = store_meta
    syncobj.SyncObj._SyncObj__sendNextNodeIdx = send_next_synced
    syncobj.SyncObj._SyncObj__sendAppendEntries = send_append_synced


async def run_pysyncobj(args: argparse.Namespace, nodes: dict[str, tuple[str, int]]) -> None:
    from pysyncobj import SyncObj, SyncObjConf, replicated

    if args.fsync:
        _pysyncobj_fsync()

    class Counter(SyncObj):  # type: ignore[misc]
        def __init__(self, me: str, others: list[str], conf: Any) -> None:
            super().__init__(me, others, conf)
            self._value = 0
            self._sessions: dict[str, tuple[int, int]] = {}

        @replicated  # type: ignore[untyped-decorator]
        def incr(self, client: str, seq: int) -> int:
            last = self._sessions.get(client)
            if last is not None and seq <= last[0]:
                return last[1]
            self._value += 1
            self._sessions[client] = (seq, self._value)
            return self._value

    address = {f"{h}:{p}": n for n, (h, p) in nodes.items()}
    directory = Path(args.dir)
    timeout = args.tick * args.election_ticks
    conf = SyncObjConf(
        journalFile=str(directory / "journal"),
        fullDumpFile=str(directory / "dump"),
        raftMinTimeout=timeout,
        raftMaxTimeout=2 * timeout,
        appendEntriesPeriod=min(0.1, timeout / 4),
        connectionTimeout=max(3.5, 2 * timeout),
    )
    me = "{}:{}".format(*nodes[args.id])
    counter = Counter(me, [a for a in address if a != me], conf)
    token = trio.lowlevel.current_trio_token()

    async def submit(client: str, seq: int, budget: float) -> Json:
        done = trio.Event()
        outcome: list[Json] = []

        def finish(result: Any, error: Any) -> None:  # on pysyncobj's thread
            def deliver() -> None:
                if error == 0:
                    outcome.append({"ok": True, "result": str(result)})
                else:
                    outcome.append({"ok": False, "error": f"pysyncobj_{error}"})
                done.set()

            token.run_sync_soon(deliver)

        counter.incr(client, seq, callback=finish)
        with trio.move_on_after(budget):
            await done.wait()
        return outcome[0] if outcome else {"ok": False, "error": "SubmitTimeout"}

    def status() -> Json:
        leader = counter._getLeader()
        name = address.get(str(leader.address)) if leader is not None else None
        return {"id": args.id, "leader": name, "commit": counter.raftLastApplied}

    await serve_control(args.control, submit, status)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m skulk.bench._raftnode")
    parser.add_argument("--system", choices=("skulk", "pysyncobj"), required=True)
    parser.add_argument("--id", required=True)
    parser.add_argument("--nodes", required=True, help="n1=HOST:PORT,n2=HOST:PORT,...")
    parser.add_argument("--control", type=int, required=True)
    parser.add_argument("--dir", required=True)
    parser.add_argument("--tick", type=float, default=0.05)
    parser.add_argument("--election-ticks", type=int, default=10)
    parser.add_argument("--no-fsync", dest="fsync", action="store_false")
    args = parser.parse_args(argv)
    nodes = {}
    for item in args.nodes.split(","):
        name, _, address = item.partition("=")
        host, _, port = address.rpartition(":")
        nodes[name] = (host, int(port))
    Path(args.dir).mkdir(parents=True, exist_ok=True)
    run = run_skulk if args.system == "skulk" else run_pysyncobj
    threading.current_thread().name = f"raftnode-{args.id}"

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_orphan_watch)
            await run(args, nodes)

    try:
        trio.run(main)
    except KeyboardInterrupt:
        pass
    return 0


async def _orphan_watch() -> None:
    """Exit at once when the benchmark that started this replica is gone (kill -9 included):
    a replica runs in its own session, so nothing else would stop it."""
    parent = os.getppid()
    while True:
        await trio.sleep(0.2)
        if os.getppid() != parent:
            os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
