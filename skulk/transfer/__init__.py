"""Weights travel inside the cluster: a node fetches the tensors a shard needs from a node that
holds the model, over the authenticated federation link (rpc to ask, a credit-controlled data
stream for the bytes; never through the Raft log), verified against the manifest whose hash
the model card in the State carries, written so that a fetch resumes after a lost link or a
restart.

The holder's side (every node; serves only models the State lists it as holding)::

    from skulk.transfer import WeightServer, TRANSFER_METHODS

    weights = WeightServer(mesh, lambda model: control.state.model(model), home)
    await nursery.start(weights.run)
    # in the mesh's rpc handler: each of TRANSFER_METHODS -> weights.handle_rpc

The fetching side::

    from skulk.transfer import WeightClient, fetch_model, is_transfer_stream

    client = WeightClient(mesh)
    # in the mesh's stream handler:
    #     if await is_transfer_stream(receiver): await client.handle_stream(peer, receiver)
    #     else: ... (routing's streams)
    directory = await fetch_model(client, card, shard_slice, home, progress=report)

See :mod:`skulk.transfer._fetch` for what is fetched, checked and recorded, and
:mod:`skulk.wire.transfer` for the frames.
"""

from ._client import TransferStatistics, WeightClient
from ._errors import DiskFull, FetchError, ManifestMismatch, NoHolderReachable, NoManifest
from ._fetch import FetchPolicy, Progress, fetch_model
from ._protocol import (
    CHUNK_SIZE,
    MANIFEST_METHOD,
    RANGES_METHOD,
    TRANSFER_METHODS,
    TransferTimeouts,
    is_transfer_stream,
)
from ._server import WeightServer, WeightServerStatistics
from ._store import store_directory

__all__ = [
    "CHUNK_SIZE",
    "MANIFEST_METHOD",
    "RANGES_METHOD",
    "TRANSFER_METHODS",
    "DiskFull",
    "FetchError",
    "FetchPolicy",
    "ManifestMismatch",
    "NoHolderReachable",
    "NoManifest",
    "Progress",
    "TransferStatistics",
    "TransferTimeouts",
    "WeightClient",
    "WeightServer",
    "WeightServerStatistics",
    "fetch_model",
    "is_transfer_stream",
    "store_directory",
]
