"""The dashboard in a real browser (headless Chromium, driven by Playwright) against three real
nodes on loopback, whose Hub endpoint is the tests' own (``tests/hubserver.py``): through the
page served by A, a pull of a generated repo shows its download moving and ends with the model
in every node's store (a missing repo, a gated one and an unloadable architecture are their
typed refusals), the pulled model is placed by its Hub id, and its Remove is refused while in
use; then the page shows every node by id,
places the demo model on B through its form and sees the runner reach ``ready``, streams a chat
answer, and turns C's health badge to ``error`` once C is SIGKILLed; the browser console stays
free of errors. Fed by the test alone, the page shows health and serving figures (the Models
view fed so: ``test_dashboard_models_browser.py``).

Each step's screenshot is kept under ``test-artifacts/dashboard/`` (``tests/e2e/_browser.py``:
the browser, Debian's ``chromium`` launched by path).
"""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, Route, expect

from skulk.harness import NodeProcess
from skulk.models import ModelShape, ensure_demo_model, write_generated_model
from tests.e2e._browser import FED, page, served_asset, snap
from tests.hubserver import HubServer, repo_files, running_hub

__all__ = ["page"]  # fixtures
pytestmark = pytest.mark.e2e

SECRET = "7c" * 32
MODEL = "skulk-demo"
REPO = "org/dash-tiny"  # served by the tests' Hub endpoint
MISSING = "org/no-such-repo"
GATED = "org/dash-gated"  # its files need a token the nodes lack
BERT = "org/dash-bert"  # config.json names a model_type mlx-lm cannot load
#: Seconds the Hub endpoint pauses after each 64 KiB block of REPO's weights (~13 blocks): the
#: download lasts a few seconds, long enough for the page to show it moving.
HUB_BLOCK_PAUSE = 0.4
DOWN_AFTER = 2.0  # --node-down-after, seconds
#: What the badge may take beyond the down-after deadline: a telemetry round, the feed's tick
#: and a slow shared CI machine.
SLACK = 20.0


@pytest.fixture(scope="module")
def dash_hub(skulk_home: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubServer]:
    """The tests' local Hub endpoint, serving a small generated model as :data:`REPO`, whose
    files it sends slowly (a pause after each 64 KiB block) so that its download is seen."""
    root = tmp_path_factory.mktemp("dash-hub")
    demo = ensure_demo_model(skulk_home)
    model = write_generated_model(root / "tiny", ModelShape(layers=2), demo, files=2, seed=5)
    files = repo_files(model)
    config = {**json.loads(files["config.json"]), "model_type": "bert"}
    with running_hub() as server:
        server.add_repo(REPO, files)
        server.add_repo(GATED, files, gated_token="hf_" + "0" * 34)
        server.add_repo(BERT, {**files, "config.json": json.dumps(config).encode()})
        counted = server._count

        def slowly(key: tuple[str, str], n: int) -> None:
            counted(key, n)
            if key[1].endswith(".safetensors"):
                time.sleep(HUB_BLOCK_PAUSE)

        server._count = slowly  # type: ignore[method-assign]
        yield server


@pytest.fixture(scope="module")
def nodes(
    skulk_home: Path, dash_hub: HubServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("dash-cluster")
    started: dict[str, NodeProcess] = {}

    def start(name: str, *args: str) -> NodeProcess:
        home = root / name
        home.mkdir()
        (home / "models").symlink_to(skulk_home / "models")  # one demo model for all
        env = {"SKULK_CLUSTER_SECRET": SECRET, "HF_ENDPOINT": dash_hub.url,
               "HF_HOME": str(home / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}  # fmt: skip
        node = NodeProcess(home, *args, env=env)
        started[name] = node
        return node.start(wait_ready=False)

    try:
        a = start("a", "--model", "none", "--node-down-after", str(DOWN_AFTER))
        start("b", "--join", a.ws_url, "--model", "none")
        start("c", "--join", a.ws_url, "--model", "none")

        def all_up() -> bool:  # and each with its store published (a pull needs them)
            rows = a.get("/v1/cluster/nodes").json()["nodes"]
            return len([r for r in rows if r.get("status") == "up" and r.get("store")]) == 3

        a.wait_for(all_up, 90, "every node up in A's State, with its store")
        yield started
    finally:
        for node in started.values():
            node.stop()


def test_the_dashboard_pulls_from_the_hub_stores_places_and_removes(
    nodes: dict[str, NodeProcess], page: tuple[Page, list[str]]
) -> None:
    """Runs first (before a node is killed): through A's page, a repo the Hub lacks, a gated
    one and one of an architecture mlx-lm cannot load are each their typed refusal (404, 401,
    422) with what to do; a pull of :data:`REPO` shows its download moving
    (per node, file, bytes, rate) and ends ``done``, the model in all three stores; placed by
    its Hub id through the placement form, A's Remove of it is refused while the instance
    uses it, and is done once the instance is removed."""
    tab, errors = page
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    tab.goto(a.url + "/")
    expect(tab.locator("#feed")).to_have_text("live", timeout=15_000)

    # Typed refusals before any weight byte moves: code, status, the node's message, remedy.
    refusals = [
        (MISSING, 404, "repo_not_found", "Check the id"),
        (GATED, 401, "gated", "HF_TOKEN"),
        (BERT, 422, "unsupported_architecture", "mlx-lm"),
    ]
    for repo, status, code, remedy in refusals:
        tab.fill("#pull-model", repo)
        tab.click("#pull")
        failure = tab.locator(f'[data-testid="pull-error"][data-code="{code}"]')
        expect(failure).to_contain_text(f"{code} ({status})", timeout=30_000)
        expect(failure).to_contain_text(repo)
        expect(failure).to_contain_text(remedy)
        snap(tab, f"10-pull-{status}")

    tab.fill("#pull-model", REPO)
    tab.click("#pull")
    # The download moving, in the pull's own view and under Downloads (the feed's telemetry).
    moving = tab.locator('[data-testid^="pull-transfer-"]').filter(has_text="the Hub")
    expect(moving.first).to_contain_text("/s", timeout=60_000)
    expect(tab.locator("#pull-status")).to_have_attribute("data-phases", re.compile("downloading"))
    listed = tab.locator(f'#downloads [data-testid$="-{REPO}"]').filter(has_text="the Hub")
    expect(listed.first).to_contain_text("safetensors", timeout=30_000)
    snap(tab, "11-pull-progress")
    expect(tab.locator("#pull-status")).to_have_attribute("data-phase", "done", timeout=120_000)
    expect(tab.locator('[data-testid="pulled"]')).to_contain_text("in the store of 3 nodes")
    state = a.get("/v1/cluster/state").json()
    sha = next(m["manifest_sha256"] for m in state["models"] if m["id"] == REPO)
    for node in (a, b, c):  # every node's store lists it (the others' by their readings)
        row = tab.locator(f'[data-testid="stored-{node.node_id}-{sha}"]')
        expect(row).to_contain_text(REPO, timeout=30_000)
        expect(row).to_contain_text("3: ")  # three holders
    snap(tab, "12-pulled-stores")

    # Placed by its Hub id, through the placement form ("Place it" fills the model in).
    tab.click("#pull-place")
    expect(tab.locator("#place-model")).to_have_value(REPO)
    tab.check(f'#place-nodes input[value="{a.node_id}"]')
    tab.click("#place")
    expect(tab.locator('[data-testid="placed"]')).to_be_visible(timeout=60_000)
    instance = a.get("/v1/instances").json()["instances"][0]
    assert instance["model"] == REPO and instance["shards"][0]["node"] == a.node_id

    # A's Remove is refused while the instance uses the model: the refusal is shown.
    remove = tab.locator(f'[data-testid="store-remove-{a.node_id}-{sha}"]')
    remove.click()
    expect(remove).to_have_text("Confirm remove")
    remove.click()
    refusal = tab.locator('[data-testid="store-refusal"]')
    expect(refusal).to_contain_text("model_in_use (409)", timeout=15_000)
    expect(refusal).to_contain_text(instance["id"])
    snap(tab, "13-remove-refused")

    # The instance removed, Remove is done: A's answer is shown, and the model stays off A (the
    # cluster's spreading does not fetch a removed model back) while B keeps its copy.
    tab.click(f'[data-testid="remove-{instance["id"]}"]')
    tab.click(f'[data-testid="remove-{instance["id"]}"]')
    expect(tab.locator(f'[data-testid="phase-{instance["id"]}-r0"]')).to_have_count(
        0, timeout=30_000
    )
    remove.click()
    remove.click()
    removed = tab.locator('[data-testid="store-removed"]')
    expect(removed).to_contain_text(f"Removed {REPO}")
    expect(removed).to_contain_text(a.node_id)
    expect(tab.locator(f'[data-testid="stored-{b.node_id}-{sha}"]')).to_contain_text(REPO)
    gone = tab.locator(f'[data-testid="stored-{a.node_id}-{sha}"]')
    expect(gone).to_have_count(0, timeout=15_000)
    tab.wait_for_timeout(6_000)  # three store samples, several spreading rounds
    expect(gone).to_have_count(0)
    snap(tab, "14-removed")
    assert all(re.search(r" (401|404|409|422) ", e) for e in errors), errors


def test_the_dashboard_shows_places_chats_and_sees_a_node_die(
    nodes: dict[str, NodeProcess], page: tuple[Page, list[str]]
) -> None:
    tab, errors = page
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    tab.goto(a.url + "/")
    expect(tab.locator("#feed")).to_have_text("live", timeout=15_000)

    # Topology: every node by id, each with a health badge; A's link to each peer has an RTT.
    for node in (a, b, c):
        card = tab.locator(f'[data-testid="node-{node.node_id}"]')
        expect(card).to_contain_text(node.node_id, timeout=15_000)
        expect(tab.locator(f'[data-testid="badge-{node.node_id}"]')).to_have_attribute(
            "data-level", "ok"
        )
    expect(tab.locator(".rtt").first).to_contain_text("ms", timeout=15_000)
    snap(tab, "1-topology")

    # Placement: a dry run shows the plan (on B, with its memory arithmetic), then Place.
    tab.fill("#place-model", MODEL)
    tab.check(f'#place-nodes input[value="{b.node_id}"]')
    tab.click("#preview")
    plan = tab.locator('[data-testid="plan"]')
    expect(plan).to_contain_text(b.node_id, timeout=30_000)
    assert a.get("/v1/instances").json()["instances"] == []  # a preview commits nothing
    snap(tab, "2-preview")
    tab.click("#place")
    expect(tab.locator('[data-testid="placed"]')).to_be_visible(timeout=30_000)
    instance = a.get("/v1/instances").json()["instances"][0]
    assert instance["shards"][0]["node"] == b.node_id
    phase = tab.locator(f'[data-testid="phase-{instance["id"]}-r0"]')
    expect(phase).to_have_text("ready", timeout=120_000)
    snap(tab, "3-ready")

    # Chat: the answer streams in (several chunks) and shows its TTFT and tokens/s.
    expect(tab.locator(f'#chat-model option[value="{MODEL}"]')).to_have_count(1, timeout=30_000)
    tab.select_option("#chat-model", MODEL)
    tab.fill("#chat-input", "Tell me a story")
    tab.click("#chat-send")
    answer = tab.locator('[data-testid="answer"]').last
    expect(answer).to_have_attribute("data-done", "true", timeout=60_000)
    assert not answer.evaluate("el => el.classList.contains('failed')"), answer.inner_text()
    assert answer.locator(".text").inner_text().strip()
    assert int(answer.get_attribute("data-chunks") or 0) > 1
    expect(answer.locator(".stats")).to_contain_text("TTFT")
    expect(answer.locator(".stats")).to_contain_text("tok/s")
    snap(tab, "4-chat")

    # C dies: its badge turns error within the down-after deadline (plus the slack), with
    # the reason and its remedy on click.
    assert c.proc is not None
    c.proc.send_signal(signal.SIGKILL)
    c.wait_exit(10)
    badge = tab.locator(f'[data-testid="badge-{c.node_id}"]')
    expect(badge).to_have_attribute("data-level", "error", timeout=(DOWN_AFTER + SLACK) * 1000)
    badge.click()
    detail = tab.locator("#node-detail")
    expect(detail).to_contain_text(c.node_id)
    expect(detail).to_contain_text("What to do")
    for node in (a, b):
        level = tab.locator(f'[data-testid="badge-{node.node_id}"]').get_attribute("data-level")
        assert level != "error", node.node_id
    snap(tab, "5-node-down")

    # The timeline shows the runner's events on a time axis.
    expect(tab.locator('[data-testid="cluster-timeline"] circle.event').first).to_be_attached(
        timeout=15_000
    )
    assert errors == [], errors

    # Through another node: the same cluster, C still in error, B's link to A measured.
    tab.goto(b.url + "/")
    expect(tab.locator("#via")).to_have_text(f"via {b.node_id}", timeout=15_000)
    for node in (a, b, c):
        expect(tab.locator(f'[data-testid="node-{node.node_id}"]')).to_contain_text(node.node_id)
    expect(tab.locator(f'[data-testid="badge-{c.node_id}"]')).to_have_attribute(
        "data-level", "error"
    )
    expect(tab.locator(f'[data-testid="phase-{instance["id"]}-r0"]')).to_have_text("ready")
    assert errors == [], errors

    # A refused preview shows the refusal's code and message (the browser logs the 404 itself).
    tab.fill("#place-model", "no-such-model")
    tab.click("#preview")
    expect(tab.locator('[data-testid="refusal"]')).to_contain_text("unknown_model (404)")
    assert all("404" in error for error in errors), errors


def test_with_an_api_key_the_page_asks_for_it_and_then_goes_live(
    skulk_home: Path, page: tuple[Page, list[str]]
) -> None:
    tab, errors = page
    with NodeProcess(skulk_home, "--api-key", "dash-key") as node:
        tab.goto(node.url + "/")  # the page itself needs no key
        expect(tab.locator("#feed")).to_have_text("API key needed", timeout=15_000)
        assert all("401" in error for error in errors), errors  # the feed's refusal, logged
        tab.fill("#key", "dash-key")
        tab.click('#key-form button[type="submit"]')
        expect(tab.locator("#feed")).to_have_text("live", timeout=15_000)
        expect(tab.locator(f'[data-testid="node-{node.node_id}"]')).to_contain_text(node.node_id)
        expect(tab.locator(f'#chat-model option[value="{MODEL}"]')).to_have_count(1)
        assert tab.evaluate("sessionStorage.getItem('skulk.apiKey')") == "dash-key"
        snap(tab, "6-api-key")
        tab.close()  # the feed ends with the page, before the node stops
    assert all("401" in error for error in errors), errors


def contract_snapshot() -> dict[str, Any]:
    """A feed snapshot as /v1/cluster/nodes answers with health and serving (the contract of
    issue 21): node n1 warns (disk low) and serves rank 0 of i1; n2 has no health field (an
    older node); n3 is a member with no readings."""
    serving = {"instance_id": "i1", "model": "m", "rank": 0, "phase": "ready", "running": 2,
               "waiting": 1, "kv_used_bytes": 256, "kv_capacity_bytes": 1024,
               "tokens_per_s": 42.5, "ttft_p50_s": 0.125}  # fmt: skip
    reason = {"code": "disk_low", "level": "warn", "message": "Only 1.2 GiB free for models.",
              "remedy": "Free disk space under the models folder."}  # fmt: skip
    n1 = {"node_id": "n1", "hostname": "h1", "status": "up", "age_s": 0.1, "cpu_count": 8,
          "load_1m": 1.5, "memory_total_bytes": 2**34, "memory_available_bytes": 2**33,
          "health": {"level": "warn", "reasons": [reason]}, "serving": [serving]}  # fmt: skip
    n2 = {**n1, "node_id": "n2", "hostname": "h2"}
    del n2["health"], n2["serving"]
    n3 = {"node_id": "n3", "status": "down", "age_s": None,
          "health": {"level": "error", "reasons": [{**reason, "code": "down", "level": "error",
                     "message": "No telemetry for 5 s.", "remedy": "Restart the node."}]},
          "serving": []}  # fmt: skip
    shard = {"rank": 0, "node": "n1", "layers": [0, 2], "address": None,
             "runner": {"phase": "ready", "failure": None, "bytes_done": None,
                        "bytes_total": None}}  # fmt: skip
    instance = {"id": "i1", "model": "m", "sharding": "single", "status": "ready",
                "shards": [shard]}  # fmt: skip
    return {"at": 1.0, "node_id": "n1", "nodes": {"nodes": [n1, n2, n3]},
            "instances": {"instances": [instance]}, "links": {"links": []},
            "raft": {"leader": "n1", "term": 3}, "timeline": None, "errors": {}}  # fmt: skip


def test_the_page_renders_health_and_serving_as_the_contract_gives_them(
    page: tuple[Page, list[str]],
) -> None:
    """The page alone (its files from the package, the API answered by the test): health
    badges with reasons and remedies, and each rank's load, tokens/s, TTFT and KV use."""
    tab, errors = page
    feed = b"event: snapshot\ndata: " + json.dumps(contract_snapshot()).encode() + b"\n\n"

    def answer(route: Route) -> None:
        path = urlsplit(route.request.url).path
        if served_asset(route):
            return
        if path == "/v1/dashboard/events":
            route.fulfill(body=feed, content_type="text/event-stream")
        elif path == "/v1/models":
            route.fulfill(json={"object": "list", "data": [{"id": "m"}]})
        else:
            route.fulfill(json={"models": []})

    tab.route(f"{FED}/**", answer)
    tab.goto(f"{FED}/")
    badge = tab.locator('[data-testid="badge-n1"]')
    expect(badge).to_have_attribute("data-level", "warn", timeout=15_000)
    assert "Free disk space" in badge.locator("title").text_content()  # type: ignore[operator]
    expect(tab.locator('[data-testid="badge-n2"]')).to_have_attribute("data-level", "ok")
    expect(tab.locator('[data-testid="badge-n3"]')).to_have_attribute("data-level", "error")
    expect(tab.locator('[data-testid="node-n1"]')).to_contain_text("m r0 ready · 2/1 · 42.5 tok/s")
    tab.locator('[data-testid="badge-n3"]').click()
    expect(tab.locator("#node-detail")).to_contain_text("What to do: Restart the node.")
    row = tab.locator('[data-testid="instance-i1-r0"]')
    for shown in ("2 / 1", "42.5", "125 ms", "25.0 % of 1.0 KiB"):
        expect(row).to_contain_text(shown)
    snap(tab, "7-contract")
    assert errors == [], errors
