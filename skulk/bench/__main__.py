"""``python -m skulk.bench serve [--json] [--max-tokens N] [--repeats N] [--stream-interval S]
[--speculative-tokens N] [--temperature T] [--seed N] [--model demo|large] [--home DIR]`` and
``python -m skulk.bench raft [--json] [--clients N]
[--duration S] [--sequential N] [--trials N] [--tick S] [--election-ticks N] [--no-baseline]
[--baseline-no-fsync]`` and ``python -m skulk.bench placement [--json] [--nodes N]
[--repeats N]`` and ``python -m skulk.bench cluster [--json] [--max-tokens N] [--repeats N]
[--node-down-after S]`` and ``python -m skulk.bench distributed [--json] [--rounds N]
[--max-tokens N] [--tiny] [--layers N] [--hidden-size N] [--heads N] [--kv-heads N]
[--intermediate-size N] [--transfer-mib N] [--transfer-rounds N] [--concurrency 1,4,8]`` and
``python -m skulk.bench load [--json] [--model demo|large] [--levels 1,8,16] [--rounds N]
[--max-tokens N]
[--modes throughput,prefix,speculative,sharegpt,blas,routing] [--rates 2,4,8] [--requests N]
[--chat-chars N] [--conversations N] [--home DIR]`` and ``python -m
skulk.bench spec [--json] [--max-tokens N] [--rounds N] [--speculative-tokens N]`` and
``python -m skulk.bench transfer [--json] [--mib N] [--rounds N] [--chunk-kib N] [--streams N]
[--batch-mib N] [--holder-dials]`` and ``python -m skulk.bench models [--json] [--mib N]
[--rounds N] [--fanout] [--no-peer-fetch]`` and ``python -m skulk.bench blas [--json]
[--rounds N] [--prompt-tokens N]`` and ``python -m skulk.bench scale [--json]
[--sizes 3,5,10,20] [--phase S] [--rate N] [--settle S] [--extrapolate 100,1000]
[--home DIR] [--gossip-fanout N]`` and ``python -m skulk.bench pipeline [--json] [--rounds N]
[--streams 1,8] [--max-tokens N] [--slow S] [--idle S] [--tiny]``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m skulk.bench")
    sub = parser.add_subparsers(dest="bench", required=True)
    serve = sub.add_parser("serve", help="HTTP API streaming vs in-process mlx-lm")
    serve.add_argument("--json", action="store_true", help="print only the JSON result")
    serve.add_argument("--max-tokens", type=int, default=256)
    serve.add_argument(
        "--repeats", type=int, default=15, help="interleaved pairs of runs (default 15)"
    )
    serve.add_argument(
        "--stream-interval",
        type=float,
        default=None,
        help="pass --stream-interval to the node (default: the node's own default)",
    )
    serve.add_argument(
        "--speculative-tokens",
        type=int,
        default=None,
        help="pass --speculative-tokens to the node (0: plain decoding, to compare per-token "
        "overhead alone; default: the node's own default)",
    )
    serve.add_argument(
        "--temperature",
        type=_temperature,
        default=0.0,
        help="sample free text at this temperature on both sides, a different prompt per pair "
        "(default 0: greedy, one fixed prompt)",
    )
    serve.add_argument(
        "--seed",
        type=_seed,
        default=0,
        help="sampled runs: seeds the prompt list; pair i samples with seed + i (default 0)",
    )
    serve.add_argument(
        "--model",
        choices=("demo", "large"),
        default="demo",
        help="demo: the built-in model (a decode step of ~1 ms: per-token overhead shows); "
        "large: bench load's 12-layer llama",
    )
    serve.add_argument(
        "--home", type=Path, default=None, help="data dir to use (default: a temporary one)"
    )
    raft = sub.add_parser("raft", help="Raft commits and failover vs pysyncobj (3 replicas)")
    raft.add_argument("--json", action="store_true", help="print only the JSON result")
    raft.add_argument("--clients", type=int, default=128, help="concurrent clients (default 128)")
    raft.add_argument("--duration", type=float, default=5.0, help="seconds of concurrent load")
    raft.add_argument("--sequential", type=int, default=200, help="one-at-a-time commands")
    raft.add_argument("--trials", type=int, default=10, help="leader kills (default 10)")
    raft.add_argument("--tick", type=float, default=0.05, help="seconds per Raft tick")
    raft.add_argument("--election-ticks", type=int, default=10)
    raft.add_argument("--no-baseline", action="store_true", help="skip pysyncobj")
    raft.add_argument("--rounds", type=int, default=1, help="interleaved runs per system")
    raft.add_argument("--levels", default="", help="client counts, e.g. 32,512,1024")
    raft.add_argument(
        "--baseline-no-fsync",
        action="store_true",
        help="run pysyncobj as shipped (it never fsyncs its journal) instead of patched to sync",
    )
    placement = sub.add_parser("placement", help="the placement planner on simulated nodes")
    placement.add_argument("--json", action="store_true", help="print only the JSON result")
    placement.add_argument("--nodes", type=int, default=100, help="simulated nodes (default 100)")
    placement.add_argument("--repeats", type=int, default=200, help="plans timed per case")
    cluster = sub.add_parser("cluster", help="the remote hop, failover and placement")
    cluster.add_argument("--json", action="store_true", help="print only the JSON result")
    cluster.add_argument("--max-tokens", type=int, default=256)
    cluster.add_argument("--repeats", type=int, default=9, help="interleaved pairs (default 9)")
    cluster.add_argument(
        "--node-down-after", type=float, default=5.0, help="the cluster's down delay (default 5)"
    )
    distributed = sub.add_parser(
        "distributed", help="pipeline/tensor sharding vs one runner; weight transfer; memory"
    )
    distributed.add_argument("--json", action="store_true", help="print only the JSON result")
    distributed.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    distributed.add_argument("--max-tokens", type=int, default=128)
    distributed.add_argument(
        "--tiny", action="store_true", help="a tiny model (4 layers, hidden 64): for tests"
    )
    for option in ("layers", "hidden-size", "heads", "kv-heads", "intermediate-size"):
        distributed.add_argument(f"--{option}", type=int, default=None, help="model shape")
    distributed.add_argument("--transfer-mib", type=int, default=256, help="MiB to fetch")
    distributed.add_argument("--transfer-rounds", type=int, default=3)
    distributed.add_argument(
        "--concurrency",
        default="",
        help="also pipeline-2's aggregate tokens/s at these concurrent requests, e.g. 1,4,8",
    )
    load = sub.add_parser(
        "load", help="concurrent streams vs mlx_lm.server; prefix cache; speculation; routing"
    )
    load.add_argument("--json", action="store_true", help="print only the JSON result")
    load.add_argument("--model", choices=("demo", "large"), default="demo")
    load.add_argument(
        "--levels",
        type=_ints,
        default=None,
        help="concurrent streams (default 1,8,16; 8 for --modes blas alone)",
    )
    load.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    load.add_argument("--max-tokens", type=int, default=128)
    load.add_argument(
        "--modes",
        type=_modes,
        default=None,
        help="throughput,prefix,speculative,sharegpt,blas,routing (default: the first three; "
        "blas: --cpu-blas openblas vs the reference BLAS vs mlx_lm.server on OpenBLAS, for "
        "--model large, at 8 streams unless --levels says; routing: prefix-aware vs "
        "least-loaded routing over two instances, two 3-node clusters)",
    )
    load.add_argument(
        "--rates", type=_floats, default=(2.0, 4.0, 8.0), help="sharegpt: Poisson requests/s"
    )
    load.add_argument("--requests", type=int, default=32, help="sharegpt: requests per run")
    load.add_argument(
        "--chat-chars", type=int, default=4000, help="prefix and routing modes: history size"
    )
    load.add_argument(
        "--conversations", type=int, default=8, help="routing: conversations at once (default 8)"
    )
    load.add_argument("--home", type=Path, default=None, help="work dir (default: a temporary one)")
    spec = sub.add_parser("spec", help="speculative (n-gram) vs plain decoding, in process")
    spec.add_argument("--json", action="store_true", help="print only the JSON result")
    spec.add_argument("--max-tokens", type=int, default=256)
    spec.add_argument("--rounds", type=int, default=15, help="interleaved rounds (default 15)")
    spec.add_argument("--speculative-tokens", type=int, default=None, help="most drafted per step")
    transfer = sub.add_parser("transfer", help="peer weight fetch vs a local file copy")
    transfer.add_argument("--json", action="store_true", help="print only the JSON result")
    transfer.add_argument("--mib", type=int, default=256, help="MiB to fetch (default 256)")
    transfer.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    transfer.add_argument("--chunk-kib", type=int, default=None, help="holder's chunk size")
    transfer.add_argument("--streams", type=int, default=None, help="streams per holder")
    transfer.add_argument("--batch-mib", type=int, default=None, help="MiB per range request")
    transfer.add_argument(
        "--holder-dials", action="store_true", help="the holder dials (its frames are masked)"
    )
    models = sub.add_parser("models", help="Hub download vs hf download; resume; peer fetch")
    models.add_argument("--json", action="store_true", help="print only the JSON result")
    models.add_argument("--mib", type=int, default=256, help="size of the generated repo")
    models.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    models.add_argument("--fanout", action="store_true", help="also fan-out over real nodes")
    models.add_argument("--no-peer-fetch", action="store_true", help="skip the peer fetch")
    blas = sub.add_parser("blas", help="--cpu-blas openblas vs the reference BLAS: prefill")
    blas.add_argument("--json", action="store_true", help="print only the JSON result")
    blas.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    blas.add_argument("--prompt-tokens", type=int, default=512, help="prefill length")
    scale = sub.add_parser("scale", help="control-plane cost against the number of nodes")
    scale.add_argument("--json", action="store_true", help="print only the JSON result")
    scale.add_argument(
        "--sizes", type=_ints, default=(3, 5, 10, 20), help="nodes per mesh (default 3,5,10,20)"
    )
    scale.add_argument("--phase", type=float, default=30.0, help="seconds a phase (default 30)")
    scale.add_argument(
        "--rate", type=float, default=100.0, help="load phase: placements a minute (default 100)"
    )
    scale.add_argument("--settle", type=float, default=5.0, help="seconds after convergence")
    scale.add_argument(
        "--extrapolate", type=_ints, default=(100, 1000), help="sizes to extrapolate to"
    )
    scale.add_argument("--home", type=Path, default=None, help="work dir (default: a temp one)")
    scale.add_argument(
        "--gossip-fanout",
        type=int,
        default=None,
        help="the nodes' --gossip-fanout (0: every peer, as before it was bounded)",
    )
    from skulk.bench._pipeline import add_parser as add_pipeline

    add_pipeline(sub)
    args = parser.parse_args(argv)
    if args.bench == "scale":
        return _scale(args)
    if args.bench == "pipeline":
        from skulk.bench._pipeline import main as run_pipeline

        return run_pipeline(args)
    if args.bench == "blas":
        from skulk.bench._blas import main as run_blas

        return run_blas(args)
    if args.bench == "models":
        from skulk.bench._models import main as run_models

        return run_models(args)
    if args.bench == "transfer":
        from skulk.bench._transfer import main as run_transfer

        return run_transfer(args)
    if args.bench == "spec":
        return _spec(args)
    if args.bench == "load":
        return _load(args)
    if args.bench == "distributed":
        return _distributed(args)
    if args.bench == "cluster":
        from skulk.bench._cluster import run as run_cluster

        result = run_cluster(args.max_tokens, args.repeats, args.node_down_after)
        print(json.dumps(result, indent=None if args.json else 2))
        return 0
    if args.bench == "raft":
        return _raft(args)
    if args.bench == "placement":
        from skulk.bench._placement import run as run_placement

        print(json.dumps(run_placement(args.nodes, args.repeats), indent=None if args.json else 2))
        return 0

    from skulk.bench._serve import run, table

    return _emit(
        run(
            args.max_tokens,
            args.repeats,
            args.home,
            args.stream_interval,
            args.speculative_tokens,
            args.temperature,
            args.seed,
            args.model,
        ),
        args.json,
        table,
    )


def _raft(args: argparse.Namespace) -> int:
    from skulk.bench._raft import Settings, run, table

    settings = Settings(
        clients=args.clients,
        duration=args.duration,
        sequential=args.sequential,
        trials=args.trials,
        tick=args.tick,
        election_ticks=args.election_ticks,
        baseline_fsync=not args.baseline_no_fsync,
        rounds=args.rounds,
        levels=tuple(int(n) for n in args.levels.split(",") if n),
    )
    result = run(settings, baseline=not args.no_baseline)
    if args.json:
        print(json.dumps(result))
    else:
        print(table(result))
        print(json.dumps(result, indent=2))
    return 0


def _distributed(args: argparse.Namespace) -> int:
    from skulk.bench._distributed import run
    from skulk.bench._distributed_setup import settings_from

    settings = settings_from(
        tiny=args.tiny,
        layers=args.layers,
        hidden_size=args.hidden_size,
        heads=args.heads,
        kv_heads=args.kv_heads,
        intermediate_size=args.intermediate_size,
        max_tokens=args.max_tokens,
        rounds=args.rounds,
        transfer_mib=args.transfer_mib,
        transfer_rounds=args.transfer_rounds,
        concurrency=[int(n) for n in args.concurrency.split(",") if n],
    )
    result = run(settings)
    if args.json:
        print(json.dumps(result.as_dict()))
    else:
        print(result.table())
        print(json.dumps(result.as_dict(), indent=2))
    return 0


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(","))


def _temperature(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 <= value <= 2:
        raise argparse.ArgumentTypeError(f"give a temperature from 0 to 2: {text!r}")
    return value


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"give a seed of 0 or more: {text!r}")
    return value


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not numbers: {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"give positive numbers: {text!r}")
    return values


def _modes(text: str) -> tuple[str, ...]:
    from skulk.bench._load_modes import MODES

    modes = tuple(text.split(","))
    if not set(modes) <= set(MODES):
        raise argparse.ArgumentTypeError(f"modes are {', '.join(MODES)}")
    return modes


def _load(args: argparse.Namespace) -> int:
    from skulk.bench._load import run, table
    from skulk.bench._load_modes import DEFAULT_MODES, Settings, default_levels

    if args.conversations < 1:
        raise SystemExit("--conversations must be at least 1")
    modes = args.modes or DEFAULT_MODES
    settings = Settings(
        model=args.model,
        levels=args.levels or default_levels(modes),
        rounds=args.rounds,
        max_tokens=args.max_tokens,
        modes=modes,
        chat_chars=args.chat_chars,
        home=args.home,
        rates=args.rates,
        requests=args.requests,
        conversations=args.conversations,
    )
    return _emit(run(settings), args.json, table)


def _emit(
    result: dict[str, object], json_only: bool, table: Callable[[dict[str, object]], str]
) -> int:
    """Print ``result``: its JSON alone, or its table and then its JSON indented."""
    if json_only:
        print(json.dumps(result))
    else:
        print(table(result))
        print(json.dumps(result, indent=2))
    return 0


def _scale(args: argparse.Namespace) -> int:
    from skulk.bench._scale import Settings, run
    from skulk.bench._scale_table import table

    if any(n < 2 for n in args.sizes) or not args.phase > 0 or not args.rate > 0:
        raise SystemExit("--sizes need 2 nodes or more; --phase and --rate must be > 0")
    settings = Settings(
        sizes=args.sizes,
        phase=args.phase,
        rate=args.rate,
        settle=args.settle,
        extrapolate=args.extrapolate,
        home=args.home,
        gossip_fanout=args.gossip_fanout,
    )
    return _emit(run(settings), args.json, table)


def _spec(args: argparse.Namespace) -> int:
    from skulk.bench._spec import run, table
    from skulk.engine.inprocess import DEFAULT_SPECULATIVE_TOKENS

    k = DEFAULT_SPECULATIVE_TOKENS if args.speculative_tokens is None else args.speculative_tokens
    result = run(args.max_tokens, args.rounds, k)
    print(json.dumps(result) if args.json else f"{table(result)}\n{json.dumps(result, indent=2)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
