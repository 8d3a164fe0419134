"""Headless Chromium for the dashboard's browser tests, driven by Playwright: a fresh page per
test with the console's errors collected, screenshots, and the page's own files served to a
page whose API the test answers (``http://dash.test/``).

Chromium is Debian's ``chromium`` package (``.ci/run`` installs it when missing): Playwright's
own browser download cannot run here, so it is launched by path. Screenshots are kept under
``test-artifacts/dashboard/`` (git-ignored; the ``SKULK_TEST_ARTIFACTS`` environment variable
moves it).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import ConsoleMessage, Page, Route, sync_playwright

from skulk.api._dashboard import ASSETS

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(
    os.environ.get("SKULK_TEST_ARTIFACTS", Path(__file__).parents[2] / "test-artifacts")
)
#: The origin of a page whose API the test answers (nothing listens there).
FED = "http://dash.test"

_KINDS = {"html": "text/html", "js": "text/javascript", "css": "text/css"}


@pytest.fixture
def page() -> Iterator[tuple[Page, list[str]]]:
    """A fresh page, and the browser console's errors (and uncaught exceptions) as they come."""
    errors: list[str] = []

    def on_console(message: ConsoleMessage) -> None:
        if message.type == "error":
            errors.append(f"console: {message.text} at {message.location}")

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            tab = browser.new_page(viewport={"width": 1280, "height": 1000})
            tab.on("console", on_console)
            tab.on("pageerror", lambda exc: errors.append(f"page error: {exc}"))
            yield tab, errors
        finally:
            browser.close()


def snap(page: Page, name: str, selector: str | None = None) -> None:
    """Keep a screenshot as ``<artifacts>/dashboard/<name>.png``: the full page, or the
    element ``selector`` names."""
    folder = ARTIFACTS / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    if selector is None:
        page.screenshot(path=folder / f"{name}.png", full_page=True)
    else:
        page.locator(selector).screenshot(path=folder / f"{name}.png")


def served_asset(route: Route) -> bool:
    """Answer ``/`` and ``/dashboard/<file>`` with the page's files from the package; ``False``
    for any other path (the test answers it)."""
    path = urlsplit(route.request.url).path
    if path != "/" and not path.startswith("/dashboard/"):
        return False
    name = "index.html" if path == "/" else path.removeprefix("/dashboard/")
    route.fulfill(body=ASSETS[name], content_type=_KINDS[name.rsplit(".", 1)[1]])
    return True
