"""Chromium from the Debian package, driven by Playwright (never `playwright install`: no browser downloads)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# Headless, and quiet: no network beyond the 127.0.0.1 server under test.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
REQUIRE_ENV = "VIDLOOM_REQUIRE_BROWSER"  # .ci/run sets it: a missing browser fails instead of skipping


def require_chromium() -> None:
    """Skip (locally) or fail (CI) when the browser or the playwright package is missing."""
    missing = None
    if not CHROMIUM.exists():
        missing = f"{CHROMIUM} is missing (apt-get install chromium)"
    else:
        try:
            import playwright  # noqa: F401
        except ImportError:
            missing = "the playwright package is missing (pip install -e '.[test]')"
    if missing is None:
        return
    if os.environ.get(REQUIRE_ENV) or os.environ.get("CI") == "true":
        pytest.fail(f"a browser is required here ({REQUIRE_ENV} / CI) but {missing}")
    pytest.skip(missing)


def launch(playwright):  # type: ignore[no-untyped-def]
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True)


# -- fixtures and steps shared by the browser tests (import the fixtures into a test module) ---------------

@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    require_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        chromium = launch(playwright)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1100, "height": 800})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("console", lambda msg: errors.append(msg.text) if _unexpected(msg) else None)
    yield page
    context.close()
    assert errors == [], errors  # an uncaught script error or a refused resource (CSP) fails the test


def _unexpected(message) -> bool:  # type: ignore[no-untyped-def]
    # A 401 is how the page learns that it needs a key (or that a key is wrong); the key test checks what it shows.
    return message.type == "error" and "status of 401" not in message.text


def screenshot(page, name: str, part: str | None = None) -> None:  # type: ignore[no-untyped-def]
    folder = os.environ.get("VIDLOOM_UI_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (page.locator(part) if part else page).screenshot(path=str(Path(folder) / f"{name}.png"))


def fill(page, prompt: str, fields: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    page.fill("#prompt", prompt)
    for name, value in fields.items():
        page.fill(f"#gen-form [name={name}]", value)


def wait_until_playing_while_running(page, timeout: float = 60_000) -> None:  # type: ignore[no-untyped-def]
    """The first job's growing fMP4 plays (buffered, streaming) while the job is still in progress."""
    page.wait_for_function("""() => { const v = document.querySelector('li.job video');
      return v !== null && v.dataset.streaming === '1' && v.readyState >= 2 && v.buffered.length > 0; }""",
                           timeout=timeout)
    assert page.locator("li.job").get_attribute("data-status") == "in_progress"
