"""The docs stand on their own: every relative link in README.md, CONTRIBUTING.md, docs/*.md, the
findings page (analyses/RESULTS.md) and the lab notebook (analyses/lab/*.md) resolves to a file in
the repository (and its #anchor, if any, to a heading of that file, by GitHub's rules); nothing
points outside the repository; the README stays short, its commands parse and its Python example
compiles."""

from __future__ import annotations

import argparse
import ast
import re
import shlex
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
# The findings page and its lab notebook are checked too: their links hold the findings together.
DOCS = sorted([README, ROOT / "CONTRIBUTING.md", *(ROOT / "docs").glob("*.md"), ROOT / "analyses" / "RESULTS.md",
               *(ROOT / "analyses" / "lab").glob("*.md")])
README_MAX_LINES = 170
# Written by another engineer (using the workbench on your own HookedTransformer and prompts); it
# is linked before it exists, so a link to this one file is skipped while the file is absent.
# Every other link must resolve.
PENDING = ROOT / "docs" / "outside-models.md"

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto: ...


def prose_lines(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked out (a link inside
    backticks is not a link)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "``", line))
    return lines


def links(path: Path) -> list[str]:
    return [m.group(1) for line in prose_lines(path.read_text()) for m in LINK.finditer(line)]


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (links reduced to their text, code and
    emphasis marks dropped), lowercased, every character that is not a letter, mark, number,
    underscore, space or hyphen removed, spaces turned into hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    kept = []
    for char in text.lower():
        category = unicodedata.category(char)
        if char in " -_" or category[0] in "LMN":
            kept.append(char)
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor GitHub gives the headings of `path`, duplicates numbered -1, -2, ..."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        found.add(slug if count == 0 else f"{slug}-{count}")
        seen[slug] = count + 1
    return found


def test_the_slug_follows_githubs_rules():
    assert github_slug("Scoreboard: the papers' 16 findings") == "scoreboard-the-papers-16-findings"
    assert github_slug("LEGO on CPU: what learns (the `lego-cpu` recipe search)") == \
        "lego-on-cpu-what-learns-the-lego-cpu-recipe-search"
    assert github_slug("1. BERT vs ALBERT — not reproduced") == "1-bert-vs-albert--not-reproduced"
    assert github_slug("Looking inside a run: `workbench analyze` and the report") == \
        "looking-inside-a-run-workbench-analyze-and-the-report"
    assert github_slug("Add a [study](x.md)") == "add-a-study"


def test_there_are_docs_to_check():
    names = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert {"README.md", "CONTRIBUTING.md", "docs/README.md", "docs/design.md", "docs/papers.md", "docs/training.md",
            "docs/sweeps.md", "docs/gpu.md", "docs/zoo.md", "docs/run-folder.md", "docs/limits.md"} <= names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves_inside_the_repository(doc: Path):
    problems = []
    for target in links(doc):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        resolved = (doc.parent / file_part).resolve() if file_part else doc
        if file_part and resolved == PENDING and not PENDING.exists():
            continue  # the other engineer's page, not written yet (see PENDING)
        if not resolved.is_relative_to(ROOT):
            problems.append(f"{target}: points outside the repository ({resolved})")
        elif not resolved.exists():
            problems.append(f"{target}: {resolved.relative_to(ROOT)} does not exist")
        elif anchor:
            if resolved.is_dir() or resolved.suffix != ".md":
                problems.append(f"{target}: an anchor into something that is not a markdown file")
            elif anchor not in anchors(resolved):
                problems.append(f"{target}: no heading of {resolved.relative_to(ROOT)} has the anchor #{anchor}")
    assert not problems, f"{doc.relative_to(ROOT)}:\n  " + "\n  ".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_nothing_points_outside_the_repository(doc: Path):
    text = doc.read_text()
    outside = [line for line in text.splitlines() if "../shared" in line or re.search(r"(?<![\w.])/work/", line)]
    assert not outside, f"{doc.relative_to(ROOT)} points outside the repository:\n" + "\n".join(outside)
    for target in links(doc):
        if not EXTERNAL.match(target):
            assert not target.startswith("/"), f"{doc.relative_to(ROOT)}: absolute link {target}"
            assert not target.startswith("../"), (f"{doc.relative_to(ROOT)}: link {target} climbs out of its folder; "
                                                  "name the file as a path (`interp/x.py`) instead")


def test_the_readme_is_short():
    count = len(README.read_text().splitlines())
    print(f"README.md: {count} lines (at most {README_MAX_LINES})")
    assert count <= README_MAX_LINES


def _code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)


def test_the_readmes_python_example_compiles():
    blocks = _code_blocks(README.read_text(), "python")
    assert blocks, "README.md has no python example"
    for block in blocks:
        ast.parse(block)


def test_the_readmes_commands_parse():
    """Every `workbench ...` command the README shows is accepted by the command line's parser
    (nothing runs), and every `make X` names a Makefile target."""
    from analyses.cli import _parser

    text = README.read_text()
    spans = re.findall(r"`([^`\n]+)`", text) + [line for block in _code_blocks(text, "bash")
                                                for line in block.splitlines()]
    commands = [re.sub(r"\s+#.*$", "", span).strip() for span in spans]
    workbench = [c for c in commands if re.match(r"^(\.venv/bin/)?workbench \w", c) and "..." not in c]
    assert len(workbench) >= 10, workbench
    parser = _parser()
    subcommands = next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for command in workbench:
        argv = shlex.split(command)[1:]
        if len(argv) == 1 and argv[0] in subcommands:
            continue  # a command named in prose (`workbench analyze` adds ...), or one that takes no arguments
        try:
            args = _parser().parse_args(argv)
        except SystemExit as err:
            pytest.fail(f"README.md shows `{command}`, which the parser refuses (exit {err.code})")
        assert getattr(args, "command", None), command
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), flags=re.MULTILINE))
    for command in commands:
        if command.startswith("make "):
            assert shlex.split(command)[1] in targets, f"README.md shows `{command}`; the Makefile has no such target"
