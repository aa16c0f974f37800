"""Headless Chromium for the tests that open pages in a real browser (the run report, the sweep's
page, the findings page). Without Chromium or Playwright those tests skip and say why, unless in
CI (the `CI` variable set, and not "false" or "0") or with WORKBENCH_REQUIRE_BROWSER=1 (.ci/run,
once Chromium is installed), where a missing or broken browser fails them."""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest


def chromium_path() -> str | None:
    """WORKBENCH_CHROMIUM, else Debian's `chromium` on the PATH, else None."""
    return os.environ.get("WORKBENCH_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


def skip_or_fail(reason: str) -> None:
    """Skip with the reason; fail where the browser is required (see the module's docstring)."""
    if os.environ.get("WORKBENCH_REQUIRE_BROWSER") == "1":
        pytest.fail(f"WORKBENCH_REQUIRE_BROWSER=1 but {reason}")
    if os.environ.get("CI", "") not in ("", "false", "0"):
        pytest.fail(f"CI={os.environ['CI']}: the browser tests must run in CI, but {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def headless_chromium() -> Iterator[Any]:
    """A launched headless Chromium (Playwright's Browser), closed on exit; or a skip (a failure
    where the browser is required) naming what is missing."""
    executable = chromium_path()
    if executable is None:
        skip_or_fail("no Chromium: install Debian's `chromium` (apt-get install -y chromium; .ci/run does it as root)")
    try:
        import playwright.sync_api as sync_api
    except ImportError:
        skip_or_fail("playwright is not installed: pip install -e '.[test]'")
    with sync_api.sync_playwright() as playwright:
        try:
            chromium = playwright.chromium.launch(executable_path=executable, headless=True)
        except Exception as err:  # a broken or sandbox-less browser: a skip with the reason, or a failure in CI
            skip_or_fail(f"Chromium at {executable} did not start: {str(err).splitlines()[0]}")
        try:
            yield chromium
        finally:
            chromium.close()
