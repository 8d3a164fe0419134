"""``python -m skulk.bench models``: models from the Hub, and how they spread (issue 22).

Run from the repository root: the local Hub endpoint is the tests' (``tests/hubserver.py``),
started in a subprocess so the client measured does not share its interpreter.

* ``hub_download_ratio``: a generated repo (``--mib``, default 256) pulled by Skulk
  (:func:`skulk.hub.pull` into a fresh :class:`~skulk.store.ModelStore`: check, download,
  verify, commit) against ``hf download`` of the same repo from the same endpoint into a fresh
  cache, ``--rounds`` interleaved rounds (the order alternates); the ratio is the median
  ``hf`` seconds ÷ the median Skulk seconds (1.0: as fast; goal ≥ 0.9).
* ``resume_resent_fraction``: the endpoint cuts the connection at 50 % of the weight file;
  the pull fails, the next one resumes; the bytes the endpoint sent beyond the file's size,
  ÷ the file's size (goal ≤ 0.02).
* ``peer_fetch``: :func:`skulk.bench._transfer.run` (a fetch over one authenticated link ÷ a
  local file copy), so the models report carries it.
* ``fanout`` (``--fanout``): real nodes on loopback, the repo pulled through the last one:
  ``one_fetch_s`` (2 nodes: the card registered → the second node a holder) and
  ``fanout_4_nodes_s`` (4 nodes: the card registered → 4 holders); goal: the quotient ≤ 2.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = "bench/generated"
_HUB_CHILD = """
import sys, time
from pathlib import Path
from tests.hubserver import running_hub, repo_files
directory, port_file, repo = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
with running_hub() as hub:
    hub.add_repo(repo, repo_files(directory))
    port_file.write_text(hub.url)
    while True:
        time.sleep(3600)
"""


@contextmanager
def hub_process(directory: Path, root: Path) -> Iterator[str]:
    """The local Hub endpoint serving ``directory`` as :data:`REPO`, in a subprocess; its URL."""
    url_file = root / "hub-url"
    env = os.environ | {"PYTHONPATH": str(Path.cwd())}
    child = subprocess.Popen(
        [sys.executable, "-c", _HUB_CHILD, str(directory), str(url_file), REPO], env=env
    )
    try:
        deadline = time.monotonic() + 60
        while not url_file.exists() or not url_file.read_text():
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "the local Hub endpoint did not start (run from the repository root: it is "
                    "tests/hubserver.py)"
                )
            time.sleep(0.05)
        yield url_file.read_text()
    finally:
        child.terminate()
        child.wait(10)


def _hub_env(url: str, hf_home: Path) -> dict[str, str]:
    return {
        "HF_ENDPOINT": url,
        "HF_HOME": str(hf_home),
        "HF_HUB_CACHE": str(hf_home / "hub"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    }


_PULL_CHILD = """
import sys, time
from pathlib import Path
from skulk.hub import pull
from skulk.store import ModelStore
store = ModelStore(Path(sys.argv[1]), reserve_bytes=0)
if sys.argv[3] == "warm":  # as a node is after its first check: mlx-lm's tables imported
    import mlx_lm.utils
start = time.perf_counter()
pull(sys.argv[2], store)
print(time.perf_counter() - start)
"""


def _timed_skulk(url: str, root: Path, how: str = "warm") -> float:
    """Seconds :func:`skulk.hub.pull` takes into a fresh store (a fresh process, timed inside).
    ``warm``: mlx-lm imported first, as on a node after its first check (the architecture
    check reads mlx-lm's tables: importing it takes ~1.5 s once per process); ``cold``: not."""
    env = os.environ | _hub_env(url, root / "hf-skulk")
    out = subprocess.run(
        [sys.executable, "-c", _PULL_CHILD, str(root / "store"), REPO, how],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return float(out.stdout.strip().splitlines()[-1])


def _timed_hf(url: str, root: Path) -> float:
    """Seconds ``hf download`` takes (the CLI, timed around the process: its start-up counts,
    as it does for a user; measured alone below as ``hf_startup_s``)."""
    hf = shutil.which("hf") or str(Path(sys.executable).with_name("hf"))
    env = os.environ | _hub_env(url, root / "hf-cli")
    start = time.perf_counter()
    subprocess.run([hf, "download", REPO], env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def _startup(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


def hub_download(mib: int, rounds: int) -> dict[str, Any]:
    """``hub_download_ratio`` (see the module doc)."""
    from skulk.bench._transfer import write_model

    with tempfile.TemporaryDirectory(prefix="skulk-bench-models-") as tmp:
        root = Path(tmp)
        directory = write_model(root / "model", mib)
        size = sum(f.stat().st_size for f in directory.iterdir())
        skulk_s: list[float] = []
        hf_s: list[float] = []
        with hub_process(directory, root) as url:
            for i in range(rounds):
                runs: list[tuple[list[float], Callable[[str, Path], float]]] = [
                    (skulk_s, _timed_skulk),
                    (hf_s, _timed_hf),
                ]
                for times, run in runs if i % 2 == 0 else runs[::-1]:
                    work = root / f"round-{i}-{run.__name__}"
                    work.mkdir()
                    times.append(run(url, work))
                    shutil.rmtree(work)
            cold_dir = root / "cold"
            cold_dir.mkdir()
            cold = _timed_skulk(url, cold_dir, "cold")
        hf = shutil.which("hf") or str(Path(sys.executable).with_name("hf"))
        hf_start = statistics.median(_startup([hf, "version"]) for _ in range(3))
        py_start = statistics.median(_startup([sys.executable, "-c", "pass"]) for _ in range(3))
    skulk_med, hf_med = statistics.median(skulk_s), statistics.median(hf_s)
    return {
        "bytes": size,
        "rounds": rounds,
        "skulk_s": [round(t, 3) for t in skulk_s],
        "hf_download_s": [round(t, 3) for t in hf_s],
        "skulk_cold_s": round(cold, 3),
        "skulk_mb_s": round(size / 1e6 / skulk_med, 1),
        "hf_download_mb_s": round(size / 1e6 / hf_med, 1),
        "hf_startup_s": round(hf_start, 3),
        "python_startup_s": round(py_start, 3),
        "hub_download_ratio": round(hf_med / skulk_med, 3),
        "hub_download_ratio_without_hf_startup": round((hf_med - hf_start) / skulk_med, 3),
    }


def resume(mib: int) -> dict[str, Any]:
    """``resume_resent_fraction`` (see the module doc), with the endpoint in this process (its
    byte counters are read here; nothing is timed)."""
    from skulk.bench._transfer import write_model
    from skulk.hub import HubError, pull
    from skulk.store import ModelStore

    sys.path.insert(0, str(Path.cwd()))
    from tests.hubserver import repo_files, running_hub

    name = "model.safetensors"
    with tempfile.TemporaryDirectory(prefix="skulk-bench-resume-") as tmp:
        root = Path(tmp)
        directory = write_model(root / "model", mib)
        size = (directory / name).stat().st_size
        with running_hub() as hub, _environment(_hub_env(hub.url, root / "hf")):
            hub.add_repo(REPO, repo_files(directory))
            store = ModelStore(root / "store", reserve_bytes=0)
            hub.cut_once(REPO, name, size // 2)
            first_failed = False
            try:
                pull(REPO, store)
            except HubError:
                first_failed = True
            pull(REPO, store)
            sent = hub.served_bytes(REPO, name)
    return {
        "file_bytes": size,
        "cut_at": size // 2,
        "first_pull_failed": first_failed,
        "bytes_sent": sent,
        "resume_resent_fraction": round((sent - size) / size, 5),
    }


@contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run(
    mib: int = 256, rounds: int = 3, *, fanout: bool = False, peer_fetch: bool = True
) -> dict[str, Any]:
    """Every figure of the module doc, in one run."""
    result: dict[str, Any] = {"hub_download": hub_download(mib, rounds)}
    result["resume"] = resume(min(mib, 64))
    if peer_fetch:
        from skulk.bench._transfer import run as run_transfer

        result["peer_fetch"] = run_transfer(mib, rounds)
    if fanout:
        from skulk.bench._models_fanout import run as run_fanout

        result["fanout"] = run_fanout(mib, rounds)
    return result


def table(result: dict[str, Any]) -> str:
    """The result as lines for people."""
    d = result["hub_download"]
    lines = [
        f"Hub download, {d['bytes'] / 2**20:.0f} MiB, {d['rounds']} rounds:",
        f"  skulk pull      {d['skulk_mb_s']:8.1f} MB/s   {d['skulk_s']}"
        f"   (a process's first check, mlx-lm imported: {d['skulk_cold_s']} s)",
        f"  hf download     {d['hf_download_mb_s']:8.1f} MB/s   {d['hf_download_s']}"
        f"   (its start-up alone: {d['hf_startup_s']} s)",
        f"  hub_download_ratio {d['hub_download_ratio']} (goal >= 0.9); without hf's start-up "
        f"{d['hub_download_ratio_without_hf_startup']}",
    ]
    r = result["resume"]
    lines.append(
        f"Resume after a cut at 50 % of {r['file_bytes'] / 2**20:.0f} MiB: "
        f"resume_resent_fraction {r['resume_resent_fraction']} (goal <= 0.02)"
    )
    if "peer_fetch" in result:
        p = result["peer_fetch"]
        lines.append(
            f"Peer fetch {p['fetch_mb_s']} MB/s vs local copy {p['copy_mb_s']} MB/s: "
            f"{p['fetch_vs_copy']} (goal >= 0.3)"
        )
    if "fanout" in result:
        f = result["fanout"]
        lines.append(
            f"Fan-out: one fetch {f['one_fetch_s']} s, 4 nodes {f['fanout_4_nodes_s']} s: "
            f"{f['fanout_ratio']} (goal <= 2)"
        )
    return "\n".join(lines)


def main(args: Any) -> int:
    result = run(args.mib, args.rounds, fanout=args.fanout, peer_fetch=not args.no_peer_fetch)
    print(json.dumps(result, indent=2) if args.json else table(result))
    return 0
