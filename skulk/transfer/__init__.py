"""Weights travel inside the cluster: a node fetches the tensors a shard needs from a node that
holds the model, over the authenticated federation link (rpc to ask, a credit-controlled data
stream for the bytes; never through the Raft log), verified against the manifest whose hash
the model card in the State carries, written so that a fetch resumes after a lost link or a
restart.

The holder's side (every node; serves the models its store holds, and those the State lists it
as holding from a local path)::

    from skulk.transfer import WeightServer, TRANSFER_METHODS

    weights = WeightServer(mesh, lambda model: control.state.model(model), home, store=store)
    await nursery.start(weights.run)
    # in the mesh's rpc handler: each of TRANSFER_METHODS -> weights.handle_rpc

The fetching side::

    from skulk.transfer import WeightClient, fetch_model, fetch_whole, is_transfer_stream

    client = WeightClient(mesh)
    # in the mesh's stream handler:
    #     if await is_transfer_stream(receiver): await client.handle_stream(peer, receiver)
    #     else: ... (routing's streams)
    # a shard's tensors (the store's copy if it holds the model; a fetch that completes the
    # model puts it into the store and calls on_complete(card): register as a holder)
    directory = await fetch_model(client, card, shard_slice, home, progress=report,
                                  store=store, on_complete=register_as_holder)
    # the whole model into the store (spreading), from several holders at once;
    # progress(done, total, file, file_done, file_total)
    stored = await fetch_whole(client, card, home, store, holders=holders, progress=board)

See :mod:`skulk.transfer._fetch` for what is fetched and where, :mod:`skulk.transfer._run` for
how (batches over holders, checks, records, retries: :class:`FetchPolicy`),
:mod:`skulk.transfer._errors` for the typed failures (:class:`NoHolderReachable`,
:class:`DiskFull`, ...), and :mod:`skulk.wire.transfer` for the frames.
"""

from ._client import WeightClient
from ._errors import DiskFull, NoHolderReachable
from ._fetch import fetch_model, fetch_whole
from ._protocol import CHUNK_SIZE, TRANSFER_METHODS, is_transfer_stream
from ._run import FetchPolicy, FileProgress, Progress
from ._server import WeightServer
from ._store import store_directory

__all__ = [
    "CHUNK_SIZE",
    "TRANSFER_METHODS",
    "DiskFull",
    "FetchPolicy",
    "FileProgress",
    "NoHolderReachable",
    "Progress",
    "WeightClient",
    "WeightServer",
    "fetch_model",
    "fetch_whole",
    "is_transfer_stream",
    "store_directory",
]
