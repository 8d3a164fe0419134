"""Weights between nodes: a model's manifest, and byte ranges of its files on a data stream.

**Manifest.** :class:`Manifest` lists every file a runner needs from a model directory (config,
tokenizer files, ``*.safetensors``, the safetensors index) with its size and sha256; for a
safetensors file also its header (the 8-byte length and the JSON header: the bytes before
the tensor data) and every tensor with its byte range ``[start, end)`` in the file and the
sha256 of those bytes. Its canonical CBOR encoding (a tagged map, ``cbor2`` canonical
form) is hashed into the model card's ``manifest_sha256``; :mod:`skulk.models` builds it.

**Protocol.** A node fetching weights calls rpc ``transfer.manifest`` (body: one
:class:`ManifestRequest`, answered by one :class:`ManifestPart`: the manifest's bytes from
``offset``, at most 1 MiB per part) and rpc ``transfer.ranges`` (body: one
:class:`RangeRequest`, answered by :class:`RangesAccepted`) on a node holding the model; the
calling node is the link's authenticated peer. Once a range request is accepted, the holder
opens a data stream to the caller whose chunks are transfer items, one per chunk:

1. one :class:`TransferHeader` naming the request;
2. *data items*: the byte :data:`TRANSFER_DATA_TAG` (``0x00``) followed by the next bytes of
   the requested ranges, in request order, concatenated (a chunk may span ranges). Raw, not
   CBOR: a file's bytes are never CBOR-encoded or decoded;
3. exactly one :class:`TransferEnd` (every byte was sent) or :class:`TransferFailed`, sent
   as the stream's end chunk.

The caller stops the stream (data-stream stop) to abandon it. Refusals are rpc errors with a
reason: ``bad_request``, ``unknown_model``, ``not_holder``, ``no_manifest``,
``manifest_mismatch``, ``unknown_file``, ``bad_range``, ``overloaded``, ``preparing``,
``not_serving``, ``no_link``.
"""

from __future__ import annotations

import attrs

# ---- the manifest ----------------------------------------------------------------------------


@attrs.frozen
class TensorEntry:
    """One tensor of a safetensors file: its bytes are ``[start, end)`` of the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int
    sha256: bytes


@attrs.frozen
class FileEntry:
    """One file of a model directory (a plain name, no directories). ``header_length`` is the
    number of bytes before a safetensors file's tensor data (8 + the JSON header's length) and
    ``header_sha256`` their hash; both ``None`` for other files, whose ``tensors`` is empty."""

    name: str
    size: int
    sha256: bytes
    header_length: int | None
    header_sha256: bytes | None
    tensors: tuple[TensorEntry, ...]


@attrs.frozen
class Manifest:
    """Every file a runner needs, sorted by name (each file's tensors by ``start``)."""

    files: tuple[FileEntry, ...]


# ---- rpc bodies ------------------------------------------------------------------------------


@attrs.frozen
class ManifestRequest:
    """Send the manifest of ``model`` from byte ``offset`` on; refused unless its hash on the
    called node is ``manifest_sha256`` (the card's)."""

    model: str
    manifest_sha256: str
    offset: int


@attrs.frozen
class ByteRange:
    """Bytes ``[start, end)`` of a file (``start < end``)."""

    start: int
    end: int


@attrs.frozen
class RangeRequest:
    """Stream the bytes of ``ranges`` (sorted, not overlapping, inside the file) of ``file``
    (named in the manifest) of ``model`` back under ``request_id`` (unique per calling node)."""

    request_id: str
    model: str
    manifest_sha256: str
    file: str
    ranges: tuple[ByteRange, ...]


TransferRequest = ManifestRequest | RangeRequest


@attrs.frozen
class ManifestPart:
    """The manifest's bytes from the request's offset on (``body`` may be shorter than the
    rest: ask again from the next offset); ``total`` is the manifest's length."""

    total: int
    body: bytes


@attrs.frozen
class RangesAccepted:
    """The request ``request_id`` was accepted: ``length`` bytes follow on a data stream."""

    request_id: str
    length: int


TransferReply = ManifestPart | RangesAccepted


# ---- the data stream -------------------------------------------------------------------------


@attrs.frozen
class TransferHeader:
    """The first chunk of a transfer stream: which request it answers."""

    request_id: str


@attrs.frozen
class TransferEnd:
    """Every requested byte was sent: the end of the stream."""


@attrs.frozen
class TransferFailed:
    """The holder cannot send the rest (``read_failed``, ``model_changed``, ``stopping``,
    ``internal_error``): the end of the stream."""

    reason: str
    message: str


TransferItem = TransferHeader | TransferEnd | TransferFailed
"""The CBOR items of a transfer stream (every chunk that is not a data item)."""

TRANSFER_DATA_TAG = 0x00
"""The first byte of a transfer stream's data item (the file bytes follow, at least one). A
CBOR :data:`TransferItem` is a map, whose first byte is never 0x00."""
