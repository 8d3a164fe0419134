"""The pieces of the weight transfer that need no network: the stream chunk decoder (raw data
items as views, everything else through the strict codec), the batch writer (offsets, hashes,
too much data, whole files renamed only once verified), the store's record and layout, store
names."""

from __future__ import annotations

import hashlib
from pathlib import Path

import cbor2
import pytest

from skulk.transfer._protocol import ITEM_CODEC, decode_item
from skulk.transfer._store import (
    RECORD_NAME,
    BatchWriter,
    CorruptPiece,
    PeerStore,
    Piece,
    TooMuchData,
    part_path,
    pieces_of,
    store_directory,
)
from skulk.wire import WireError
from skulk.wire.transfer import (
    TRANSFER_DATA_TAG,
    FileEntry,
    Manifest,
    TensorEntry,
    TransferEnd,
    TransferFailed,
    TransferHeader,
)


def _decoded(chunk: bytes) -> object:
    try:
        item = decode_item(chunk)
    except WireError:
        return "refused"
    return bytes(item) if isinstance(item, memoryview) else item


@pytest.mark.parametrize("size", [1, 23, 24, 255, 256, 65535, 65536, 300_000])
def test_a_data_item_is_a_view_of_exactly_its_bytes(size: int) -> None:
    data = bytes(range(256)) * (size // 256) + bytes(range(size % 256))
    chunk = bytes([TRANSFER_DATA_TAG]) + data
    item = decode_item(chunk)
    assert isinstance(item, memoryview) and item.obj is chunk and bytes(item) == data


def test_items_that_are_not_data_go_through_the_strict_codec() -> None:
    for item in (TransferHeader("r1"), TransferEnd(), TransferFailed("read_failed", "x")):
        assert _decoded(ITEM_CODEC.encode(item)) == item
    refused = [
        b"",  # no item at all
        bytes([TRANSFER_DATA_TAG]),  # a data item with no bytes
        cbor2.dumps({"t": "TransferBytes", "data": b"xyz"}),  # the old CBOR form: gone
        cbor2.dumps({"t": "TransferEnd", "x": 1}),  # an extra key
        ITEM_CODEC.encode(TransferEnd()) + b"\x00",  # trailing bytes
        b"\x01abc",  # neither a data item nor CBOR
    ]
    for chunk in refused:
        assert _decoded(chunk) == "refused", chunk


def _pieces(tmp_path: Path, blob: bytes, cuts: list[tuple[int, int]]) -> list[Piece]:
    return [
        Piece("f.safetensors", s, e, hashlib.sha256(blob[s:e]).digest(), False) for s, e in cuts
    ]


def test_the_writer_puts_each_piece_at_its_offset_and_verifies_it(tmp_path: Path) -> None:
    blob = bytes(range(200)) * 5
    (tmp_path / "f.safetensors").write_bytes(bytes(len(blob)))  # sparse stand-in
    pieces = _pieces(tmp_path, blob, [(0, 100), (100, 100), (100, 400), (600, 1000)])
    writer = BatchWriter(tmp_path, pieces)
    stream = blob[0:400] + blob[600:1000]
    done: list[Piece] = []
    for at in range(0, len(stream), 150):  # chunks that cross pieces
        done += writer.feed(stream[at : at + 150])
    assert done == pieces and writer.complete and writer.partial == 0
    writer.finish()
    written = (tmp_path / "f.safetensors").read_bytes()
    assert written[:400] == blob[:400] and written[600:] == blob[600:]
    assert written[400:600] == bytes(200)  # the hole stays a hole
    with pytest.raises(TooMuchData):
        BatchWriter(tmp_path, pieces).feed(stream + b"!")


def test_a_piece_that_fails_its_hash_stops_the_writer(tmp_path: Path) -> None:
    blob = bytes(range(100))
    (tmp_path / "f.safetensors").write_bytes(bytes(100))
    pieces = _pieces(tmp_path, blob, [(0, 50), (50, 100)])
    writer = BatchWriter(tmp_path, pieces)
    bad = bytearray(blob)
    bad[70] ^= 1
    with pytest.raises(CorruptPiece) as failed:
        writer.feed(bytes(bad))
    assert failed.value.piece == pieces[1]
    assert writer.verified == pieces[:1] and not writer.complete
    writer.abort()


def test_a_whole_file_appears_only_once_verified(tmp_path: Path) -> None:
    data = b'{"model_type": "llama"}'
    piece = Piece("config.json", 0, len(data), hashlib.sha256(data).digest(), True)
    writer = BatchWriter(tmp_path, [piece])
    writer.feed(data[:5])
    assert not (tmp_path / "config.json").exists()
    assert part_path(tmp_path, "config.json").exists()
    writer.feed(data[5:])
    writer.finish()
    assert (tmp_path / "config.json").read_bytes() == data
    assert not part_path(tmp_path, "config.json").exists()
    writer = BatchWriter(tmp_path, [Piece("other.json", 0, 3, bytes(32), True)])
    writer.abort()  # nothing verified: nothing left behind
    assert not (tmp_path / "other.json").exists()
    assert not part_path(tmp_path, "other.json").exists()


def _manifest() -> Manifest:
    tensor = TensorEntry("w", "F32", (2,), 16, 24, bytes(32))
    return Manifest(
        (
            FileEntry("a.safetensors", 24, bytes(32), 16, bytes(32), (tensor,)),
            FileEntry("config.json", 3, bytes(32), None, None, ()),
        )
    )


def test_the_record_is_kept_only_for_its_manifest_and_present_files(tmp_path: Path) -> None:
    store = PeerStore(tmp_path / "store")
    manifest = _manifest()
    keys = {p.key for f in manifest.files for p in pieces_of(f)}
    assert store.open(manifest, "sha-1") == set()
    assert (store.directory / "a.safetensors").stat().st_size == 24  # sparse, full size
    (store.directory / "config.json").write_bytes(b"abc")
    store.record("sha-1", keys)
    assert (store.directory / RECORD_NAME).is_file()
    assert store.open(manifest, "sha-1") == keys
    assert store.open(manifest, "sha-2") == set()  # another manifest: nothing counts
    (store.directory / "config.json").write_bytes(b"abcd")  # wrong size now
    assert store.open(manifest, "sha-1") == keys - {("config.json", 0, 3)}
    (store.directory / "a.safetensors").unlink()  # gone: made again, nothing verified in it
    assert store.open(manifest, "sha-1") == set()
    assert (store.directory / "a.safetensors").stat().st_size == 24


def test_store_names_are_plain_and_distinct(tmp_path: Path) -> None:
    plain = store_directory(tmp_path, "llama-3.2-1b")
    assert plain == tmp_path / "models" / ".peer" / "llama-3.2-1b"
    hf = store_directory(tmp_path, "mlx-community/Llama-3.2-1B")
    other = store_directory(tmp_path, "mlx-community--Llama-3.2-1B")
    assert hf.parent == plain.parent and "/" not in hf.name and hf != other
    for weird in ("..", ".", "../../etc", "a/../../b", ""):
        path = store_directory(tmp_path, weird)
        assert path.parent == plain.parent and path.name not in (".", "..", "")
