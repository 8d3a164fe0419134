"""Deterministic fault-injection simulation of a Skulk Raft cluster (``python -m skulk.sim``).

N nodes, each the real :class:`~skulk.consensus.RaftCore` over the real
:class:`~skulk.consensus.Storage` on a simulated disk, replicating the real cluster
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

A named scenario (``specs/scenarios/*.toml``: a fault plan and the checks it must pass) and a
negative control (a :class:`Mutant` the checker must catch)::

    from skulk.sim import MUTANTS, load_scenario, run_scenario

:class:`SimDisk` (an in-memory :class:`~skulk.consensus.Disk` that loses what was not synced,
and tears writes in a crash) is also what the storage tests crash.

Pieces: :mod:`._world` (the loop), :mod:`._node` (the driver around core + storage),
:mod:`._statemachine` (the replicated state), :mod:`._commands` (the cluster commands),
:mod:`._network`, :mod:`._disk` / :mod:`._crashdisk`, :mod:`._workload` (clients),
:mod:`._faults` (plans), :mod:`._swarm` (random plans), :mod:`._triggers` (faults timed by
leader events), :mod:`._mutants` (negative controls), :mod:`._scenario`
(``specs/scenarios/*.toml``), :mod:`._repro` (repro files).
"""

from skulk.sim._config import SimConfig
from skulk.sim._disk import SimDisk, SimulatedCrash
from skulk.sim._faults import Action, PlanError
from skulk.sim._mutants import MUTANTS, Mutant
from skulk.sim._run import RunResult, run_seed
from skulk.sim._scenario import Scenario, load_scenario, run_scenario

__all__ = [
    "MUTANTS",
    "Action",
    "Mutant",
    "PlanError",
    "RunResult",
    "Scenario",
    "SimConfig",
    "SimDisk",
    "SimulatedCrash",
    "load_scenario",
    "run_scenario",
    "run_seed",
]
