"""Chromium from the Debian package, driven by Playwright (never `playwright install`: no browser downloads)."""

from __future__ import annotations

import os
from pathlib import Path

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
