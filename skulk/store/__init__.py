"""The content-addressed model store of one node (blocking file I/O: call from a worker thread).

Layout under the store's root (``<home>/store/``)::

    blobs/<sha256 hex>          one complete, verified, read-only file per content hash
    models/<manifest sha256>/   a model directory mlx-lm loads: a hard link per file to its
                                blob (a copy where links are refused), plus the canonical
                                manifest ``.skulk-manifest.cbor`` (its bytes hash to the name)
    staging/<key>/              downloads and imports in progress (resumable; same file system,
                                so verified files move into ``blobs/`` by rename)
    index.cbor                  names → manifest hash; per model size, last use, names

A file identical across models (revisions, repos, local copies) is one blob. A model's identity
is its manifest hash, never a path. ``models/<hash>/`` appears atomically (built aside, then
renamed) and only once every blob is in; a crash leaves staging or a complete model, never half
of one, and opening the store repairs the rest (:class:`ModelStore`).

* :meth:`ModelStore.import_directory` imports a local model directory by content;
* :meth:`ModelStore.add_verified_file` then :meth:`ModelStore.commit` store a download;
* :meth:`ModelStore.adopt_verified` stores a model verified in staging by hard links (a peer
  fetch: :func:`skulk.transfer.fetch_whole`);
* :meth:`ModelStore.lookup`, :meth:`ModelStore.models`, :meth:`ModelStore.touch` read and use;
* :meth:`ModelStore.remove` (refused in use), :meth:`ModelStore.ensure_room` (LRU eviction
  within the budget and the disk), :meth:`ModelStore.prune` (loose blobs) free space;
* :meth:`ModelStore.verify` hashes a model again; corrupted blobs are deleted, never served.
"""

from skulk.store._errors import MissingBlobs, ModelInUse, NotStored, StoreError, StoreFull
from skulk.store._layout import MANIFEST_NAME
from skulk.store._records import Progress, StoredModel, StoreStatistics, VerifyReport
from skulk.store._store import DEFAULT_RESERVE_BYTES, ModelStore

__all__ = [
    "DEFAULT_RESERVE_BYTES",
    "MANIFEST_NAME",
    "MissingBlobs",
    "ModelInUse",
    "ModelStore",
    "NotStored",
    "Progress",
    "StoreError",
    "StoreFull",
    "StoreStatistics",
    "StoredModel",
    "VerifyReport",
]
