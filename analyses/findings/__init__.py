"""The findings page's figures and its self-contained HTML version.

`python -m analyses.findings` draws the figures of analyses/RESULTS.md from the numbers
committed under `analyses/findings/data/` (each file names the lab-notebook section and the
command its numbers come from) and from the zoo's metrics, and writes the page as one HTML file
with the figures embedded. Nothing here trains or analyses a model."""

from analyses.findings.figures import FIGURES, draw_all
from analyses.findings.page import render_page

__all__ = ["FIGURES", "draw_all", "render_page"]
