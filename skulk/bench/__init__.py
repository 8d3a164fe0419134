"""Benchmarks (``python -m skulk.bench …``): always ratios against a baseline in the same run.

Nothing in Skulk imports this package: it is a developer tool above what it drives, run as
``python -m skulk.bench SUBCOMMAND`` (``__main__``), one module per subcommand:

- ``serve`` (``_serve``): the HTTP API against in-process mlx-lm;
- ``load`` (``_load``, with ``_load_servers``, ``_load_client``, ``_load_modes``): concurrent
  streams against ``mlx_lm.server``, the prefix cache and speculation on and off;
- ``distributed`` (``_distributed``, with ``_distributed_setup``, ``_distributed_measure``,
  ``_distributed_result``): sharded instances against one runner, and the weight transfer
  (``_transfer``);
- ``raft`` (``_raft``, replicas in ``_raftnode``): Skulk's Raft against PySyncObj;
- ``cluster`` (``_cluster``): the remote hop, failover and placement; ``placement``
  (``_placement``): the planner on simulated nodes;
- ``spec`` (``_spec``): n-gram speculative decoding against plain decoding;
- ``scale`` (``_scale``, with ``_scale_mesh``, ``_scale_metrics``, ``_scale_fit``,
  ``_scale_table``): the control plane's cost per node at several mesh sizes, fitted and
  extrapolated to 100 and 1000 nodes.
- ``pipeline`` (``_pipeline``): a waiting pipeline rank's CPU and pipeline-2's throughput,
  with the ranks' doorbell and without.
"""

__all__: list[str] = []
