"""The dashboard's Models view in a real browser (headless Chromium, ``tests/e2e/_browser.py``),
the page alone: its files from the package, its feed and API answered by the test. It shows the
cluster's downloads (per node, the file in flight with bytes, rate and ETA; a failed download's
reason), every node's store (this node's own answer, the others' readings; Remove on this
node's only), a pull followed live and cut, and the typed refusals of a pull, a placement and a
Remove with their codes and what to do. The real pull, against real nodes and the tests' Hub
endpoint, is in ``test_dashboard_browser.py``.
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Page, Route, expect

from tests.e2e._browser import FED, page, served_asset, snap
from tests.e2e.test_dashboard_browser import contract_snapshot

__all__ = ["page"]  # fixtures
pytestmark = pytest.mark.e2e

MIB = 2**20
SHA = "ab" * 32


def models_snapshot() -> dict[str, Any]:
    """A feed snapshot of the Models view as ``/v1/downloads`` and ``/v1/store`` answer: n1
    downloads org/big from the Hub (a file in flight), n2 fetches it from peers, n3's download
    of org/huge failed (disk_full), n1's of org/next has moved no byte yet; n1 (the page's
    node) and n2 hold org/small."""
    transfer = {"node": "n1", "model": "org/big", "source": "hub",
                "file": "model-00001-of-00002.safetensors", "file_done": MIB,
                "file_total": 4 * MIB, "bytes_done": 3 * MIB, "bytes_total": 8 * MIB,
                "rate_bps": 2 * MIB, "eta_s": 150.0, "started_at": 1.0}  # fmt: skip
    peers = {**transfer, "node": "n2", "source": "peers", "file": "", "file_done": 0,
             "file_total": 0, "bytes_done": 0, "rate_bps": 0.0, "eta_s": None}  # fmt: skip
    failed = {"model": "org/huge", "repo": "org/huge", "commit": "c" * 40, "node": "n3",
              "total_bytes": 900 * MIB, "status": "failed", "changed_at": 5.0,
              "reason": "disk_full", "detail": "needs 900 MiB, 12 MiB free"}  # fmt: skip
    running = {**failed, "model": "org/big", "repo": "org/big", "node": "n1",
               "status": "downloading", "reason": None, "detail": None}  # fmt: skip
    starting = {**running, "model": "org/next", "repo": "org/next", "total_bytes": 2 * MIB}
    stored = {"sha256": SHA, "names": ["org/small"], "size": 5 * MIB, "last_used": 880.0,
              "models": ["org/small"], "holders": ["n1", "n2"]}  # fmt: skip
    store = {"used_bytes": 5 * MIB, "budget_bytes": None, "available_bytes": 40 * 2**30,
             "stored": [stored]}  # fmt: skip
    n2_store = {**store, "budget_bytes": 10 * 2**30, "stored": [{**stored, "last_used": 1.0}]}
    card = {"model": "org/small", "manifest_sha256": SHA, "weight_bytes": 5 * MIB,
            "source": {"kind": "hub", "repo": "org/small", "commit": "d" * 40},
            "holders": ["n1", "n2"]}  # fmt: skip
    snap = contract_snapshot()
    snap["nodes"]["nodes"][1]["api_address"] = "http://10.0.0.2:52415"  # n2's API
    snap.update(at=1000.0, instances={"instances": []},
                downloads={"downloads": [failed, running, starting],
                           "transfers": [transfer, peers]},
                store={"node": "n1", "store": store,
                       "nodes": [{"node": "n1", **store, "stored": []},
                                 {"node": "n2", **n2_store}],
                       "models": [card]})  # fmt: skip
    return snap


def pull_lines() -> bytes:
    """A pull's NDJSON stream, cut while downloading (its follower sees the last figures)."""
    base = {"model": "org/big", "repo": "org/big", "commit": "e" * 40, "total_bytes": 8 * MIB,
            "done_bytes": 0, "target_bytes": 16 * MIB, "downloader": None, "holders": [],
            "nodes": ["n1", "n2"], "transfers": []}  # fmt: skip
    checking = {**base, "phase": "checking"}
    downloading = {**base, "phase": "downloading", "downloader": "n1", "done_bytes": 3 * MIB,
                   "transfers": models_snapshot()["downloads"]["transfers"][:1]}  # fmt: skip
    return b"".join(json.dumps(line).encode() + b"\n" for line in (checking, downloading))


def test_the_models_view_shows_downloads_stores_a_pull_and_refusals(
    page: tuple[Page, list[str]],
) -> None:
    """The page alone, the API answered by the test: per node the file in flight with bytes,
    rate and ETA, a failed download's reason, every node's store; a pull's live figures (and
    that its stream was cut); typed refusals (gated 401, unsupported_architecture 422,
    disk_full 507, a placement's repo_not_found 404) with what to do, and a Remove refused
    while the model is in use, each with its code."""
    tab, errors = page
    feed = b"event: snapshot\ndata: " + json.dumps(models_snapshot()).encode() + b"\n\n"
    refusals = {
        "org/gated": (401, "gated", "Access to model org/gated is restricted."),
        "org/bert": (422, "unsupported_architecture", "org/bert: BertModel is not supported"),
        "org/huge": (507, "disk_full", "org/huge needs 900 GiB; the most room is 40 GiB"),
        f"/v1/store/{SHA}": (409, "model_in_use", "model 'ab' is in use by instance(s) i9"),
        "/v1/placements": (404, "repo_not_found", "Hub repo org/nope not found"),
    }

    def envelope(status: int, code: str, message: str) -> dict[str, Any]:
        kind = "invalid_request_error"
        return {"error": {"message": message, "type": kind, "param": "model", "code": code}}

    def answer(route: Route) -> None:
        path = urlsplit(route.request.url).path
        if served_asset(route):
            return
        if path == "/v1/dashboard/events":
            route.fulfill(body=feed, content_type="text/event-stream")
        elif path == "/v1/pulls":
            asked = json.loads(route.request.post_data or "{}")["model"]
            if asked in refusals:
                status, code, message = refusals[asked]
                route.fulfill(status=status, json=envelope(status, code, message))
            else:
                route.fulfill(body=pull_lines(), content_type="application/x-ndjson")
        elif path in refusals and route.request.method in ("DELETE", "POST"):
            status, code, message = refusals[path]
            route.fulfill(status=status, json=envelope(status, code, message))
        elif path == "/v1/models":
            route.fulfill(json={"object": "list", "data": []})
        else:
            route.fulfill(json={"models": []})

    tab.route(f"{FED}/**", answer)
    tab.goto(f"{FED}/")
    hub_row = tab.locator('[data-testid="download-n1-org/big"]')
    for shown in ("the Hub", "model-00001-of-00002.safetensors", "1.0 MiB / 4.0 MiB",
                  "3.0 MiB / 8.0 MiB", "2.0 MiB/s", "2 min 30 s"):  # fmt: skip
        expect(hub_row).to_contain_text(shown, timeout=15_000)
    expect(tab.locator('[data-testid="download-n2-org/big"]')).to_contain_text("peers")
    failed = tab.locator('[data-testid="download-failed-n3-org/huge"]')
    expect(failed).to_contain_text("failed disk_full: needs 900 MiB, 12 MiB free")
    # A download with its transfer in telemetry is one row; one without yet is "starting".
    expect(hub_row).to_have_count(1)
    expect(tab.locator('[data-testid="download-n1-org/next"]')).to_contain_text("starting 2.0 MiB")
    # The page's own store is its fresh answer (not n1's older reading); n2's is its reading.
    mine = tab.locator(f'[data-testid="stored-n1-{SHA}"]')
    for shown in ("org/small", "5.0 MiB", "2 min 00 s ago", "2: n1, n2", "(this node)"):
        expect(mine).to_contain_text(shown)
    theirs = tab.locator(f'[data-testid="stored-n2-{SHA}"]')
    expect(theirs).to_contain_text("budget 10.0 GiB")
    expect(theirs.locator("button")).to_have_count(0)  # removed through its own node's page
    expect(theirs.locator("a")).to_have_attribute("href", "http://10.0.0.2:52415/")
    snap(tab, "8-models-contract")

    # A pull followed live: the phase, the cluster's bytes, the downloader's file, rate, ETA.
    tab.fill("#pull-model", "org/big")
    tab.click("#pull")
    expect(tab.locator("#pull-status")).to_have_attribute("data-phases", "checking downloading")
    expect(tab.locator('[data-testid="pull-bytes"]')).to_contain_text("3.0 MiB / 16.0 MiB")
    row = tab.locator('[data-testid="pull-transfer-n1"]')
    for shown in ("the Hub", "1.0 MiB / 4.0 MiB", "2.0 MiB/s", "2 min 30 s"):
        expect(row).to_contain_text(shown)
    expect(tab.locator('[data-testid="pull-cut"]')).to_contain_text("the download goes on")
    snap(tab, "8-models-section", "#models-section")  # docs/images/dashboard-models.png
    # Typed refusals: each one's code and status, the node's message and what to do.
    for repo, remedy in (("org/gated", "HF_TOKEN"), ("org/bert", "mlx-lm cannot load"),
                         ("org/huge", "--store-budget")):  # fmt: skip
        status, code, message = refusals[repo]
        tab.fill("#pull-model", repo)
        tab.click("#pull")
        error = tab.locator(f'[data-testid="pull-error"][data-code="{code}"]')
        expect(error).to_contain_text(f"{code} ({status}): {message}")
        expect(error).to_contain_text(remedy)
    # Remove (pressed twice) refused while in use: the refusal as the node gave it.
    tab.click(f'[data-testid="store-remove-n1-{SHA}"]')
    tab.click(f'[data-testid="store-remove-n1-{SHA}"]')
    expect(tab.locator('[data-testid="store-refusal"]')).to_contain_text(
        "model_in_use (409): Remove org/small: model 'ab' is in use by instance(s) i9"
    )
    # The placement form takes a Hub id; the pull's refusal is shown with what to do.
    tab.fill("#place-model", "org/nope")
    tab.click("#preview")
    refused = tab.locator("#place-result")
    expect(refused).to_contain_text("repo_not_found (404): Hub repo org/nope not found")
    expect(refused).to_contain_text("Check the id")
    snap(tab, "9-models-refusals")
    assert all(re.search(r" (401|404|409|422|507) ", e) for e in errors), errors
