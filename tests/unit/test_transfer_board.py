"""The board of whole-model transfers a node publishes in its readings (rate, ETA, caps)."""

from __future__ import annotations

from skulk.telemetry import TransferBoard
from skulk.wire.telemetry import MAX_TRANSFERS


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_rate_and_eta_come_from_the_last_seconds_of_updates() -> None:
    clock = Clock()
    board = TransferBoard(clock, wall=lambda: 5.0)
    board.start("org/m", "hub", 1000)
    (record,) = board.snapshot()
    assert (record.bytes_done, record.bytes_total, record.eta_s, record.started_at) == (
        0, 1000, None, 5.0,
    )  # fmt: skip
    clock.now += 1
    board.update("org/m", 100, 1000, "model.safetensors", 100, 900)
    record = board.get("org/m")
    assert record is not None
    assert record.rate_bps == 100.0 and record.eta_s == 9.0
    assert (record.file, record.file_done, record.file_total) == ("model.safetensors", 100, 900)
    for _ in range(10):  # faster now: the old samples leave the window
        clock.now += 1
        board.update("org/m", record.bytes_done + 50, 1000)
        record = board.get("org/m")
        assert record is not None
    assert record.rate_bps == 50.0
    board.finish("org/m")
    assert board.snapshot() == ()


def test_progress_is_clamped_and_unknown_models_are_ignored() -> None:
    board = TransferBoard(Clock())
    board.update("nothing", 5, 10)
    assert board.snapshot() == ()
    board.start("m", "peers", 10)
    board.update("m", 50, 10)
    record = board.get("m")
    assert record is not None and record.bytes_done == 10 and record.eta_s is None


def test_at_most_max_transfers_are_listed() -> None:
    board = TransferBoard(Clock())
    for i in range(MAX_TRANSFERS + 3):
        board.start(f"m{i:02d}", "peers", 1)
    assert len(board.snapshot()) == MAX_TRANSFERS
    board.finish("m00")
    board.start("late", "hub", 1)
    assert board.get("late") is not None
