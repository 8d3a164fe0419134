"""The figures of a ``bench distributed`` run: every reading (:class:`Result`), and the ratios,
costs per hop or all_sum, JSON and table made from them."""

from __future__ import annotations

import statistics
from collections.abc import Iterable

import attrs

from skulk.bench._distributed_features import Features
from skulk.bench._distributed_measure import Paired, Sample
from skulk.bench._distributed_setup import SINGLE, SUBJECTS, TINY_SHAPE, Instance, Settings

MIB = 1 << 20
COLUMNS = ("instance", "tok/s", "ratio", "ms/tok", "+ms/tok", "ms/hop", "TTFT ms", "TTFT ratio",
           "RSS MiB", "RSS ratio", "ideal", "runtime MiB", "cores")  # fmt: skip


@attrs.frozen
class Result:
    """Every reading of one run: ``singles`` in the order they ran, ``runs`` by subject name
    (one per round), ``runtime`` by instance name (on the tiny model)."""

    settings: Settings
    singles: list[Sample]
    runs: dict[str, list[Paired]]
    runtime: dict[str, Sample]
    transfer: dict[str, object]
    weights_bytes: int
    load_average: tuple[float, float]
    concurrent: dict[int, list[float]] = attrs.field(factory=dict)  # level → tokens/s by round
    features: Features | None = None

    def subject(self, instance: Instance) -> dict[str, object]:
        """The figures of one instance (medians over rounds; ratios against single)."""
        med = statistics.median
        pairs = self.runs.get(instance.name, [])
        mine = [p.subject for p in pairs] if pairs else self.singles
        ranks = range(instance.world)
        rss = [med(s.rss_bytes[r] for s in mine) for r in ranks]
        single_rss = med(s.rss_bytes[0] for s in self.singles)
        runtime = self.runtime[instance.name].rss_bytes
        weights = (single_rss - self.runtime[SINGLE.name].rss_bytes[0]) / instance.world
        ideal = [(runtime[r] + weights) / single_rss for r in ranks]
        out: dict[str, object] = {
            "ranks": instance.world,
            "tokens_per_s": round(1000 / med(s.ms_per_token for s in mine), 2),
            "ms_per_token": round(med(s.ms_per_token for s in mine), 2),
            "ttft_ms": round(med(s.ttft_s for s in mine) * 1000, 1),
        }
        if pairs:
            out["tokens_per_s_ratio"] = _ratio(
                p.base_ms_per_token / p.subject.ms_per_token for p in pairs
            )
            out["ttft_ratio"] = _ratio(p.subject.ttft_s / p.base_ttft_s for p in pairs)
        by_round: dict[str, list[float]] = {
            "ms_per_token": [round(s.ms_per_token, 2) for s in mine],
            "ttft_ms": [round(s.ttft_s * 1000, 1) for s in mine],
        }
        if pairs:
            by_round["single_ms_per_token"] = [round(p.base_ms_per_token, 2) for p in pairs]
            by_round["tokens_per_s_ratio"] = [
                round(p.base_ms_per_token / p.subject.ms_per_token, 3) for p in pairs
            ]
        out["by_round"] = by_round
        out.update(
            {
                "rss_mib": [round(v / MIB, 1) for v in rss],
                "rss_ratio": [round(v / single_rss, 3) for v in rss],
                "rss_ideal_ratio": [round(v, 3) for v in ideal],
                "runtime_rss_mib": [round(v / MIB, 1) for v in runtime],
                "mlx_active_mib": [
                    round(med(s.mlx_bytes[r] for s in mine) / MIB, 1) for r in ranks
                ],
                "cpu_cores": [round(med(s.cpu_cores[r] for s in mine), 2) for r in ranks],
            }
        )
        tiny = self.runtime[instance.name]
        out["tiny_model"] = {"ms_per_token": round(tiny.ms_per_token, 3)}
        if not pairs:
            return out
        added = med(p.subject.ms_per_token - p.base_ms_per_token for p in pairs)
        out.update(_costs(instance, added, self.settings.shape.layers))
        tiny_added = tiny.ms_per_token - self.runtime[SINGLE.name].ms_per_token
        out["tiny_model"] = {
            "ms_per_token": round(tiny.ms_per_token, 3),
            **_costs(instance, tiny_added, TINY_SHAPE.layers),
        }
        return out

    def all_samples(self) -> list[Sample]:
        return [*self.singles, *(p.subject for ps in self.runs.values() for p in ps)]

    def as_dict(self) -> dict[str, object]:
        shape = self.settings.shape
        runs = self.all_samples()
        reasons = sorted({s.finish_reason for s in runs})
        return {
            "benchmark": "distributed",
            "model": {
                **attrs.asdict(shape),
                "dtype": "float32",
                "files": self.settings.files,
                "weights_mb": round(self.weights_bytes / 1e6, 1),
                "params_m": round(self.weights_bytes / 4 / 1e6, 1),
            },
            "max_tokens": self.settings.max_tokens,
            "rounds": self.settings.rounds,
            "prompt_tokens": runs[0].prompt_tokens,
            "tokens": min(s.tokens for s in runs),
            "finish_reasons": reasons,
            "coalesced_runs": sum(s.coalesced for s in runs),
            "load_average_1m": [round(v, 2) for v in self.load_average],
            "single": self.subject(SINGLE),
            "subjects": {i.name: self.subject(i) for i in SUBJECTS},
            "transfer": self.transfer,
            **({"concurrent": self._concurrent()} if self.concurrent else {}),
            **({"features": self.features.as_dict()} if self.features else {}),
        }

    def _concurrent(self) -> dict[str, object]:
        """pipeline-2's aggregate tokens/s by number of concurrent requests (JSON keys)."""
        rates = {n: statistics.median(v) for n, v in self.concurrent.items()}
        base = rates[min(rates)]
        return {
            "instance": "pipeline-2",
            "tokens_per_s": {str(n): round(r, 1) for n, r in rates.items()},
            "ratio": {str(n): round(r / base, 2) for n, r in rates.items()},
            "by_round": {str(n): [round(v, 1) for v in vs] for n, vs in self.concurrent.items()},
        }

    def table(self) -> str:
        s = self.settings.shape
        params = round(self.weights_bytes / 4 / 1e6, 1)
        lines = [
            f"model: {s.family}, {s.layers} layers, hidden {s.hidden_size}, {s.heads} heads "
            f"({s.kv_heads} kv), MLP {s.intermediate_size}, vocab {s.vocab_size}: {params}M "
            f"params, float32; {self.settings.max_tokens} tokens greedy, {self.settings.rounds} "
            f"rounds; load average {self.load_average[0]:.2f} → {self.load_average[1]:.2f}",
        ]
        rows: list[tuple[object, ...]] = [COLUMNS]
        for inst in (SINGLE, *SUBJECTS):
            f = self.subject(inst)
            hop = f.get("per_hop_ms", f.get("per_all_sum_ms", "-"))
            rows.append(
                (inst.name, f["tokens_per_s"], f.get("tokens_per_s_ratio", 1), f["ms_per_token"],
                 f.get("added_ms_per_token", "-"), hop, f["ttft_ms"], f.get("ttft_ratio", 1),
                 *(_slashed(f[k]) for k in ("rss_mib", "rss_ratio", "rss_ideal_ratio",
                                            "runtime_rss_mib", "cpu_cores")))
            )  # fmt: skip
        widths = [max(len(str(row[c])) for row in rows) for c in range(len(COLUMNS))]
        lines += [
            "  ".join(f"{v!s:<{w}}" for v, w in zip(row, widths, strict=True)).rstrip()
            for row in rows
        ]
        lines.append(
            "(by rank: RSS, RSS ratio, ideal, runtime, cores; tensor-2's ms/hop is per all_sum)"
        )
        tiny = []
        for inst in SUBJECTS:
            costs = self.subject(inst)["tiny_model"]
            assert isinstance(costs, dict)
            unit = "hop" if "per_hop_ms" in costs else "all_sum"
            tiny.append(
                f"{inst.name} {costs['added_ms_per_token']:+} ms/token = "
                f"{costs.get('per_hop_ms', costs.get('per_all_sum_ms'))} ms/{unit}"
            )
        lines.append("tiny model (the link without compute): " + ", ".join(tiny))
        t = self.transfer
        lines.append(
            f"peer weight transfer: {t.get('fetch_mb_s')} MB/s over one loopback link vs "
            f"{t.get('copy_mb_s')} MB/s local copy = {t.get('fetch_vs_copy')} "
            f"({t.get('fetch_vs_copy_fsync')} of a copy + fsync at {t.get('copy_fsync_mb_s')} MB/s)"
        )
        if self.concurrent:
            c = self._concurrent()
            rates, ratios = c["tokens_per_s"], c["ratio"]
            assert isinstance(rates, dict) and isinstance(ratios, dict)
            levels = ", ".join(f"{n}: {rates[n]} tok/s ({ratios[n]}x)" for n in rates)
            lines.append(f"pipeline-2 aggregate by concurrent requests: {levels}")
        if self.features is not None:
            f = self.features.as_dict()
            prefix, spec = f["prefix"], f["speculation"]
            assert isinstance(prefix, dict) and isinstance(spec, dict)
            lines.append(
                f"pipeline-2 second-turn TTFT, prefix cache hit ÷ cold: {prefix['ttft_ratio']} "
                f"({prefix['cached_ttft_ms']} / {prefix['cold_ttft_ms']} ms, "
                f"{prefix['prompt_tokens']} prompt tokens)"
            )
            for name, run in spec.items():
                lines.append(
                    f"speculation on a copy prompt ({name} model), tokens/s with ÷ without: "
                    f"pipeline-2 {run['tokens_per_s_ratio']}x, single "
                    f"{run['single_tokens_per_s_ratio']}x (acceptance {run['acceptance_rate']})"
                )
        return "\n".join(lines)


def _costs(instance: Instance, added_ms: float, layers: int) -> dict[str, float | int]:
    """What ``added_ms`` per token costs per hop (pipeline) or per all_sum (tensor)."""
    costs: dict[str, float | int] = {"added_ms_per_token": round(added_ms, 3)}
    if instance.sharding == "pipeline":
        costs["hops"] = instance.world
        costs["per_hop_ms"] = round(added_ms / instance.world, 3)
    else:
        costs["all_sums_per_token"] = 2 * layers
        costs["per_all_sum_ms"] = round(added_ms / (2 * layers), 3)
    return costs


def _ratio(values: Iterable[float]) -> float:
    return round(statistics.median(values), 3)


def _slashed(value: object) -> str:
    return "/".join(map(str, value)) if isinstance(value, list) else str(value)
