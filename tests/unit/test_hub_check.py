"""check(): what a Hub model is before any weight byte moves (the real huggingface_hub client
against the local endpoint of tests/hubserver.py), and each typed failure."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from huggingface_hub import snapshot_download

from skulk.hub import (
    Gated,
    HubError,
    HubFile,
    HubPolicy,
    HubUnreachable,
    NoWeights,
    OfflineMissing,
    RepoNotFound,
    RevisionNotFound,
    UnsupportedArchitecture,
    check,
    mlx_lm_module,
)
from skulk.models import is_weight_file
from tests.hubserver import HubServer, hub, repo_files, tiny_model

__all__ = ["hub", "tiny_model"]  # fixtures


def etags(files: tuple[HubFile, ...]) -> list[tuple[str, int, str]]:
    return [(f.name, f.size, f.etag) for f in files]


FAST = HubPolicy(call_timeout_s=5.0, attempts=2, backoff_s=0.01)


def test_plan_lists_what_a_runner_needs_with_the_hubs_hashes(
    hub: HubServer, tiny_model: Path
) -> None:
    files = repo_files(tiny_model)
    files["README.md"] = b"# a model card\n"
    files["original/consolidated.pth"] = b"not for mlx"
    files[".gitattributes"] = b"*.safetensors filter=lfs\n"
    repo = hub.add_repo("org/tiny", files)

    plan = check("org/tiny")

    assert plan.commit == repo.commit and str(plan.ref) == "org/tiny"  # as asked
    assert plan.model_type == "llama"
    assert plan.endpoint == hub.url
    names = [f.name for f in plan.files]
    assert names == sorted(n for n in files if is_weight_file(n))
    assert "README.md" not in names and "original/consolidated.pth" not in names
    for f in plan.files:
        served = repo.files[f.name]
        assert f.size == len(served.data)
        if f.name.endswith(".safetensors"):
            assert f.sha256 == served.sha256
        else:
            assert f.sha256 is None and f.git_sha1 == served.git_sha1
    assert plan.total_bytes == sum(len(repo.files[n].data) for n in names)
    assert plan.cached_snapshot is None
    assert plan.name == f"org/tiny@{repo.commit}"
    # no weight byte moved: only the revision info and config.json were read
    assert all(key[1] == "config.json" for key in hub.served)


def test_pinned_commit_and_branch_give_the_same_plan(hub: HubServer, tiny_model: Path) -> None:
    repo = hub.add_repo("org/tiny", repo_files(tiny_model))
    assert check(f"org/tiny@{repo.commit}").files == check("org/tiny@main").files


def test_repo_not_found(hub: HubServer) -> None:
    with pytest.raises(RepoNotFound, match="org/nothing") as info:
        check("org/nothing")
    assert info.value.reason == "repo_not_found" and info.value.repo == "org/nothing"


def test_revision_not_found(hub: HubServer, tiny_model: Path) -> None:
    hub.add_repo("org/tiny", repo_files(tiny_model))
    with pytest.raises(RevisionNotFound, match="org/tiny has no revision 'v9'") as info:
        check("org/tiny@v9")
    assert info.value.reason == "revision_not_found"


def test_gated_without_a_token_then_with_a_wrong_one_then_the_right_one(
    hub: HubServer, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo("org/gated", repo_files(tiny_model), gated_token="hf_right")
    with pytest.raises(Gated, match=r"org/gated.*HTTP 401.*set HF_TOKEN") as info:
        check("org/gated")
    assert info.value.reason == "gated" and info.value.status == 401
    with pytest.raises(Gated, match=r"HTTP 403.*has no access"):
        check("org/gated", token="hf_wrong")
    assert check("org/gated", token="hf_right").model_type == "llama"
    monkeypatch.setenv("HF_TOKEN", "hf_right")  # what the CLI relies on
    assert check("org/gated").model_type == "llama"
    assert not any(key[1].endswith(".safetensors") for key in hub.served)


def test_unsupported_architecture(hub: HubServer, tiny_model: Path) -> None:
    files = repo_files(tiny_model)
    files["config.json"] = json.dumps({"model_type": "no_such_arch_xyz"}).encode()
    hub.add_repo("org/odd", files)
    with pytest.raises(UnsupportedArchitecture, match="org/odd: model_type 'no_such_arch_xyz'"):
        check("org/odd")
    files["config.json"] = b"{not json"
    hub.add_repo("org/broken", files)
    with pytest.raises(UnsupportedArchitecture, match="not JSON"):
        check("org/broken")
    files["config.json"] = json.dumps({"model_type": "../llama"}).encode()
    hub.add_repo("org/sneaky", files)
    with pytest.raises(UnsupportedArchitecture) as info:
        check("org/sneaky")
    assert info.value.reason == "unsupported_architecture"
    del files["config.json"]
    hub.add_repo("org/noconfig", files)
    with pytest.raises(UnsupportedArchitecture, match=r"no config\.json"):
        check("org/noconfig")


def test_mlx_lm_decides_as_mlx_lm_does() -> None:
    assert mlx_lm_module({"model_type": "llama"}) == "llama"
    assert mlx_lm_module({"model_type": "mistral"}) == "llama"  # mlx-lm's remapping
    assert mlx_lm_module({"model_type": "qwen2"}) == "qwen2"
    assert mlx_lm_module({"model_type": "bert_nothing"}) is None
    assert mlx_lm_module({"model_type": 3}) is None
    assert mlx_lm_module({}) is None


def test_no_weights(hub: HubServer, tiny_model: Path) -> None:
    files = {n: b for n, b in repo_files(tiny_model).items() if not n.endswith(".safetensors")}
    files["pytorch_model.bin"] = b"\0" * 64
    hub.add_repo("org/torch", files)
    with pytest.raises(NoWeights, match="org/torch has no safetensors") as info:
        check("org/torch")
    assert info.value.reason == "no_weights"


def test_hub_unreachable_after_the_retries(hub: HubServer) -> None:
    hub.go_away()
    with pytest.raises(HubUnreachable, match="unreachable after 2 attempts") as info:
        check("org/tiny", policy=FAST)
    assert info.value.reason == "hub_unreachable" and info.value.endpoint == hub.url


def test_offline_uses_the_local_hub_cache_and_nothing_else(
    hub: HubServer, tiny_model: Path, tmp_path: Path
) -> None:
    repo = hub.add_repo("org/tiny", repo_files(tiny_model))
    cache = tmp_path / "hf-home" / "hub"
    snapshot = Path(snapshot_download("org/tiny", cache_dir=cache, endpoint=hub.url))

    online = check("org/tiny")
    assert online.cached_snapshot == snapshot  # already there: import it, no download

    hub.go_away()
    offline = check("org/tiny", offline=True)
    assert offline.commit == repo.commit and offline.cached_snapshot == snapshot
    # the cache's blob names are the Hub's hashes (an LFS file's sha256, a small file's sha1)
    assert etags(offline.files) == etags(online.files)
    assert etags(check(f"org/tiny@{repo.commit}", offline=True).files) == etags(online.files)

    with pytest.raises(OfflineMissing, match="org/other") as info:
        check("org/other", offline=True)
    assert info.value.reason == "offline_missing"
    with pytest.raises(OfflineMissing, match="no cached revision 'v2'"):
        check("org/tiny@v2", offline=True)


def test_offline_from_the_environment_and_an_incomplete_cache(
    hub: HubServer, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub.add_repo("org/tiny", repo_files(tiny_model))
    cache = tmp_path / "hf-home" / "hub"
    snapshot = Path(snapshot_download("org/tiny", cache_dir=cache, endpoint=hub.url))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub.go_away()
    assert check("org/tiny").cached_snapshot == snapshot
    (snapshot / "model-00002-of-00002.safetensors").unlink()  # a shard the index names
    with pytest.raises(OfflineMissing, match=r"missing model-00002-of-00002\.safetensors"):
        check("org/tiny")


def test_an_overloaded_hub_is_retried_with_backoff(hub: HubServer, tiny_model: Path) -> None:
    hub.add_repo("org/tiny", repo_files(tiny_model))
    hub.fail_next(2)
    policy = HubPolicy(call_timeout_s=5.0, attempts=3, backoff_s=0.01)
    assert check("org/tiny", policy=policy).model_type == "llama"
    hub.fail_next(3)
    with pytest.raises(HubUnreachable, match=r"after 3 attempts \(HTTP 503\)"):
        check("org/tiny", policy=policy)


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"sha": None}, "no commit sha"),
        ({"sha": "main"}, "no commit sha"),
        ({"siblings": [{"rfilename": "config.json"}]}, "bad size None listed for config.json"),
        (
            {"siblings": [{"rfilename": "config.json", "size": -1, "blobId": "0" * 40}]},
            "bad size -1",
        ),
        ({"siblings": [{"rfilename": "config.json", "size": 3}]}, "no hash listed for config"),
        (
            {
                "siblings": [
                    {
                        "rfilename": "model.safetensors",
                        "size": 3,
                        "lfs": {"sha256": "zz", "size": 3, "pointerSize": 1},
                    }
                ]
            },
            "bad LFS sha256 listed for model.safetensors",
        ),
    ],
)
def test_a_malformed_revision_info_is_a_hub_error_naming_it(
    hub: HubServer, tiny_model: Path, patch: dict[str, object], message: str
) -> None:
    hub.add_repo("org/tiny", repo_files(tiny_model))
    hub.patch_info("org/tiny", patch)
    with pytest.raises(HubError, match=message) as info:
        check("org/tiny", policy=FAST)
    assert info.value.reason == "hub_error" and info.value.repo == "org/tiny"


def test_huggingface_hub_in_offline_mode_is_offline_missing(
    hub: HubServer, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.constants

    hub.add_repo("org/tiny", repo_files(tiny_model))
    # as when HF_HUB_OFFLINE=1 was set before huggingface_hub was imported, then unset
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(OfflineMissing, match="huggingface_hub is in offline mode"):
        check("org/tiny", offline=False)
    assert hub.requests == []
