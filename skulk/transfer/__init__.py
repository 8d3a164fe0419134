"""Weights travel inside the cluster: a node fetches the tensors a shard needs from a node that
holds the model, over the authenticated federation link (rpc to ask, a credit-controlled data
stream for the bytes; never through the Raft log), verified against the manifest whose hash
the model card in the State carries, written so that a fetch resumes after a lost link or a
restart.

The holder's side (every node; serves only models the State lists it as holding)::

    from skulk.transfer import WeightServer, TRANSFER_METHODS

    weights = WeightServer(mesh, lambda model: control.state.model(model), home, store=store)
    await nursery.start(weights.run)
    # in the mesh's rpc handler: each of TRANSFER_METHODS -> weights.handle_rpc

The fetching side::

    from skulk.transfer import WeightClient, fetch_model, is_transfer_stream

    client = WeightClient(mesh)
    # in the mesh's stream handler:
    #     if await is_transfer_stream(receiver): await client.handle_stream(peer, receiver)
    #     else: ... (routing's streams)
    directory = await fetch_model(client, card, shard_slice, home, progress=report,
                                  store=store, on_complete=register_as_holder)
    stored = await fetch_whole(client, card, home, store, holders=holders, progress=report5)

See :mod:`skulk.transfer._fetch` for what is fetched, checked and recorded (and its policy),
:mod:`skulk.transfer._errors` for the typed failures (:class:`NoHolderReachable`,
:class:`DiskFull`, ...), and :mod:`skulk.wire.transfer` for the frames.
"""

from ._client import WeightClient
from ._errors import DiskFull, NoHolderReachable
from ._fetch import fetch_model, fetch_whole
from ._protocol import CHUNK_SIZE, TRANSFER_METHODS, is_transfer_stream
from ._run import FetchPolicy
from ._server import WeightServer
from ._store import store_directory

__all__ = [
    "CHUNK_SIZE",
    "TRANSFER_METHODS",
    "DiskFull",
    "FetchPolicy",
    "NoHolderReachable",
    "WeightClient",
    "WeightServer",
    "fetch_model",
    "fetch_whole",
    "is_transfer_stream",
    "store_directory",
]
