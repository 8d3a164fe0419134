"""How a fetch cuts its pieces into batches, and its policy's limits."""

from __future__ import annotations

import pytest

from skulk.transfer._run import FetchPolicy, _batches, merged
from skulk.transfer._store import Piece
from skulk.wire.transfer import ByteRange


def piece(file: str, start: int, end: int, *, whole: bool = False) -> Piece:
    return Piece(file, start, end, b"\0" * 32, whole)


def test_batches_hold_consecutive_pieces_of_one_file_up_to_the_size() -> None:
    pieces = [
        piece("config.json", 0, 10, whole=True),
        piece("tokenizer.json", 0, 10, whole=True),
        piece("a.safetensors", 0, 8),
        piece("a.safetensors", 8, 40),
        piece("a.safetensors", 40, 100),
        piece("a.safetensors", 100, 110),
        piece("b.safetensors", 0, 8),
    ]
    batches = _batches(pieces, FetchPolicy(batch_bytes=64))
    assert [[(p.file, p.start) for p in b] for b in batches] == [
        [("config.json", 0)],
        [("tokenizer.json", 0)],
        [("a.safetensors", 0), ("a.safetensors", 8)],
        [("a.safetensors", 40)],  # larger than what is left: a batch of its own
        [("a.safetensors", 100)],
        [("b.safetensors", 0)],
    ]
    assert [p for b in batches for p in b] == pieces  # every piece once, in order
    assert len(_batches(pieces[2:6], FetchPolicy(max_pieces=2))) == 2


def test_merged_ranges_join_adjacent_pieces_and_skip_empty_ones() -> None:
    pieces = [piece("a", 0, 8), piece("a", 8, 8), piece("a", 8, 20), piece("a", 30, 40)]
    assert merged(pieces) == [ByteRange(0, 20), ByteRange(30, 40)]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"batch_bytes": 0},
        {"max_pieces": 0},
        {"max_pieces": 10**6},
        {"retry_rounds": -1},
        {"streams_per_holder": 0},
        {"initial_backoff": 0.0},
    ],
)
def test_a_policy_out_of_bounds_is_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        FetchPolicy(**kwargs)  # type: ignore[arg-type]
