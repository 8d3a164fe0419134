"""The servers ``bench load`` drives: a Skulk node of its own (:func:`serving_node`) and
``python -m mlx_lm server`` (:class:`MlxLmServer`), both on loopback, and which optional flags
this build's node has (:func:`node_flags`)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import attrs
import httpx

from skulk.harness import NodeProcess

#: mlx_lm.server's own defaults (0.32.2), passed explicitly so the record says what ran.
MLX_DECODE_CONCURRENCY = 32
MLX_PROMPT_CONCURRENCY = 8
START_DEADLINE = 180.0


@attrs.frozen
class Server:
    """Where to send requests: a base URL and the ``model`` field it expects; ``pid``: the
    server's process (``None``: not known)."""

    name: str
    url: str
    model: str
    pid: int | None = None


class MlxLmServer:
    """``python -m mlx_lm server`` on a free loopback port, output drained into a tail; stopped
    with SIGTERM, then SIGKILL of its process group. ``env``: its environment (default: this
    process's), e.g. with OpenBLAS preloaded as a runner's (``skulk.runner.preload_env``)."""

    def __init__(self, model_dir: Path, env: dict[str, str] | None = None) -> None:
        self.model_dir = model_dir
        self.env = dict(os.environ) if env is None else env
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.output: deque[str] = deque(maxlen=200)

    def __enter__(self) -> MlxLmServer:
        port = _free_port()
        cmd = [sys.executable, "-m", "mlx_lm", "server", "--model", str(self.model_dir),
               "--host", "127.0.0.1", "--port", str(port), "--log-level", "WARNING",
               "--decode-concurrency", str(MLX_DECODE_CONCURRENCY),
               "--prompt-concurrency", str(MLX_PROMPT_CONCURRENCY)]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**self.env, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + START_DEADLINE
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError("mlx_lm.server exited:\n" + "\n".join(self.output))
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            time.sleep(0.1)
        self.__exit__()
        raise RuntimeError("mlx_lm.server never answered /health:\n" + "\n".join(self.output))

    def _pump(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            self.output.append(line.rstrip())

    def __exit__(self, *exc: object) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def node_flags() -> str:
    """``python -m skulk serve --help``: which optional flags this build has."""
    done = subprocess.run(
        [sys.executable, "-m", "skulk", "serve", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return done.stdout


@contextlib.contextmanager
def serving_node(root: Path, models: Path, name: str, model: str, *args: str) -> Iterator[Server]:
    """A node of its own (its own home and cluster) serving ``model`` from the shared models."""
    home = root / name
    home.mkdir()
    (home / "models").symlink_to(models)
    with NodeProcess(home, "--log-level", "warning", "--model", model, *args) as node:
        assert node.proc is not None
        server = Server(name, node.url, Path(model).name, node.proc.pid)
        _wait_serving(server)
        yield server


def _wait_serving(server: Server) -> None:
    """Until one tiny request is answered (the node's runner may still be loading)."""
    body = {"model": server.model, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 1}  # fmt: skip
    end = time.monotonic() + START_DEADLINE
    while time.monotonic() < end:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).is_success:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{server.name} never answered a request")
