"""A markdown page as one self-contained HTML file: the subset the findings page uses (headings,
paragraphs, bullet lists, tables, fenced code, links, images, bold, italics, inline code). Images
are embedded as base64 data URIs; links to repository files become links relative to the folder
the page is written to, so the page opens offline, needs no server, and its links work in any
checkout it is written into (and on a web host serving the repository). What the page may hold is
bounded here: links go to http(s), a relative file or an #anchor, images are the page's own
figures, and a code fence closes; anything else is a PageError naming it."""

from __future__ import annotations

import base64
import html
import os
import posixpath
import re
from pathlib import Path
from urllib.parse import quote

from models.safe_files import read_regular

HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*$")
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```")
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)
WEB = re.compile(r"^https?://", re.IGNORECASE)
IMAGE_LIMIT = 16 << 20  # bytes of one embedded figure; the committed ones are under 150 kB
BULLET = re.compile(r"^\s*[-*] ")
LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;line-height:1.45}
table{border-collapse:collapse;font-size:.9em}td,th{border:1px solid #ccc;padding:.3em .5em;vertical-align:top}
th{background:#f3f3f3}img{max-width:100%}code{background:#f3f3f3;padding:0 .2em}pre{background:#f3f3f3;padding:.6em}"""


def slug(text: str) -> str:
    """GitHub's anchor for a heading (enough of its rules for this page's headings)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text).lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def inline(text: str, base: Path, images: dict[str, Path], up: str) -> str:
    """Escape `text`, then turn its code spans, images, links and emphasis into HTML. Code spans
    and images are set aside first, so that emphasis may span them and nothing inside them is read.
    `up`: `base` as a relative path from the page's folder, which the links start from."""
    kept: list[str] = []

    def keep(fragment: str) -> str:
        kept.append(fragment)
        return f"\0{len(kept) - 1}\0"

    text = re.sub(r"`([^`]+)`", lambda m: keep(f"<code>{html.escape(m.group(1))}</code>"), text)
    text = IMAGE.sub(lambda m: keep(image_tag(m.group(1), m.group(2), base, images)), text)
    text = html.escape(text, quote=False)
    text = LINK.sub(lambda m: f'<a href="{html.escape(href(m.group(2), up), quote=True)}">{m.group(1)}</a>', text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    text = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", text)
    return re.sub(r"\0(\d+)\0", lambda m: kept[int(m.group(1))], text)


class PageError(ValueError):
    """Markdown the page renderer refuses: a link or image it does not take, a fence never closed."""


def href(target: str, up: str) -> str:
    """An in-page anchor or an http(s) address stays; a repository file becomes a link relative to
    the page's folder (`up`: the markdown's folder as seen from there); any other scheme
    (javascript:, data:, ...) is a PageError."""
    if target.startswith("#") or WEB.match(target):
        return target
    if SCHEME.match(target):
        raise PageError(f"the link {target!r} is neither http(s), a relative file nor an #anchor")
    path, _, anchor = target.partition("#")
    return quote(posixpath.normpath(posixpath.join(up, path))) + (f"#{anchor}" if anchor else "")


def image_tag(alt: str, target: str, base: Path, images: dict[str, Path]) -> str:
    """An <img> whose source is the PNG itself, base64: one of the page's own figures (`images`,
    by name), a regular file of at most IMAGE_LIMIT bytes; any other image is a PageError."""
    if Path(target).name not in images:
        raise PageError(f"the image {target!r} is not one of the page's figures ({', '.join(sorted(images))})")
    data = base64.b64encode(read_regular(images[Path(target).name], IMAGE_LIMIT)).decode()
    return f'<img alt="{html.escape(alt, quote=True)}" src="data:image/png;base64,{data}">'


def table(rows: list[str], base: Path, images: dict[str, Path], up: str) -> str:
    cells = [[c.strip() for c in re.split(r"(?<!\\)\|", row.strip().strip("|"))] for row in rows]
    head, body = cells[0], cells[2:]
    out = ["<table><thead><tr>", *(f"<th>{inline(c, base, images, up)}</th>" for c in head), "</tr></thead><tbody>"]
    for row in body:
        out += ["<tr>", *(f"<td>{inline(c.replace(chr(92) + '|', '|'), base, images, up)}</td>" for c in row), "</tr>"]
    return "".join(out + ["</tbody></table>"])


def blocks(lines: list[str]) -> list[tuple[str, list[str]]]:
    """Split the page into (kind, lines) blocks: heading, code, table, list, paragraph."""
    found: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("<!--"):
            i += 1
        elif line.startswith("```"):
            end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith("```")), None)
            if end is None:
                raise PageError(f"line {i + 1} opens a code block (```) that is never closed")
            found.append(("code", lines[i + 1:end]))
            i = end + 1
        elif HEADING.match(line):
            found.append(("heading", [line]))
            i += 1
        else:
            kind = "table" if line.startswith("|") else "list" if re.match(r"^\s*[-*] ", line) else "para"
            j = i + 1
            while j < len(lines) and lines[j].strip() and not HEADING.match(lines[j]) and not FENCE.match(lines[j]):
                if kind == "para" and (lines[j].startswith("|") or re.match(r"^[-*] ", lines[j])):
                    break
                j += 1
            found.append((kind, lines[i:j]))
            i = j
    return found


def render_page(markdown: str, base: Path, images: dict[str, Path], title: str, page_folder: Path) -> str:
    """The page as HTML; `base` is the folder the markdown's relative links and images are
    relative to, `page_folder` the one the HTML is written to (its links are relative to it),
    `images` its figures by name. PageError where the markdown holds what the page does not take."""
    up = Path(os.path.relpath(Path(base).resolve(), Path(page_folder).resolve())).as_posix()
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
           f"<style>{STYLE}</style></head><body>"]
    for kind, lines in blocks(markdown.splitlines()):
        if kind == "heading":
            level, text = HEADING.match(lines[0]).groups()
            out.append(f'<h{len(level)} id="{slug(text)}">{inline(text, base, images, up)}</h{len(level)}>')
        elif kind == "code":
            out.append(f"<pre><code>{html.escape(chr(10).join(lines))}</code></pre>")
        elif kind == "table":
            out.append(table(lines, base, images, up))
        elif kind == "list":
            items = [BULLET.sub("", item) for item in re.split(r"\n(?=\s*[-*] )", "\n".join(lines))]
            out.append("<ul>" + "".join(f"<li>{inline(item, base, images, up)}</li>" for item in items) + "</ul>")
        else:
            out.append(f"<p>{inline(' '.join(lines), base, images, up)}</p>")
    return "\n".join(out + ["</body></html>"])
