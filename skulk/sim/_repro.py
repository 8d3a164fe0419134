"""Repro files: everything needed to replay one run exactly, as one JSON document.

A repro holds the seed, the mutant, the whole :class:`~skulk.sim._config.SimConfig` and the
full fault plan (explicitly, even when it was drawn from the seed), plus what the run produced
(trace hash, violation, the last trace lines) so that ``python -m skulk.sim replay FILE`` can
say whether the replay matched. Nothing in it depends on the machine or the process.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from skulk.sim._config import SimConfig
from skulk.sim._faults import plan_from_json, plan_to_json
from skulk.sim._invariants import Violation
from skulk.sim._mutants import find_mutant
from skulk.sim._run import RunResult, run_seed

REPRO_VERSION = 1


class ReproError(ValueError):
    """A file that is not a readable repro."""


@attrs.frozen
class Repro:
    seed: int
    mutant: str
    config: SimConfig
    plan: tuple[Any, ...]
    trace_hash: str
    violation: Violation | None
    trace_tail: tuple[str, ...] = ()


def repro_json(result: RunResult) -> dict[str, Any]:
    return {
        "skulk_sim_repro": REPRO_VERSION,
        "replay": "python -m skulk.sim replay THIS_FILE",
        "seed": result.seed,
        "mutant": result.mutant,
        "config": result.config.to_json(),
        "plan": plan_to_json(result.plan),
        "expect": {
            "trace_hash": result.trace_hash,
            "violation": attrs.asdict(result.violation) if result.violation else None,
        },
        "trace_tail": list(result.trace_tail[-60:]),
    }


def write_repro(result: RunResult, path: Path) -> Path:
    path.write_text(json.dumps(repro_json(result), indent=1, sort_keys=False) + "\n")
    return path


def load_repro(path: Path) -> Repro:
    try:
        raw = json.loads(path.read_text())
        if raw.get("skulk_sim_repro") != REPRO_VERSION:
            raise ReproError(f"{path}: not a skulk.sim repro (version {REPRO_VERSION})")
        expect = raw["expect"]
        violation = Violation(**expect["violation"]) if expect["violation"] else None
        return Repro(
            seed=int(raw["seed"]),
            mutant=str(raw["mutant"]),
            config=SimConfig.from_json(raw["config"]),
            plan=plan_from_json(raw["plan"]),
            trace_hash=str(expect["trace_hash"]),
            violation=violation,
            trace_tail=tuple(raw.get("trace_tail", ())),
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, ReproError):
            raise
        raise ReproError(f"{path}: {exc}") from exc


def replay(repro: Repro, *, trace_sink: Callable[[str], None] | None = None) -> RunResult:
    """Run the repro's seed with its config, mutant and explicit plan."""
    return run_seed(
        repro.seed,
        repro.config,
        mutant=find_mutant(repro.mutant),
        plan=list(repro.plan),
        trace_sink=trace_sink,
    )
