"""download(): a checked plan's files into staging with the real huggingface_hub client
against the local endpoint (tests/hubserver.py): verified, resumed after a cut or a cancel
(bytes re-sent counted by the endpoint), wrong bytes refetched once, then hash_mismatch,
gated, the Hub gone mid-download, progress."""

from __future__ import annotations

import json
import random
import threading
from pathlib import Path

import pytest

from skulk.hub import (
    CHUNK_BYTES,
    DownloadCancelled,
    DownloadProgress,
    Gated,
    HashMismatch,
    HubPlan,
    HubPolicy,
    HubUnreachable,
    check,
    download,
)
from skulk.hub._download import part_path
from skulk.hub._progress import Meter
from skulk.hub._tqdm import forwarding_tqdm
from skulk.models import local_manifest
from tests.hubserver import HubServer, hub, repo_files, tiny_model

__all__ = ["hub", "tiny_model"]  # fixtures

FAST = HubPolicy(call_timeout_s=5.0, attempts=2, backoff_s=0.01)
BIG = "model.safetensors"
BIG_SIZE = 48 * 1024 * 1024 + 12345


def big_repo(hub: HubServer, repo_id: str = "org/big") -> bytes:
    """A repo whose one weight file is large enough to measure a resume (random bytes: the
    Hub never parses them)."""
    body = random.Random(7).randbytes(BIG_SIZE)
    config = json.dumps({"model_type": "llama"}).encode()
    hub.add_repo(repo_id, {"config.json": config, BIG: body})
    return body


def test_download_verified_gives_the_same_model_directory(
    hub: HubServer, tiny_model: Path, tmp_path: Path
) -> None:
    repo = hub.add_repo("org/tiny", repo_files(tiny_model))
    plan = check("org/tiny")
    staging = tmp_path / "staging"
    got = download(plan, staging)

    assert sorted(got) == [f.name for f in plan.files]
    for f in plan.files:
        assert got[f.name] == repo.files[f.name].sha256
    assert local_manifest(staging).sha256 == local_manifest(tiny_model).sha256
    assert sorted(p.name for p in staging.iterdir()) == sorted(got)  # no part file left
    for f in plan.files:  # each file's bytes sent exactly once
        assert hub.served_bytes("org/tiny", f.name) == f.size * (
            2 if f.name == "config.json" else 1
        )

    # a second call finds every file in staging, rehashes it and sends nothing
    before = sum(hub.served.values())
    assert download(plan, staging) == got
    assert sum(hub.served.values()) == before


HALF = BIG_SIZE // 2


@pytest.mark.parametrize(
    "at",
    # half way; and half way moved to just before the end of a read buffer: the worst case
    [HALF, HALF // CHUNK_BYTES * CHUNK_BYTES + CHUNK_BYTES - 1],
    ids=["half", "half-worst-case"],
)
def test_a_cut_at_half_resumes_resending_under_two_percent(
    hub: HubServer, tmp_path: Path, at: int
) -> None:
    body = big_repo(hub)
    plan = check("org/big")
    hub.cut_once("org/big", BIG, at=at)
    got = download(plan, tmp_path / "staging", policy=FAST)

    assert (tmp_path / "staging" / BIG).read_bytes() == body
    assert got[BIG] == plan.files[1].sha256
    resent = hub.served_bytes("org/big", BIG) - BIG_SIZE
    print(f"cut at byte {at}: re-sent {resent} of {BIG_SIZE} bytes ({resent / BIG_SIZE:.4%})")
    assert 0 <= resent <= CHUNK_BYTES
    assert resent / BIG_SIZE <= 0.02
    ranges = [r for m, p, r in hub.requests if m == "GET" and p.endswith(BIG)]
    assert ranges[0] is None and ranges[1] is not None  # the second asked from where it stopped
    start = int(ranges[1].removeprefix("bytes=").rstrip("-"))
    assert start == at - resent


def test_a_cancelled_download_resumes_from_its_part_file(hub: HubServer, tmp_path: Path) -> None:
    body = big_repo(hub)
    plan = check("org/big")
    staging = tmp_path / "staging"
    part = cancelled_at_half(plan, staging)
    kept = part.stat().st_size
    assert BIG_SIZE // 2 <= kept < BIG_SIZE

    got = download(plan, staging)  # a new call (as after a restart): resumes from the part
    assert (staging / BIG).read_bytes() == body and not part.exists()
    assert got[BIG] == plan.files[1].sha256
    last = [r for m, p, r in hub.requests if m == "GET" and p.endswith(BIG)][-1]
    assert last == f"bytes={kept}-"


def test_progress_reports_per_file_and_in_all(hub: HubServer, tmp_path: Path) -> None:
    big_repo(hub)
    plan = check("org/big")
    seen: list[DownloadProgress] = []
    lock = threading.Lock()

    def report(p: DownloadProgress) -> None:
        with lock:
            seen.append(p)

    download(plan, tmp_path / "staging", progress=report)
    assert seen[-1].done == seen[-1].total == plan.total_bytes
    assert [p.done for p in seen] == sorted(p.done for p in seen)  # never goes back
    big = [p for p in seen if p.file == BIG]
    assert big[0].file_done == 0 and big[-1].file_done == BIG_SIZE
    assert all(p.file_total == BIG_SIZE and p.total == plan.total_bytes for p in big)
    assert any(p.rate_bps > 0 and p.eta_s is not None for p in big)
    assert all(p.repo == "org/big" for p in seen)


def test_wrong_bytes_are_fetched_again_once(hub: HubServer, tmp_path: Path) -> None:
    body = big_repo(hub)
    plan = check("org/big")
    hub.corrupt("org/big", BIG, times=1)
    download(plan, tmp_path / "staging")
    assert (tmp_path / "staging" / BIG).read_bytes() == body
    assert hub.served_bytes("org/big", BIG) == 2 * BIG_SIZE


def test_wrong_bytes_twice_is_a_hash_mismatch_and_nothing_is_kept(
    hub: HubServer, tiny_model: Path, tmp_path: Path
) -> None:
    hub.add_repo("org/tiny", repo_files(tiny_model))
    plan = check("org/tiny")
    hub.corrupt("org/tiny", "tokenizer.json", times=2)  # a small (git) file: sha1 checked
    staging = tmp_path / "staging"
    with pytest.raises(HashMismatch, match=r"org/tiny: tokenizer\.json hashed") as info:
        download(plan, staging)
    assert info.value.reason == "hash_mismatch" and info.value.file == "tokenizer.json"
    assert not (staging / "tokenizer.json").exists()
    assert not part_path(
        staging, next(f for f in plan.files if f.name == "tokenizer.json")
    ).exists()


def test_a_gated_repo_without_the_token_downloads_nothing(
    hub: HubServer, tiny_model: Path, tmp_path: Path
) -> None:
    hub.add_repo("org/gated", repo_files(tiny_model), gated_token="hf_right")
    plan = check("org/gated", token="hf_right")
    with pytest.raises(Gated, match="HTTP 401"):
        download(plan, tmp_path / "staging")
    assert sum(hub.served.values()) == plan.files[0].size  # only check()'s config.json
    got = download(plan, tmp_path / "staging", token="hf_right")
    assert local_manifest(tmp_path / "staging").manifest.files[0].sha256.hex() == got["config.json"]


def test_the_hub_gone_mid_download_is_hub_unreachable(hub: HubServer, tmp_path: Path) -> None:
    big_repo(hub)
    plan = check("org/big")
    hub.cut_once("org/big", BIG, at=BIG_SIZE // 2, then_gone=True)
    staging = tmp_path / "staging"
    with pytest.raises(HubUnreachable, match="org/big") as info:
        download(plan, staging, policy=FAST)
    assert info.value.reason == "hub_unreachable" and info.value.attempts == 2
    assert part_path(staging, plan.files[1]).stat().st_size > 0  # kept for a resume


def test_the_meter_reports_while_bytes_move_with_rate_and_eta() -> None:
    now = [0.0]
    seen: list[DownloadProgress] = []
    meter = Meter("org/x", 1000, seen.append, interval=0.25, clock=lambda: now[0])
    meter.start_file("a", 600, 100)  # 100 bytes found in staging: done, not received
    assert seen[-1].done == 100 and seen[-1].eta_s is None
    for _ in range(10):  # 50 bytes every 0.1 s
        now[0] += 0.1
        meter.add(50)
    # a report at most every 0.25 s (and at least that often while bytes keep coming)
    assert len(seen) == 1 + 3
    assert [p.file_done for p in seen[1:]] == [250, 400, 550]
    assert seen[-1].rate_bps == pytest.approx(500.0)
    assert seen[-1].eta_s == pytest.approx((1000 - 550) / 500.0)
    meter.finish_file()
    assert (seen[-1].file, seen[-1].file_done, seen[-1].done) == ("a", 600, 600)
    meter.start_file("b", 400, 0)
    assert (seen[-1].file, seen[-1].done) == ("b", 600)


def test_a_cancel_between_files_keeps_the_finished_ones(
    hub: HubServer, tiny_model: Path, tmp_path: Path
) -> None:
    hub.add_repo("org/tiny", repo_files(tiny_model))
    plan = check("org/tiny")
    staging = tmp_path / "staging"

    def after_two_files() -> bool:
        return (staging / plan.files[1].name).exists()

    with pytest.raises(DownloadCancelled):
        download(plan, staging, cancel_check=after_two_files)
    assert sorted(p.name for p in staging.iterdir()) == [plan.files[0].name, plan.files[1].name]


def test_xet_progress_bars_forward_bytes_written_only() -> None:
    written: list[int] = []
    bar_class = forwarding_tqdm(written.append)
    disk = bar_class(desc="model.safetensors: reconstructing file", total=100)
    network = bar_class(desc="model.safetensors: downloading bytes", total=100)
    disk.update(40)
    network.update(70)
    disk.update(60)
    disk.close()
    network.close()
    assert written == [40, 60]


def cancelled_at_half(plan: HubPlan, staging: Path) -> Path:
    """Start ``plan``'s download and stop it once half the big file is in its part file."""
    part = part_path(staging, plan.files[1])
    with pytest.raises(DownloadCancelled) as info:
        download(
            plan,
            staging,
            cancel_check=lambda: part.exists() and part.stat().st_size >= BIG_SIZE // 2,
        )
    assert info.value.reason == "cancelled" and info.value.repo == "org/big"
    return part


def test_a_server_ignoring_the_range_restarts_the_file_cleanly(
    hub: HubServer, tmp_path: Path
) -> None:
    body = big_repo(hub)
    plan = check("org/big")
    staging = tmp_path / "staging"
    cancelled_at_half(plan, staging)
    hub.ignore_range_once("org/big", BIG)
    before = hub.served_bytes("org/big", BIG)
    got = download(plan, staging)  # asks for the rest, gets everything: truncates, rehashes
    assert (staging / BIG).read_bytes() == body and got[BIG] == plan.files[1].sha256
    assert hub.served_bytes("org/big", BIG) - before == BIG_SIZE  # once, no refetch


def test_damaged_part_files_are_caught(hub: HubServer, tmp_path: Path) -> None:
    body = big_repo(hub)
    plan = check("org/big")
    staging = tmp_path / "staging"
    staging.mkdir()
    part = part_path(staging, plan.files[1])
    part.write_bytes(b"\xff" * (BIG_SIZE + 10))  # longer than the file: not its bytes
    download(plan, staging)
    assert (staging / BIG).read_bytes() == body
    assert hub.served_bytes("org/big", BIG) == BIG_SIZE

    (staging / BIG).unlink()
    part.write_bytes(body[:1000] + b"\0" * (BIG_SIZE // 2))  # a torn tail after a crash
    download(plan, staging)  # resumed, fails verification, fetched again once from zero
    assert (staging / BIG).read_bytes() == body
    assert hub.served_bytes("org/big", BIG) == 2 * BIG_SIZE + (BIG_SIZE - 1000 - BIG_SIZE // 2)

    (staging / BIG).write_bytes(body[:-1] + b"x")  # a damaged finished file in staging
    download(plan, staging)
    assert (staging / BIG).read_bytes() == body
