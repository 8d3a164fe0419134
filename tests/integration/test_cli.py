"""The command line, as a user runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "skulk", *args], capture_output=True, text=True, timeout=120
    )


def test_demo_model_command_writes_a_loadable_model(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = run("demo-model", "--out", str(out), "--seed", "5")
    assert result.returncode == 0, result.stderr
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    again = tmp_path / "again"
    assert run("demo-model", "--out", str(again), "--seed", "5").returncode == 0
    assert (out / "model.safetensors").read_bytes() == (again / "model.safetensors").read_bytes()


def test_serve_refuses_an_unknown_model_at_once(tmp_path: Path) -> None:
    result = run("serve", "--model", "no-such-model", "--home", str(tmp_path))
    assert result.returncode == 2
    assert "no-such-model" in result.stderr and "available" in result.stderr


def test_serve_refuses_a_bad_port(tmp_path: Path) -> None:
    result = run("serve", "--port", "eighty", "--home", str(tmp_path))
    assert result.returncode == 2
    assert "--port" in result.stderr


def test_serve_says_why_it_cannot_listen_for_nodes(tmp_path: Path) -> None:
    """A federation port already taken: one line naming the address, no traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listen = f"127.0.0.1:{port}"
        result = run("serve", "--home", str(tmp_path), "--port", "0", "--listen", listen)
    assert result.returncode == 2, result.stderr
    assert f"cannot start: cannot listen for nodes on {listen}" in result.stderr
    assert "Address already in use" in result.stderr and "Traceback" not in result.stderr


def test_serve_refuses_damaged_raft_storage_naming_the_file(tmp_path: Path) -> None:
    from skulk.consensus import (
        ConfState,
        Entry,
        EntryKind,
        HardState,
        OsDisk,
        Snapshot,
        SnapshotMeta,
        Storage,
    )

    raft = tmp_path / "raft"
    storage, _ = Storage.open(OsDisk(raft))
    storage.persist(snapshot=Snapshot(SnapshotMeta(0, 0, ConfState(("n1",))), b""))
    for i in range(1, 6):
        entry = Entry(i, 1, EntryKind.COMMAND, b"x" * 64)
        storage.persist(entries=(entry,), hard_state=HardState(1, "n1", i))
    segment = next(p for p in sorted(raft.iterdir()) if p.name.endswith(".seg"))
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0x01  # a bit flip well before the tail: not a torn write
    segment.write_bytes(bytes(data))

    result = run("serve", "--home", str(tmp_path), "--port", "0", "--listen", "127.0.0.1:0")
    assert result.returncode == 2, result.stderr
    assert "cannot start" in result.stderr and segment.name in result.stderr
    assert "corrupt" in result.stderr


def test_a_running_node_writes_its_stacks_on_sigusr1_and_goes_on(tmp_path: Path) -> None:
    import os
    import signal
    import time

    from skulk.harness import NodeProcess

    node = NodeProcess(tmp_path, "--model", "none").start(wait_ready=False)
    try:
        assert node.proc is not None
        os.kill(node.proc.pid, signal.SIGUSR1)
        deadline = time.monotonic() + 30
        while "most recent call first" not in node.log() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "most recent call first" in node.log() and "trio" in node.log()
        assert node.proc.poll() is None  # it goes on: alive, and answering
        assert node.get("/health").status_code in (200, 503)
    finally:
        node.stop()
