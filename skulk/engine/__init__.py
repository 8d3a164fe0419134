"""The engine: the program that runs inside a runner process (``python -m skulk.engine``).

The node never runs it in-process: :mod:`skulk.runner` spawns it as a subprocess per
(instance, rank) and supervises it over a socketpair carrying :mod:`skulk.wire.runner`
frames (:mod:`skulk.engine.protocol`). Inside, one scheduler (admission against a KV budget,
queueing, continuous batching, prefill pacing, the prefix cache, n-gram speculation, sampling,
logprobs, grammar masks, tool parsing, embeddings) drives a forward pass that is either the
whole model in this process or, for a rank of a sharded (pipeline or tensor) instance, a pass
distributed over the instance's compute group.

This package's face is deliberately light: importing it (or :mod:`skulk.engine.faults` and
:mod:`skulk.engine.protocol`, which the node uses) imports no mlx. The mlx modules are
private and loaded only inside the runner process; benchmarks and in-process references use
:mod:`skulk.engine.inprocess`.
"""

#: ``off`` in a sharded runner's environment (on any rank): its group forms no doorbell and
#: every waiting rank spins in mlx's ring receive, as before the doorbell
#: (:mod:`skulk.engine._doorbell`): a benchmark's baseline, never needed in production.
DOORBELL_ENV = "SKULK_RING_DOORBELL"

#: ``off`` in a pipeline's rank 0 environment: no micro-batches in flight together (the ranks
#: take turns on one batch; see :mod:`skulk.engine._sharded_forward`): a benchmark's baseline.
OVERLAP_ENV = "SKULK_PIPELINE_OVERLAP"

__all__ = ["DOORBELL_ENV", "OVERLAP_ENV"]
