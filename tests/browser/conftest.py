"""The dashboard in a real browser: Playwright driving Debian's Chromium (`apt-get install
chromium`; Playwright cannot download browsers here) against a live server (uvicorn on a port,
an embedded runtime behind it). Without Chromium the tests skip locally and fail in CI.

Set KOPS_SCREENSHOTS=1 to write the pages' screenshots into docs/screenshots/.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from knowledgeops.roles.embedded import EmbeddedRole
from tests.conftest import unavailable
from tests.fixtures.live import LiveServer, serve

CHROMIUM = Path(os.environ.get("KOPS_CHROMIUM", "/usr/lib/chromium/chromium"))
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"


# the package only: Playwright's sync API runs an event loop on this thread while it lives,
# and later tests run their own (asyncio.run)
@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        unavailable(f"Chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright  # noqa: PLC0415

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM), args=["--no-sandbox"], headless=True
        )
        yield launched
        launched.close()


@pytest.fixture
def live(make_runtime: Callable[..., EmbeddedRole]) -> Iterator[Callable[..., LiveServer]]:
    """`live(embedder=…, **settings)`: a started server on the embedded default."""
    with ExitStack() as stack:

        def make(**overrides: Any) -> LiveServer:
            overrides.setdefault("stream_poll_s", 0.05)
            runtime = make_runtime(start=False, **overrides)
            return stack.enter_context(serve(runtime))

        yield make


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 900}, locale="en-US")
    opened = context.new_page()
    opened.set_default_timeout(15_000)
    dialogs: list[str] = []
    opened.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.accept()))
    opened.dialogs = dialogs
    errors: list[str] = []
    opened.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    opened.console_errors = errors
    yield opened
    context.close()


def sign_in(page: Any, server: LiveServer, key: str | None = None) -> None:
    """With the keyboard, as a person would: typed into the labelled field, sent with Enter."""
    page.goto(f"{server.url}/ui/datasets")
    assert page.url.endswith("/ui/login")
    field = page.get_by_label("API key")
    field.press_sequentially(key or server.key)
    field.press("Enter")
    page.wait_for_url("**/ui/datasets")


def screenshot(page: Any, name: str) -> None:
    if os.environ.get("KOPS_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
