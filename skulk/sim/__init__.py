"""Deterministic fault-injection simulation of a Skulk Raft cluster (``python -m skulk.sim``).

N nodes, each the real :class:`~skulk.consensus.RaftCore` over the real
:class:`~skulk.consensus._storage.Storage` on a simulated disk, replicating the real cluster
State (:class:`skulk.cluster.ClusterMachine` behind :class:`skulk.consensus.Sessions`), talk
over a simulated network, driven by a plain single-threaded event loop in logical ticks. A seed
decides everything (network delays and losses, the fault plan, the clients and the cluster
commands their leaders decide, the cores' election timeouts, torn writes), so one seed always
gives the same trace hash. After every step the invariant checker
(:mod:`skulk.sim._invariants`) verifies Raft's safety properties, durability, monotonicity,
exactly-once client commands and the cluster State's own invariants on every replica
(:mod:`skulk.sim._clusterchecks`); after the faults heal, liveness.

    from skulk.sim import SimConfig, run_seed
    result = run_seed(7, SimConfig(steps=1000))
    assert result.ok, result.violation

Pieces: :mod:`._world` (the loop), :mod:`._node` (the driver around core + storage),
:mod:`._statemachine` (the replicated state), :mod:`._commands` (the cluster commands),
:mod:`._network`, :mod:`._disk` / :mod:`._crashdisk`, :mod:`._workload` (clients),
:mod:`._faults` (plans), :mod:`._swarm` (random plans), :mod:`._triggers` (faults timed by
leader events), :mod:`._mutants` (negative controls), :mod:`._scenario`
(``specs/scenarios/*.toml``), :mod:`._repro` (repro files).
"""

from skulk.sim._config import SimConfig
from skulk.sim._faults import Action, PlanError
from skulk.sim._invariants import Violation
from skulk.sim._mutants import MUTANTS, Mutant, find_mutant
from skulk.sim._repro import load_repro, replay, write_repro
from skulk.sim._run import RunResult, run_seed
from skulk.sim._scenario import Scenario, ScenarioResult, find_scenario, load_scenario, run_scenario

__all__ = [
    "MUTANTS",
    "Action",
    "Mutant",
    "PlanError",
    "RunResult",
    "Scenario",
    "ScenarioResult",
    "SimConfig",
    "Violation",
    "find_mutant",
    "find_scenario",
    "load_repro",
    "load_scenario",
    "replay",
    "run_scenario",
    "run_seed",
    "write_repro",
]
