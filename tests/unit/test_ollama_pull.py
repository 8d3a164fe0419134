"""Pull statuses as Ollama's progress lines (skulk.api._ollama_pull), sans-IO."""

from __future__ import annotations

import pytest

from skulk.api._errors import ApiError
from skulk.api._ollama_pull import OllamaPullLines, digest_key
from skulk.api._pull_format import PullRequest, parse_ollama_pull

from .test_model_routes import CHECKING, DONE, Status, transfer


def test_a_download_not_yet_in_telemetry_is_a_spinner_line_once() -> None:
    lines = OllamaPullLines()
    waiting = Status(transfers=())
    assert lines.feed(waiting) == [{"status": "pulling manifest"}, {"status": "downloading org/m"}]
    assert lines.feed(waiting) == []  # the same line is not repeated


def test_only_the_downloaders_transfer_makes_the_bar() -> None:
    lines = OllamaPullLines()
    other = Status(transfers=(("b", transfer("x.safetensors", 7)),))
    assert lines.feed(other)[-1] == {"status": "downloading org/m"}


def test_a_model_already_everywhere_is_manifest_then_success() -> None:
    lines = OllamaPullLines()
    assert lines.feed(CHECKING) == [{"status": "pulling manifest"}]
    assert lines.feed(DONE) == []
    assert [line["status"] for line in lines.finish()] == [
        "verifying sha256 digest", "writing manifest", "success"
    ]  # fmt: skip


def test_finish_alone_still_starts_with_the_manifest() -> None:
    assert OllamaPullLines().finish()[0] == {"status": "pulling manifest"}


def test_the_last_file_bar_is_finished_at_the_end_and_never_overshoots() -> None:
    lines = OllamaPullLines()
    over = Status(transfers=(("a", transfer("w.safetensors", 150, 100)),))
    bar = lines.feed(over)[-1]
    assert bar["completed"] == bar["total"] == 100
    closing = lines.finish()[0]
    assert closing["digest"] == bar["digest"] and closing["completed"] == 100


def test_digests_are_stable_per_repo_commit_and_file() -> None:
    a = digest_key("org/m", "c" * 40, "w.safetensors")
    assert a == digest_key("org/m", "c" * 40, "w.safetensors")
    assert a != digest_key("org/m", "d" * 40, "w.safetensors")
    assert a.startswith("sha256:") and len(a) == 71


@pytest.mark.parametrize(
    ("given", "model"),
    [
        ("org/m", "org/m"),
        ("org/m:latest", "org/m"),
        ("hf.co/org/m", "org/m"),
        ("HF.co/org/m:latest", "org/m"),
        ("huggingface.co/org/m@v2", "org/m@v2"),
    ],
)
def test_ollama_spellings_of_a_hub_model(given: str, model: str) -> None:
    assert parse_ollama_pull({"model": given}).model == model
    assert parse_ollama_pull({"name": given, "stream": False}) == PullRequest(model, False)


@pytest.mark.parametrize("given", ["org/m:Q4_K_M", "hf.co/org/m:", "hf.co/", "org/m:latest:x"])
def test_other_ollama_tags_are_refused_naming_the_field(given: str) -> None:
    with pytest.raises(ApiError) as refused:
        parse_ollama_pull({"model": given})
    assert (refused.value.status, refused.value.param) == (400, "model")
