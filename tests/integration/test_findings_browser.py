"""The findings page as `python -m analyses.findings` writes it, opened in headless Chromium with
networking off: its three figures decode (naturalWidth > 0), the scoreboard table holds the 16
findings, and the page loads nothing beyond the file itself, with no console error.

Chromium and Playwright as in tests/integration/test_browser_report.py: without either the test
skips and says why, unless in CI (the `CI` variable set) or with WORKBENCH_REQUIRE_BROWSER=1, where
a missing or broken browser fails it."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyses.findings.__main__ import main
from analyses.findings.figures import FIGURES


@pytest.fixture(scope="module")
def findings_html(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("findings")
    assert main(["--figures", str(out / "figures"), "--out", str(out)]) == 0
    return out / "findings.html"


def test_the_findings_page_shows_its_figures_and_scoreboard_offline(browser, findings_html):
    context = browser.new_context(offline=True)
    page = context.new_page()
    errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(f"uncaught: {error}"))
    page.on("request", lambda request: requests.append(request.url))
    page.goto(findings_html.as_uri(), wait_until="load")
    images = page.evaluate("""[...document.images].map(img => ({alt: img.alt, complete: img.complete,
        width: img.naturalWidth, png: img.src.startsWith('data:image/png;base64,')}))""")
    assert len(images) == len(FIGURES)
    assert all(img["complete"] and img["width"] > 0 and img["png"] for img in images), images
    scoreboard = page.evaluate("""(() => {
        const heading = document.getElementById('scoreboard-the-papers-16-findings');
        let node = heading && heading.nextElementSibling;
        while (node && node.tagName !== 'TABLE') node = node.nextElementSibling;
        return node ? [...node.querySelectorAll('tbody tr')].map(r => r.cells[0].textContent) : null; })()""")
    assert scoreboard is not None, "no table after the scoreboard heading"
    assert len(scoreboard) == 16 and scoreboard[0] == "LEGO 1" and scoreboard[-1] == "Templates 3"
    assert page.locator("a[href='#lego-2-length-extrapolation']").count() == 1
    assert page.locator("#lego-2-length-extrapolation").count() == 1, "the scoreboard links to a paragraph it lacks"
    assert not errors, errors
    assert all(url.startswith(("file:", "data:")) for url in requests), requests
    context.close()
