"""``python -m skulk.bench load``: Skulk under concurrent load against ``mlx_lm.server``.

The benchmark starts its own servers on loopback, on the same model directory: a
``python -m skulk serve`` node (:class:`~skulk.harness.NodeProcess`) and ``python -m mlx_lm
server`` (mlx-lm 0.32.2, which batches concurrent requests with ``BatchGenerator``; run with its
default ``--decode-concurrency 32 --prompt-concurrency 8``, passed explicitly). Both are driven
the same way: OpenAI chat completions, streamed (SSE) with ``httpx``, greedy, a fixed
``max_tokens``, ``stream_options.include_usage`` on.

* **throughput** — at each concurrency level (``--levels``, default 1, 8, 16) ``c`` streams are
  started together; the aggregate rate is the completion tokens of all ``c`` streams ÷ the wall
  time from the first request sent to the last stream's end. Tokens are counted the same way for
  both servers: the ``usage.completion_tokens`` of each stream's final chunk. Every stream's
  prompt is unique (its round and stream number open it), so no prompt cache serves one round
  from an earlier one on either side. TTFT is request sent → first non-empty content delta;
  p50/p99 pool every stream of every round at that level (nearest rank). The two servers stay
  up and take turns within each round (the order alternates by round); ``ratio`` is the median
  of the per-round ratios Skulk ÷ mlx_lm.server. Goals: ≥ 1.0 at one stream, ≥ 1.2 above.
  ``ignore_eos`` is not in the OpenAI API (and Skulk takes no ``logit_bias``), so the prompts
  and models are ones that run to ``max_tokens`` (the demo model loops greedily whatever the
  prompt; the large model's end-of-sequence logit is zeroed so greedy decoding never picks
  it); ``full_length`` says whether every stream of both servers did; ``retries``: connections
  mlx_lm.server reset before answering, tried again (see :func:`~skulk.bench._load_client.stream`).
* **prefix** — the second turn of a long multi-turn chat (``--chat-chars`` characters of
  history): TTFT on a node with the prefix cache (the default) ÷ on a node started with
  ``--prefix-cache-memory 0``; each round a fresh conversation, turn one (history + question,
  ``PREFIX_ANSWER_TOKENS`` answered) then turn two (+ that answer + a new question), alternating
  which node goes first. Goal ≤ 0.3. Reports the turn-two ``cached_tokens`` if the node sends
  ``usage.prompt_tokens_details``.
* **speculative** — tokens/s of one stream (completion tokens ÷ request → end) on the default
  node ÷ a node started with ``--speculative-tokens 0``, on a copy prompt ("repeat this text: …",
  greedy) and on free generation (a story, temperature 1, a fixed seed per round). Goals: > 1 on
  copy, ≥ 0.95 on free. ``tokens``: the completion lengths seen, speculating node first
  (sampled text may end early, and speculation keeps the distribution, not the exact tokens).
  The demo model's greedy output is a short loop whatever the prompt, so there even "free"
  greedy text is a copy; ``--model large`` is the fairer test.

* **blas** — ``--cpu-blas openblas`` under load (:mod:`skulk.bench._load_blas`): at each level
  (``--levels``; for ``--modes blas`` alone the default is 8 streams), three servers in turns as
  in ``throughput``: a node with ``--cpu-blas openblas``, the node with the reference BLAS, and
  ``mlx_lm.server`` given the same OpenBLAS (the runners' ``LD_PRELOAD`` and
  ``OPENBLAS_NUM_THREADS``). Reports tokens/s and TTFT per server, Skulk-openblas ÷ Skulk and
  Skulk-openblas ÷ mlx_lm.server (output tokens/s, medians of per-round ratios), and whether the
  library is really mapped in each server's processes (``/proc/PID/maps``). Meant for
  ``--model large``, where BLAS is the cost; needs the ``cpu-blas`` extra (without it the mode
  reports ``{"available": false, "reason": …}``).

* **routing** — (``--modes routing``; not run by default) a conversation's second turn over
  two instances of the model in a three-node cluster: turn-two TTFT p50 with prefix-aware
  routing (the default ``--route-policy prefix``) ÷ with ``--route-policy least-loaded``, two
  clusters up side by side for the whole run, ``--conversations`` (default 8) two-turn chats of
  ``--chat-chars`` at once per round, each turn through a different node drawn at random,
  sampled at temperature 0.7 with seeds. Also the share of second turns served by their first
  turn's instance (``x-skulk-instance``), each instance's share of the conversations and the
  turn-two cached tokens. Goal ≤ 0.3. See :mod:`skulk.bench._load_routing`.

The prefix, speculative, blas and routing modes need node flags that may not exist in this
build: each mode checks ``python -m skulk serve --help`` first and, without its flag, reports
``{"available": false, "reason": …}`` instead of figures.

``--model large`` generates the distributed benchmark's default llama (12 layers, hidden 512,
float32: compute-bound on a small CPU) instead of the built-in demo model.

This module runs the benchmark; the servers are in ``_load_servers``, the timed client in
``_load_client``, the modes in ``_load_modes`` (the routing mode, with its clusters, in
``_load_routing``).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path

import attrs

from skulk.bench import _load_blas
from skulk.bench._load_modes import MODES, Settings, measured, prefix, speculative, throughput
from skulk.bench._load_routing import ROUTE_FLAG
from skulk.bench._load_routing import measure as routing
from skulk.bench._load_routing import table_line as routing_line
from skulk.bench._load_servers import (
    MLX_DECODE_CONCURRENCY,
    MLX_PROMPT_CONCURRENCY,
    MlxLmServer,
    Server,
    node_flags,
    serving_node,
)
from skulk.bench._load_sweep import sharegpt

PREFIX_FLAG = "--prefix-cache-memory"
SPECULATIVE_FLAG = "--speculative-tokens"


def _models(root: Path, settings: Settings) -> tuple[Path, str]:
    """The models directory shared by every node, and the ``--model`` to serve from it."""
    from skulk.models import ensure_demo_model

    demo = ensure_demo_model(root / "shared")
    if settings.model == "demo":
        return demo.parent, "skulk-demo"
    return demo.parent, str(large_model(demo))


def large_model(demo: Path) -> Path:
    """``--model large``: the distributed benchmark's default llama (12 layers, hidden 512,
    float32; ``demo``'s tokenizer), written beside ``demo`` as ``load-large``, its
    end-of-sequence logit silenced (:func:`never_end`)."""
    from skulk.bench._distributed_setup import DEFAULT_SHAPE
    from skulk.models import write_generated_model

    large = write_generated_model(demo.parent / "load-large", DEFAULT_SHAPE, demo, seed=1)
    never_end(large)
    return large


def never_end(model: Path) -> None:
    """Zero the output-projection row of the end-of-sequence token (in whichever safetensors
    file holds the head): its logit is 0 while the greedy winner's is well above, so greedy
    decoding of the generated model always runs to ``max_tokens``."""
    import mlx.core as mx

    eos = int(json.loads((model / "config.json").read_text())["eos_token_id"])
    for path in sorted(model.glob("*.safetensors")):
        weights = mx.load(str(path))
        assert isinstance(weights, dict)
        if "lm_head.weight" not in weights:
            continue
        head = weights["lm_head.weight"]
        rows = mx.arange(head.shape[0])[:, None]
        weights["lm_head.weight"] = mx.where(rows == eos, mx.zeros_like(head), head)
        mx.save_safetensors(str(path), weights, metadata={"format": "mlx"})
        return
    raise ValueError(f"{model} has no lm_head.weight to silence the end-of-sequence token in")


def run(settings: Settings) -> dict[str, object]:
    flags = node_flags() if set(settings.modes) - {"throughput"} else ""
    load_before = os.getloadavg()[0]
    result: dict[str, object] = {
        "benchmark": "load",
        "model": settings.model,
        "max_tokens": settings.max_tokens,
        "rounds": settings.rounds,
        "levels": list(settings.levels),
        "mlx_lm_server": {"decode_concurrency": MLX_DECODE_CONCURRENCY,
                          "prompt_concurrency": MLX_PROMPT_CONCURRENCY},
    }  # fmt: skip
    with contextlib.ExitStack() as stack:
        if settings.home is not None:
            root = settings.home
            root.mkdir(parents=True, exist_ok=True)
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="skulk-load-")))
        models, model = _models(root, settings)
        if settings.model == "large":
            from skulk.bench._distributed_setup import DEFAULT_SHAPE

            result["model_shape"] = attrs.asdict(DEFAULT_SHAPE)
        if "routing" in settings.modes:
            if ROUTE_FLAG in flags:
                result["routing"] = routing(root, models, Path(model).name, settings)
            else:
                reason = f"this build's node has no {ROUTE_FLAG} flag"
                result["routing"] = {"available": False, "reason": reason}
        if not set(settings.modes) - {"routing"}:
            result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
            return result
        skulk = stack.enter_context(serving_node(root, models, "skulk", model))
        if "throughput" in settings.modes:
            model_dir = models / Path(model).name
            with MlxLmServer(model_dir) as mlx:
                theirs = Server("mlx_lm_server", mlx.url, "default_model")
                result["throughput"] = measured(throughput, (skulk, theirs), settings)
        if "sharegpt" in settings.modes:
            model_dir = models / Path(model).name
            with (
                MlxLmServer(model_dir) as mlx,
                serving_node(root, models, "skulk-no-spec", model, SPECULATIVE_FLAG, "0") as plain,
            ):
                theirs = Server("mlx_lm_server", mlx.url, "default_model")
                result["sharegpt"] = measured(_sweep, (skulk, plain, theirs), settings)
        if "blas" in settings.modes:
            result["blas"] = _load_blas.run(root, models, model, skulk, settings, flags)
        for mode, flag, fn in (("prefix", PREFIX_FLAG, prefix),
                               ("speculative", SPECULATIVE_FLAG, speculative)):  # fmt: skip
            if mode not in settings.modes:
                continue
            if flag not in flags:
                result[mode] = {"available": False,
                                "reason": f"this build's node has no {flag} flag"}  # fmt: skip
                continue
            with serving_node(root, models, f"skulk-no-{mode}", model, flag, "0") as plain:
                result[mode] = measured(fn, (skulk, plain), settings)
    result["load_average"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return result


async def _sweep(servers: tuple[Server, ...], settings: Settings) -> dict[str, object]:
    return await sharegpt(
        servers, settings.levels, settings.rates, settings.rounds, settings.requests
    )


def table(result: dict[str, object]) -> str:
    lines = [f"model {result['model']}, max_tokens {result['max_tokens']}, "
             f"{result['rounds']} rounds"]  # fmt: skip
    levels = result.get("throughput")
    if isinstance(levels, dict) and "error" not in levels:
        lines.append(
            f"{'streams':>7} {'skulk tok/s':>12} {'mlx tok/s':>10} {'ratio':>6} {'goal':>5} "
            f"{'skulk TTFT p50/p99':>19} {'mlx TTFT p50/p99':>17} full"
        )
        for level, f in levels.items():
            ours, theirs = f["skulk"], f["mlx_lm_server"]
            lines.append(
                f"{level:>7} {ours['tokens_per_s']:>12} {theirs['tokens_per_s']:>10} "
                f"{f['ratio']:>6} {f['goal']:>5} "
                f"{ours['ttft_p50_ms']:>9}/{ours['ttft_p99_ms']:<9} "
                f"{theirs['ttft_p50_ms']:>8}/{theirs['ttft_p99_ms']:<8} {f['full_length']}"
            )
    sweep = result.get("sharegpt")
    if isinstance(sweep, dict) and "error" not in sweep:
        lines.append(
            f"sharegpt ({sweep['requests']} sampled requests a run; ratios to {sweep['baseline']}):"
            f"\n{'setting':>8} {'server':>14} {'out tok/s':>10} {'TTFT p50/p99 ms':>17} "
            f"{'TPOT p50 ms':>11} {'good/s':>7}   ratios tok/s, TTFT p99, goodput"
        )
        for key, entry in sweep.items():
            if not isinstance(entry, dict) or not key.startswith(("c", "rate")):
                continue
            for name, f in entry.items():
                if "_vs_" in name:
                    continue
                vs = entry.get(f"{name}_vs_{sweep['baseline']}", {})
                ratios = ", ".join(str(v) for v in vs.values()) if vs else ""
                lines.append(
                    f"{key:>8} {name:>14} {f['output_tokens_per_s']:>10} "
                    f"{f['ttft_ms']['p50']:>8}/{f['ttft_ms']['p99']:<8} "
                    f"{f['tpot_ms']['p50']:>11} {f['goodput_per_s']:>7}   {ratios}"
                )
    blas = result.get("blas")
    tabled_blas = isinstance(blas, dict) and blas.get("available") and "error" not in blas
    if tabled_blas:
        lines.extend(_load_blas.table(blas))  # type: ignore[arg-type]
    routed = result.get("routing")
    if isinstance(routed, dict):
        lines.append(routing_line(routed))
    for mode in MODES:  # the modes not tabled above
        if mode == "sharegpt" and isinstance(sweep, dict) and "error" not in sweep:
            continue
        if mode == "routing" or (mode == "blas" and tabled_blas):
            continue
        if mode in result and (mode != "throughput" or "error" in result[mode]):  # type: ignore[operator]
            lines.append(f"{mode}: {json.dumps(result[mode])}")
    return "\n".join(lines)
