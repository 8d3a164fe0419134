"""``python -m skulk.bench distributed``: what sharding one model over several runners costs.

Every instance is real runner processes driven through the runner layer (no node, no HTTP):
*single* is one :class:`~skulk.runner.Runner` holding the whole model, the subjects are
:func:`~skulk.runner.open_local_group` instances on loopback — ``pipeline-2``, ``pipeline-3``
(the layers split evenly) and ``tensor-2`` (every layer on half the heads and half the MLP).
The model is generated (:func:`~skulk.models.write_generated_model`: a llama with
random float32 weights), by default large enough that one decode step is compute-bound here
(the default shape's ``ms_per_token`` is in the result; its header names the shape).

**Rounds.** The single runner is opened first and stays open (idle between its requests: it
only heartbeats). Each round measures every subject — in an order rotated every round — by
opening its group, serving one short warm-up request, timing the measured request and closing
the group, then timing a request on the single runner; so every subject's run lies between
two of single's, seconds apart, and nothing else of ours computes while one is timed. Every
request is the same text prompt, greedy, ``max_tokens`` tokens (the prompt is stop-free and
every run should end with ``length``; ``finish_reasons`` says). A subject's ratios are against
the mean of the single runs just before and after it; the medians over rounds are reported
(``by_round`` has every round's), so a noisy machine slows both sides of a ratio alike.

* ``ms_per_token``: decode time per token after the first, as rank 0's chunks reach this
  process (first token → ``Finished``, ÷ tokens - 1). Should this process not be scheduled
  while a short generation runs, its chunks arrive together and that span is empty: such a
  run (counted in ``coalesced_runs``) is timed from the request instead, ÷ tokens.
  ``tokens_per_s_ratio`` = single ms/token ÷ subject ms/token (goal for ``pipeline-2``: ≥ 0.9).
* ``ttft_ratio``: time from ``open_request`` to the first token, subject ÷ single.
* ``added_ms_per_token`` = subject ms/token - single ms/token. For a pipeline of n ranks
  ``hops`` = n: per token the hidden state crosses every link of the ring, the n - 1 between
  stages and back from the last rank to rank 0, where the logits are (the step's message of
  ops rides the same links first); ``per_hop_ms`` = added ms/token ÷ hops. For tensor-n,
  ``all_sums_per_token`` = 2 * layers (after each attention and each MLP block) and
  ``per_all_sum_ms`` = added ms/token ÷ that.
* ``rss_mib`` by rank, from each runner's heartbeat after its measured request
  (``Runner.statistics().rss_bytes``), and ``rss_ratio`` = rank ÷ single. ``runtime_rss_mib``
  is the same reading, by rank, for the same kind of instance holding a tiny model (4 layers,
  hidden 64: the runtime alone, measured once before the rounds; with ``--tiny`` the first
  round's readings), and ``rss_ideal_ratio`` by rank = (that rank's runtime + (single -
  single's runtime) / n) ÷ single: the weights split n ways, the runtime paid by every rank.
* ``tiny_model``: the same instances on the tiny model, ``TINY_REPEATS`` requests each (the
  medians), measured once before the rounds: ``ms_per_token`` and the costs above, where
  compute is negligible, so the added time is the links and the ranks' messages themselves.
* ``cpu_cores`` by rank: CPU time the rank's process used during the measured request ÷ its
  wall time (from ``/proc``): how many cores a rank kept busy, computing or waiting.
* ``transfer``: :func:`skulk.bench._transfer.run` — fetching weights from a peer over one
  loopback link vs copying the same bytes locally (MB/s and ratios).
* ``concurrent`` (with ``--concurrency 1,4,8``): after the rounds, one ``pipeline-2`` group
  serves that many requests at once (each the same greedy request), once per level per
  round: ``tokens_per_s`` = every request's tokens ÷ the wall time from the first request to
  the last ``Finished`` (medians), and ``ratio`` = that ÷ the same at the first level.
  Concurrent requests share each decode step (continuous batching: the one scheduler, see
  :mod:`skulk.engine._scheduler`), so the aggregate should grow with the level.
* ``features``: ``pipeline-2``'s prefix cache (a second turn's TTFT, cached ÷ cold) and n-gram
  speculation (a copy prompt, with ÷ without, on the demo model and on the benchmark's shape
  writing the demo's language), see :mod:`skulk.bench._distributed_features`.

Every measured request's prompt is new to the runner that serves it (numbered), so no prefix
cache shortens a TTFT that is compared with another.

This module runs it; what runs is in ``_distributed_setup``, the measuring in
``_distributed_measure``, the figures made of the readings in ``_distributed_result``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import trio

from skulk.bench._distributed_features import measure_features
from skulk.bench._distributed_measure import measure_all, measure_concurrent
from skulk.bench._distributed_result import Result
from skulk.bench._distributed_setup import TINY_SHAPE, Settings
from skulk.bench._load import never_end


def run(settings: Settings) -> Result:
    """Generate the model, measure every instance over ``settings.rounds`` rounds, then the
    weight transfer (see the module doc)."""
    from skulk.bench import _transfer
    from skulk.models import ensure_demo_model, write_generated_model

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="skulk-bench-distributed-") as tmp:
        root = Path(tmp)
        demo = ensure_demo_model(root / "home")
        model = write_generated_model(
            root / "model", settings.shape, demo, files=settings.files, seed=settings.seed
        )
        never_end(model)  # every greedy request runs to max_tokens, whatever its prompt
        weights = sum(f.stat().st_size for f in model.glob("*.safetensors"))
        tiny = None
        if settings.shape != TINY_SHAPE:
            tiny = write_generated_model(root / "tiny", TINY_SHAPE, demo, seed=settings.seed)
            never_end(tiny)
        singles, runs, runtime = trio.run(measure_all, settings, model, tiny)
        concurrent = trio.run(measure_concurrent, settings, model)
        speaking = write_generated_model(
            root / "speaking", settings.shape, demo, seed=settings.seed, language="demo"
        )
        features = measure_features(settings, model, demo, speaking)
    transfer = _transfer.run(settings.transfer_mib, settings.transfer_rounds)
    load = (load_before, os.getloadavg()[0])
    result = Result(settings, singles, runs, runtime, transfer, weights, load, concurrent, features)
    if any(s.finish_reason != "length" for s in result.all_samples()):
        print("warning: a run ended before max_tokens; rates are per token", file=sys.stderr)
    return result
