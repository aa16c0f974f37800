"""`python -m analyses.findings`: draw the findings page's figures from committed data and write
the page (analyses/RESULTS.md) as one self-contained HTML file.

  python -m analyses.findings                       # figures into analyses/findings/figures/ (the
                                                    # committed ones), the page into runs/findings/
  python -m analyses.findings --figures DIR --out DIR --page FILE"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from analyses.findings.figures import FIGURES, ROOT, draw_all
from analyses.findings.page import PageError, render_page
from models.safe_files import RunFolderError, read_regular

PAGE = ROOT / "analyses" / "RESULTS.md"
FIGURES_DIR = Path(__file__).resolve().parent / "figures"
PAGE_LIMIT = 16 << 20  # bytes of markdown; RESULTS.md is about 40 kB


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m analyses.findings", description=__doc__.splitlines()[0])
    parser.add_argument("--figures", type=Path, default=FIGURES_DIR, help="where the PNGs go (default: %(default)s)")
    parser.add_argument("--out", type=Path, default=Path("runs/findings"),
                        help="where findings.html goes (default: %(default)s)")
    parser.add_argument("--page", type=Path, default=PAGE, help="the markdown page to render (default: %(default)s)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as drawn:  # kept only if the page renders: a refused page writes nothing
        try:  # the page is checked against empty stand-ins of its figures first: a refused one costs no drawing
            markdown = read_regular(args.page, PAGE_LIMIT).decode()
            render(markdown, args, _empty_figures(Path(drawn) / "stand-ins"))
            figures = draw_all(Path(drawn) / "figures")
            html = render(markdown, args, figures)
        except (PageError, RunFolderError, UnicodeDecodeError) as err:
            print(f"python -m analyses.findings: {args.page}: {err}", file=sys.stderr)
            return 2
        args.figures.mkdir(parents=True, exist_ok=True)
        figures = [Path(shutil.copyfile(path, args.figures / path.name)) for path in figures]
    args.out.mkdir(parents=True, exist_ok=True)
    page = args.out / "findings.html"
    page.write_text(html)
    for path in [*figures, page]:
        print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


def render(markdown: str, args: argparse.Namespace, figures: list[Path]) -> str:
    return render_page(markdown, args.page.resolve().parent, {p.name: p for p in figures}, "Findings",
                       page_folder=args.out)


def _empty_figures(folder: Path) -> list[Path]:
    folder.mkdir(parents=True)
    for name in FIGURES:
        (folder / name).touch()
    return [folder / name for name in FIGURES]


if __name__ == "__main__":
    sys.exit(main())
