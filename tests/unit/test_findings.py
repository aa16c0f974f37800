"""The findings page (analyses/RESULTS.md): `python -m analyses.findings` draws its figures
from the committed data and writes it as one self-contained HTML file; every figure the page shows
is committed, small and drawn by the command; the page's scoreboard agrees with the lab notebook's;
every data file names a lab section that exists."""

from __future__ import annotations

import json
import re
from html import unescape
from pathlib import Path
from urllib.parse import unquote

import pytest

from analyses.findings.__main__ import main
from analyses.findings.figures import DATA, FIGURES

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "analyses" / "RESULTS.md"
LAB_SCOREBOARD = ROOT / "analyses" / "lab" / "scoreboard.md"
FIGURE_LIMIT = 150_000  # bytes per committed PNG
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
STATUS = re.compile(r"\*\*(reproduced|partly|not reproduced)\b[^*]*\*\*")  # "**reproduced in ...**" too
SECTION = re.compile(r"(analyses/lab/[\w-]+\.md), section '(.+?)'(?=[,:\"]|$)")


def scoreboard_rows(text: str) -> dict[str, str]:
    """{finding: its status} from the first table whose rows start with `| LEGO 1` ... ."""
    rows = {}
    for line in text.splitlines():
        match = re.match(r"^\| \[?((?:LEGO|Composite|Templates) \d)\]?", line)
        if match and match.group(1) not in rows:
            cells = line.split(" | ")
            rows[match.group(1)] = next(STATUS.search(c).group(1) for c in cells[1:] if STATUS.search(c))
    return rows


def test_the_command_writes_every_figure_and_the_page(tmp_path):
    assert main(["--figures", str(tmp_path / "fig"), "--out", str(tmp_path / "out")]) == 0
    pngs = sorted(p.name for p in (tmp_path / "fig").iterdir())
    assert pngs == sorted(FIGURES)
    for name in pngs:
        data = (tmp_path / "fig" / name).read_bytes()
        assert data.startswith(PNG_SIGNATURE) and 10_000 < len(data) < FIGURE_LIMIT, (name, len(data))
    html = (tmp_path / "out" / "findings.html").read_text()
    assert html.count('src="data:image/png;base64,') == len(FIGURES)
    assert "<table>" in html and 'id="scoreboard-the-papers-16-findings"' in html
    assert not re.search(r'src="(?!data:)', html), "the page must load nothing from outside itself"


def test_the_page_links_its_evidence_relative_to_where_it_is_written(tmp_path):
    out = tmp_path / "out"
    assert main(["--figures", str(tmp_path / "fig"), "--out", str(out)]) == 0
    page = (out / "findings.html").read_text()
    hrefs = [unescape(h) for h in re.findall(r'href="([^"]+)"', page)]
    files = [h.partition("#")[0] for h in hrefs if not h.startswith(("#", "http:", "https:", "mailto:"))]
    assert "file:" not in page and len(files) > 10 and any("analyses/lab/" in f for f in files)
    missing = [f for f in files if Path(f).is_absolute() or not (out / unquote(f)).exists()]
    assert not missing, f"links that do not open from the page's folder: {missing[:5]}"


def test_every_figure_the_page_shows_is_committed_small_and_drawn_by_the_command():
    shown = IMAGE.findall(PAGE.read_text())
    assert sorted(Path(target).name for target in shown) == sorted(FIGURES)
    for target in shown:
        path = PAGE.parent / target
        assert path.is_file(), f"RESULTS.md shows {target}, which does not exist"
        assert path.stat().st_size < FIGURE_LIMIT, f"{target}: {path.stat().st_size} bytes"


def test_the_page_s_scoreboard_keeps_the_lab_notebook_s_statuses():
    page, lab = scoreboard_rows(PAGE.read_text()), scoreboard_rows(LAB_SCOREBOARD.read_text())
    assert len(page) == 16 and page == lab
    counts = {status: list(page.values()).count(status) for status in ("reproduced", "partly", "not reproduced")}
    assert counts == {"reproduced": 3, "partly": 11, "not reproduced": 2}
    assert "**3 are reproduced, 11 partly and 2 not**" in PAGE.read_text()


@pytest.mark.parametrize("data_file", sorted(p.name for p in DATA.glob("*.json")))
def test_every_data_file_names_a_lab_section_that_exists(data_file):
    text = (DATA / data_file).read_text()
    json.loads(text)
    sources = SECTION.findall(text)
    assert sources, f"{data_file} names no lab section its numbers come from"
    for lab_file, title in sources:
        headings = [line.lstrip("#").strip() for line in (ROOT / lab_file).read_text().splitlines()
                    if line.startswith("#")]
        assert title in headings, f"{data_file}: {lab_file} has no section {title!r}"


@pytest.mark.parametrize("markdown, words", [
    ("[x](javascript:alert(1))", "'javascript:alert(1'"),
    ("[x](JavaScript:alert(1))", "'JavaScript:alert(1'"),
    ("[x](data:text/html,hi)", "'data:text/html,hi'"),
    ("![x](/etc/hostname)", "'/etc/hostname'"),
    ("![x](/dev/zero)", "'/dev/zero'"),
    ("![x](findings/figures/../../../../etc/passwd)", "passwd"),
    ("text\n\n```python\nprint(1)\n", "line 3"),
])
def test_what_the_page_does_not_take_is_a_page_error(tmp_path, markdown, words):
    """Links only to http(s), relative files or anchors; images only the page's own figures; a code
    fence that never closes is an error, not a StopIteration traceback."""
    from analyses.findings.page import PageError, render_page

    figure = tmp_path / "fig.png"
    figure.write_bytes(PNG_SIGNATURE)
    with pytest.raises(PageError, match=re.escape(words)):
        render_page(markdown, ROOT / "analyses", {"fig.png": figure}, "t", ROOT)


def test_a_figure_that_is_no_regular_file_is_refused(tmp_path):
    from analyses.findings.page import render_page
    from models.safe_files import RunFolderError

    with pytest.raises(RunFolderError, match="/dev/zero"):
        render_page("![x](figures/zero)", ROOT, {"zero": Path("/dev/zero")}, "t", ROOT)


def test_links_to_the_web_files_and_anchors_stay_live():
    from analyses.findings.page import render_page

    text = render_page("[a](https://x.org/p) [b](#top) [c](lab/notes.md) [d](http://y.org)", ROOT, {}, "t", ROOT)
    assert 'href="https://x.org/p"' in text and 'href="#top"' in text and 'href="http://y.org"' in text
    assert 'href="lab/notes.md"' in text  # relative to the page's folder (here the markdown's own)
