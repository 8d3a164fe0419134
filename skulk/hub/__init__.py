"""Models from the Hugging Face Hub, with ``huggingface_hub`` (never an HTTP client of ours).

* :func:`parse_hub_ref` / :func:`looks_like_hub_ref`: ``ORG/REPO[@REVISION]``;
* :func:`check`: before any weight byte moves, the revision's commit, the files a runner
  needs with their sizes and the Hub's hashes, config.json's architecture checked against
  what mlx-lm loads, the total size; offline, the same from the local Hub cache; a
  :class:`HubPlan` whose ``cached_snapshot`` says when the local Hub cache already holds it;
* :func:`download`: a plan's files into a staging directory the caller owns, resumable
  (a cut re-sends at most :data:`CHUNK_BYTES`), each verified against the Hub's hash, with
  progress (:class:`DownloadProgress`) through a callback;
* :func:`pull`: check, room in the node's :class:`~skulk.store.ModelStore`, download and
  commit in one call: a model the store or the local Hub cache already holds moves no byte.

Failures are :class:`HubError` subclasses with a stable ``reason``: ``repo_not_found``,
``revision_not_found``, ``gated``, ``unsupported_architecture``, ``no_weights``,
``hub_unreachable``, ``hash_mismatch``, ``offline_missing``, ``cancelled``. Every Hub call
has a deadline and retries back off (:class:`HubPolicy`). All of it is blocking: call it
from a worker thread (``trio.to_thread.run_sync``), forwarding progress to Trio.

The endpoint is ``HF_ENDPOINT`` read at call time (or ``endpoint=``), so tests point the
real client at a local Hub (``tests/hubserver.py``).
"""

from skulk.hub._calls import HubPolicy
from skulk.hub._download import CHUNK_BYTES, download
from skulk.hub._errors import (
    DownloadCancelled,
    Gated,
    HashMismatch,
    HubError,
    HubUnreachable,
    NoWeights,
    OfflineMissing,
    RepoNotFound,
    RevisionNotFound,
    UnsupportedArchitecture,
)
from skulk.hub._plan import HubFile, HubPlan, check, default_cache_dir, mlx_lm_module
from skulk.hub._progress import DownloadProgress, ProgressCallback
from skulk.hub._pull import pull, pull_names
from skulk.hub._ref import HubRef, looks_like_hub_ref, parse_hub_ref

__all__ = [
    "CHUNK_BYTES",
    "DownloadCancelled",
    "DownloadProgress",
    "Gated",
    "HashMismatch",
    "HubError",
    "HubFile",
    "HubPlan",
    "HubPolicy",
    "HubRef",
    "HubUnreachable",
    "NoWeights",
    "OfflineMissing",
    "ProgressCallback",
    "RepoNotFound",
    "RevisionNotFound",
    "UnsupportedArchitecture",
    "check",
    "default_cache_dir",
    "download",
    "looks_like_hub_ref",
    "mlx_lm_module",
    "parse_hub_ref",
    "pull",
    "pull_names",
]
