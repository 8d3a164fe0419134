"""ClusterControl's Hub check (the real huggingface_hub client against the local endpoint of
tests/hubserver.py): the plan, each typed failure before any weight byte moves, the node's
token and offline switch, and a pull or a registration of a Hub id that ends typed at the
check without asking the leader anything."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio

from skulk.cluster import State
from skulk.control import ClusterControl
from skulk.hub import Gated, HubError, OfflineMissing, RepoNotFound, RevisionNotFound
from tests.hubserver import HubServer, hub, repo_files, tiny_model

__all__ = ["hub", "tiny_model"]  # fixtures


class NoLeader:
    """A control whose leader is never asked: a test fails if a call reaches it."""

    def __init__(self) -> None:
        self.state = State()
        self.applied = 0
        self.leader = None

    async def wait_applied(self, seen: int) -> None:
        await trio.sleep_forever()


def control(token: str | None = None, *, offline: bool = False) -> ClusterControl:
    def no_card(name: str) -> Any:
        raise AssertionError(f"a Hub id must not be made a card from a directory: {name}")

    consensus: Any = SimpleNamespace(driver=NoLeader())
    mesh: Any = None  # never used: nothing reaches the leader
    return ClusterControl(
        "a", consensus, mesh, dict, card_for=no_card, hub_token=token, offline=offline
    )


def weights_served(hub: HubServer) -> int:
    return sum(n for (_, file), n in hub.served.items() if file.endswith(".safetensors"))


async def test_check_hub_plans_a_model_before_any_weight_byte(
    hub: HubServer, tiny_model: Path
) -> None:
    repo = hub.add_repo("org/tiny", repo_files(tiny_model))
    plan = await control().check_hub("org/tiny")
    assert plan.commit == repo.commit and plan.model_type == "llama"
    assert plan.total_bytes == sum(len(f.data) for f in repo.files.values())
    pinned = await control().check_hub(f"org/tiny@{repo.commit}")
    assert pinned.files == plan.files
    assert weights_served(hub) == 0


@pytest.mark.parametrize(
    ("name", "error", "reason"),
    [
        ("org/nothing", RepoNotFound, "repo_not_found"),
        ("org/tiny@v9", RevisionNotFound, "revision_not_found"),
        ("org/gated", Gated, "gated"),
    ],
)
async def test_check_hub_fails_typed_naming_the_repo(
    hub: HubServer, tiny_model: Path, name: str, error: type[HubError], reason: str
) -> None:
    hub.add_repo("org/tiny", repo_files(tiny_model))
    hub.add_repo("org/gated", repo_files(tiny_model), gated_token="hf_right")
    with pytest.raises(error, match=name.split("@")[0]) as info:
        await control().check_hub(name)
    assert info.value.reason == reason
    assert weights_served(hub) == 0


async def test_check_hub_uses_the_nodes_token(hub: HubServer, tiny_model: Path) -> None:
    hub.add_repo("org/gated", repo_files(tiny_model), gated_token="hf_right")
    with pytest.raises(Gated) as info:
        await control("hf_wrong").check_hub("org/gated")
    assert info.value.status == 403
    assert (await control("hf_right").check_hub("org/gated")).model_type == "llama"


async def test_an_offline_node_checks_its_hub_cache_only(hub: HubServer, tiny_model: Path) -> None:
    hub.add_repo("org/tiny", repo_files(tiny_model))
    asked = len(hub.requests)
    with pytest.raises(OfflineMissing) as info:
        await control(offline=True).check_hub("org/tiny")
    assert info.value.reason == "offline_missing"
    assert len(hub.requests) == asked  # the Hub was not asked


@pytest.mark.parametrize("name", ["", "not a repo", "org/", "/abs/path", "org/m@"])
async def test_check_hub_of_a_name_that_is_no_hub_id_is_a_value_error(name: str) -> None:
    with pytest.raises(ValueError):
        await control().check_hub(name)


async def test_a_pull_and_a_registration_end_typed_at_the_check(
    hub: HubServer, tiny_model: Path
) -> None:
    node = control()
    statuses = node.pull("org/nothing")
    first = await statuses.__anext__()
    assert (first.model, first.phase) == ("org/nothing", "checking")
    with pytest.raises(RepoNotFound):
        await statuses.__anext__()
    with pytest.raises(RepoNotFound):
        await node.register_model("org/nothing")
    hub.add_repo("org/gated", repo_files(tiny_model), gated_token="hf_right")
    with pytest.raises(Gated):
        await node.register_model("org/gated@main")
    assert weights_served(hub) == 0
