"""``bench load --modes blas``: what ``--cpu-blas openblas`` buys a serving node under load, and
where it leaves Skulk against ``mlx_lm.server`` given the same BLAS (see :mod:`skulk.bench._load`).

Three servers on the same model take turns round by round (the order rotates by one each
round), each round a burst of ``level`` streams, measured as the ``throughput`` mode measures
(:func:`~skulk.bench._load_modes.rounds`):

* ``skulk-openblas`` — a node started with ``--cpu-blas openblas``;
* ``skulk`` — the node with the reference BLAS (the default);
* ``mlx_lm_server_openblas`` — ``mlx_lm.server`` started with the environment a runner gets
  (:func:`skulk.runner.preload_env`: the same OpenBLAS copy first in ``LD_PRELOAD``, and
  ``OPENBLAS_NUM_THREADS``).

Reported per level: tokens/s and TTFT per server, ``openblas_vs_reference`` (Skulk-openblas ÷
Skulk, output tokens/s) and ``openblas_vs_mlx_lm_server`` (Skulk-openblas ÷ mlx_lm.server with
OpenBLAS), each the median of per-round ratios. ``preloaded`` says, per server, whether the
library is mapped in its process or a descendant (a node's runners) — read from
``/proc/PID/maps``, so a preload that silently did not take shows as ``false``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from skulk.bench._load_client import http_client
from skulk.bench._load_modes import Settings, measured, ratios, rounds, side, warm_up
from skulk.bench._load_servers import Server

FAST, REFERENCE, THEIRS = "skulk-openblas", "skulk", "mlx_lm_server_openblas"
CPU_BLAS_FLAG = "--cpu-blas"


async def blas(servers: tuple[Server, Server, Server], settings: Settings) -> dict[str, object]:
    """Skulk-openblas (``servers[0]``) vs Skulk (``servers[1]``) vs mlx_lm.server with
    OpenBLAS (``servers[2]``), level by level (module doc)."""
    fast, reference, theirs = (s.name for s in servers)
    figures: dict[str, object] = {}
    async with http_client(max(settings.levels)) as client:
        await warm_up(client, servers, max(settings.levels))
        for level in settings.levels:
            rates, streams = await rounds(client, servers, level, settings)
            entry: dict[str, object] = {
                "openblas_vs_reference": ratios(rates, fast, reference),
                "openblas_vs_mlx_lm_server": ratios(rates, fast, theirs),
            }
            for s in servers:
                entry[s.name] = side(rates[s.name], streams[s.name])
            entry["full_length"] = all(
                t.tokens == settings.max_tokens for s in servers for t in streams[s.name]
            )
            figures[str(level)] = entry
            print(f"load: blas, {level} streams: {json.dumps(entry)}", file=sys.stderr)
    return figures


def descendants(pid: int, parents: Mapping[int, int]) -> set[int]:
    """``pid`` and every process below it, given each process's parent (``parents``)."""
    found, frontier = {pid}, [pid]
    while frontier:
        parent = frontier.pop()
        for child, of in parents.items():
            if of == parent and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def maps_library(maps: str, name: str) -> bool:
    """Whether a ``/proc/PID/maps`` text maps a file whose name is ``name``."""
    return any(
        line.split()[-1].rsplit("/", 1)[-1] == name
        for line in maps.splitlines()
        if len(line.split()) >= 6
    )


def preloaded(pid: int | None, name: str) -> bool | None:
    """Whether process ``pid`` or one of its descendants maps the library file ``name``
    (``None``: no pid, or no ``/proc`` to read)."""
    if pid is None or not Path("/proc").is_dir():
        return None
    return any(maps_library(_read(f"/proc/{p}/maps"), name) for p in descendants(pid, _parents()))


def _parents() -> dict[int, int]:
    """Each process's parent, from ``/proc/*/stat`` (the field after the ``)`` that closes the
    command name is the state, then the parent's pid)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            stat = _read(str(entry / "stat"))
            fields = stat.rsplit(")", 1)[-1].split()
            if len(fields) >= 2:
                parents[int(entry.name)] = int(fields[1])
    return parents


def _read(path: str) -> str:
    with contextlib.suppress(OSError):
        return Path(path).read_text()
    return ""  # the process ended, or is not ours to read


def run(root: Path, models: Path, model: str, reference: Server, settings: Settings,
        flags: str) -> dict[str, object]:  # fmt: skip
    """Start the OpenBLAS node and mlx_lm.server beside the ``reference`` node and measure the
    three; ``{"available": false, "reason": …}`` where OpenBLAS cannot be had here."""
    from skulk.bench._load_servers import MlxLmServer, serving_node
    from skulk.runner import CpuBlasUnavailable, openblas_library, preload_env

    if CPU_BLAS_FLAG not in flags:
        return {"available": False, "reason": f"this build's node has no {CPU_BLAS_FLAG} flag"}
    try:
        library = openblas_library(root / "blas-cache")
    except CpuBlasUnavailable as exc:
        return {"available": False, "reason": str(exc)}
    env = preload_env(str(library), dict(os.environ))
    with (
        serving_node(root, models, FAST, model, CPU_BLAS_FLAG, "openblas") as fast,
        MlxLmServer(models / Path(model).name, env=env) as mlx,
    ):
        assert mlx.proc is not None
        theirs = Server(THEIRS, mlx.url, "default_model", mlx.proc.pid)
        servers = (fast, reference, theirs)
        figures = measured(blas, servers, settings)
        loaded = {s.name: preloaded(s.pid, library.name) for s in servers}
    return {
        "available": True,
        "library": library.name,
        "openblas_threads": env["OPENBLAS_NUM_THREADS"],
        "preloaded": loaded,
        **figures,
    }


def table(result: Mapping[str, object]) -> Iterable[str]:
    """The mode's lines of ``bench load``'s table."""
    yield (
        f"blas ({result['library']}, {result['openblas_threads']} thread(s); preloaded: "
        f"{json.dumps(result['preloaded'])}):\n"
        f"{'streams':>7} {'server':>22} {'tok/s':>8} {'TTFT p50/p99 ms':>17}   "
        "openblas ÷ reference, ÷ mlx_lm.server"
    )
    for level, entry in result.items():
        if not level.isdigit() or not isinstance(entry, dict):
            continue
        vs = ", ".join(
            str(entry[key]["ratio"])
            for key in ("openblas_vs_reference", "openblas_vs_mlx_lm_server")
        )
        for i, name in enumerate((FAST, REFERENCE, THEIRS)):
            f = entry[name]
            yield (
                f"{level:>7} {name:>22} {f['tokens_per_s']:>8} "
                f"{f['ttft_p50_ms']:>8}/{f['ttft_p99_ms']:<8}   {vs if i == 0 else ''}"
            )
