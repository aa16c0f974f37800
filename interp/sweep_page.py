"""One page for a whole sweep: its grid as a figure, each group of seeds coloured by its majority
verdict with "k of n" and the mean deciding rates, the rates of every run as a heatmap, and every
cell linking to its run's report and timeline; written as report.html in the sweep folder, with
the same content as sweep_page.json (schema PAGE_SCHEMA). Built from the cells as
interp/sweep_cells.py reads them, so it works on any task and on a sweep still in progress.

Axes: the seed key (train.seed) is aggregated over, never drawn. Of the other grid keys, the two
with the most values (the earlier in the grid on a tie) are the axes, x the one that comes first
in the grid; every further key makes one panel per combination of its values (facets). One key
gives one axis; none gives one square. For composite (model.init_gamma x model.n_layers) this is
the phase diagram."""

from __future__ import annotations

import html
import json
import shlex
from collections import Counter
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

from interp.report import Report, figure_html
from interp.sweep_cells import SEED_KEY, Cell, SweepIndex, read_cells, read_sweep_index
from models.runs import REPORT, atomic_write_bytes

PAGE_JSON, PAGE_SCHEMA = "sweep_page.json", 1
NO_VERDICT = ("failed", "damaged", "pending")  # statuses whose cells add no verdict to their group
UNFINISHED = ("running", "partial")  # a verdict of these cells is provisional
NO_VERDICT_COLOUR = "#dddddd"
MAX_RATES_IN_CELL = 3  # more rates than this are left to the heatmap of rates
MAX_WRITTEN_SQUARES = 400  # squares per panel the grid figure writes text in; more are drawn small, colour only
SMALL_SQUARE_INCHES = 0.12
MAX_RATE_ROWS = 200  # runs the heatmap of rates draws; more are listed in the Cells table only
HIDDEN_FINAL = ("step", "lr", "elapsed_s", "diverged")  # last-evaluation fields the cells table leaves out


def choose_axes(grid: dict[str, list[Any]]) -> dict[str, Any]:
    """Which grid keys the figure draws: x, y (None where the grid has fewer keys), the facets,
    and the seed key aggregated over (None where the grid has no seeds)."""
    keys = [key for key in grid if key != SEED_KEY]
    chosen = sorted(keys, key=lambda key: -len(grid[key]))[:2]
    x, y = ([key for key in keys if key in chosen] + [None, None])[:2]
    return {"x": x, "y": y, "facets": [key for key in keys if key not in chosen],
            "seed": SEED_KEY if SEED_KEY in grid else None}


def _key(value: Any) -> str:
    """A grid value as JSON: the form in which the page compares values (1 and 1.0 differ)."""
    return json.dumps(value, sort_keys=True)


def _place(facet: dict[str, Any], x: Any, y: Any) -> str:
    """A square's key: its facet point and its x and y values."""
    return _key([facet, x, y])


def facet_points(grid: dict[str, list[Any]], facets: list[str]) -> list[dict[str, Any]]:
    """Every combination of the facet keys' values, first key slowest ([{}] without facets)."""
    points: list[dict[str, Any]] = [{}]
    for key in facets:
        points = [{**point, key: value} for point in points for value in grid[key]]
    return points


def group_cells(cells: list[Cell], grid: dict[str, list[Any]], axes: dict[str, Any]) -> list[dict[str, Any]]:
    """One group per facet point and (x, y) value: its runs (the seeds), their majority verdict
    with k of n, the mean of each rate over the runs that have it, and the runs' statuses. Each
    cell is placed once, by its values of the drawn keys (linear in the cells)."""
    xs = grid[axes["x"]] if axes["x"] else [None]
    ys = grid[axes["y"]] if axes["y"] else [None]
    by_place: dict[str, list[Cell]] = {}
    for cell in cells:
        facet = {key: cell.point.get(key) for key in axes["facets"]}
        x, y = (cell.point.get(axes[a]) if axes[a] else None for a in ("x", "y"))
        by_place.setdefault(_place(facet, x, y), []).append(cell)
    return [{"facet": facet, "x": x, "y": y, **_majority(by_place.get(_place(facet, x, y), []))}
            for facet in facet_points(grid, axes["facets"]) for y in ys for x in xs]


def _majority(runs: list[Cell]) -> dict[str, Any]:
    """The runs' most common verdict (label, k of n), whether it is provisional, and mean rates."""
    voting = [c for c in runs if c.status not in NO_VERDICT and (c.label is not None or c.status == "diverged")]
    labels = Counter("diverged" if c.status == "diverged" else c.label for c in voting)
    label, k = labels.most_common(1)[0] if labels else (None, 0)
    names = list(dict.fromkeys(name for c in voting for name in c.rates))
    rates = {name: round(float(np.mean([c.rates[name] for c in voting if name in c.rates])), 4) for name in names}
    return {"runs": [c.name for c in runs], "label": label, "k": k, "n": len(runs),
            "tie": len(labels) > 1 and labels.most_common(2)[1][1] == k,
            "provisional": any(c.status in UNFINISHED for c in voting),
            "statuses": dict(Counter(c.status for c in runs)), "rates": rates}


def sweep_page(folder: Path) -> dict[str, Any]:
    """What the page shows, as sweep_page.json holds it. RunFolderError (exit 2) where the
    sweep's own index is damaged; a damaged cell is listed under "damaged", never raised."""
    index = read_sweep_index(Path(folder))
    cells = read_cells(index)
    axes = choose_axes(index.grid)
    # "folder": the sweep folder as the command writing the page was given it (relative to where it
    # ran), so that the commands the page suggests run as written from there
    return {"schema": PAGE_SCHEMA, "sweep": index.folder.name, "folder": str(folder), "task": index.task,
            "preset": index.preset,
            "finished": index.finished, "grid": index.grid, "axes": axes,
            "counts": dict(Counter(c.status for c in cells)), "groups": group_cells(cells, index.grid, axes),
            "cells": {c.name: c.to_dict() for c in cells},
            "damaged": [{"cell": c.name, "error": c.error} for c in cells if c.status == "damaged"],
            "notes": _notes(index, cells)}


def _notes(index: SweepIndex, cells: list[Cell]) -> list[str]:
    return [*index.notes, *(f"{c.name}: {note}" for c in cells for note in c.notes)]


# ---------------------------------------------------------------------------------------------
# Figures


def label_colours(groups: list[dict[str, Any]]) -> dict[str, str]:
    """A colour per verdict label on the page (tab10, labels sorted, so a label keeps its colour
    across pages with the same labels)."""
    labels = sorted({g["label"] for g in groups if g["label"] is not None})
    palette = plt.get_cmap("tab10").colors
    return {label: palette[i % len(palette)] for i, label in enumerate(labels)}


def grid_figure(page: dict[str, Any]) -> plt.Figure:
    """The grid: one square per group, coloured by its majority verdict, with k of n and the
    mean deciding rates written in it; one panel per facet point."""
    grid, axes, groups = page["grid"], page["axes"], page["groups"]
    xs = grid[axes["x"]] if axes["x"] else [None]
    ys = grid[axes["y"]] if axes["y"] else [None]
    facets = facet_points(grid, axes["facets"])
    colours = label_colours(groups)
    written = len(xs) * len(ys) <= MAX_WRITTEN_SQUARES  # else small squares, colour only (the table has the text)
    square = (1.9, 1.2) if written else (SMALL_SQUARE_INCHES, SMALL_SQUARE_INCHES)
    fig, panels = plt.subplots(len(facets), 1, squeeze=False,
                               figsize=(2.0 + square[0] * len(xs), (1.0 + square[1] * len(ys)) * len(facets)))
    by_facet: dict[str, list[dict[str, Any]]] = {}
    for group in groups:
        by_facet.setdefault(_key(group["facet"]), []).append(group)
    for ax, facet in zip(panels[:, 0], facets):
        _draw_panel(ax, by_facet.get(_key(facet), []), xs, ys, colours, written)
        ax.set(xticks=range(len(xs)) if axes["x"] else [], xticklabels=[_value(v) for v in xs] if axes["x"] else [],
               yticks=range(len(ys)) if axes["y"] else [], yticklabels=[_value(v) for v in ys] if axes["y"] else [],
               xlabel=axes["x"] or "", ylabel=axes["y"] or "",
               title=", ".join(f"{k}={_value(v)}" for k, v in facet.items()))
    handles = [Patch(color=c, label=label) for label, c in colours.items()]
    handles.append(Patch(color=NO_VERDICT_COLOUR, label="no verdict yet"))
    fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, title="majority verdict")
    fig.subplots_adjust(hspace=0.5)  # the legend sits outside; figure_html's tight bounding box keeps it
    return fig


def _draw_panel(ax: plt.Axes, groups: list[dict[str, Any]], xs: list[Any], ys: list[Any],
                colours: dict[str, Any], written: bool = True) -> None:
    image = np.ones((len(ys), len(xs), 3))
    row, column = _positions(ys), _positions(xs)
    for group in groups:
        i, j = row[_key(group["y"])], column[_key(group["x"])]
        colour = to_rgb(colours.get(group["label"], NO_VERDICT_COLOUR))
        image[i, j] = colour
        dark = 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2] < 0.55
        if written:
            ax.text(j, i, cell_text(group), ha="center", va="center", fontsize=9, color="white" if dark else "black")
    ax.imshow(image, origin="lower", aspect="auto")
    ax.set_xticks(np.arange(len(xs) + 1) - 0.5, minor=True)  # a white border around every square
    ax.set_yticks(np.arange(len(ys) + 1) - 0.5, minor=True)
    ax.grid(which="minor", color="white", linewidth=2 if written else 0.5)
    ax.tick_params(which="minor", length=0)


def cell_text(group: dict[str, Any]) -> str:
    """What a square of the grid says: verdict, k of n (and the statuses of runs without a
    verdict), the mean deciding rates."""
    lines = [group["label"] or "no verdict", f"{group['k']} of {group['n']}" + (" (tie)" if group["tie"] else "")
             + (", provisional" if group["provisional"] else "")]
    waiting = {s: n for s, n in group["statuses"].items() if s in NO_VERDICT or s in UNFINISHED}
    if waiting:
        lines.append(", ".join(f"{n} {s}" for s, n in waiting.items()))
    if 0 < len(group["rates"]) <= MAX_RATES_IN_CELL:
        lines.append(" ".join(f"{name} {value:.2f}" for name, value in group["rates"].items()))
    return "\n".join(lines)


def _positions(values: list[Any]) -> dict[str, int]:
    """An axis's values (by `_key`) -> their position on the axis."""
    return {_key(value): i for i, value in enumerate(values)}


def _value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def rates_figure(page: dict[str, Any]) -> plt.Figure | None:
    """Every run's deciding rates (rows: runs, columns: rates), values written where few enough;
    None where no run has rates, or more than MAX_RATE_ROWS runs do (the Cells table lists them)."""
    cells = [c for c in page["cells"].values() if c["rates"]]
    if not cells or len(cells) > MAX_RATE_ROWS:
        return None
    names = list(dict.fromkeys(name for c in cells for name in c["rates"]))
    values = np.array([[c["rates"].get(name, np.nan) for name in names] for c in cells])
    unit = bool(np.nanmin(values) >= 0 and np.nanmax(values) <= 1)
    fig, ax = plt.subplots(figsize=(2.5 + 0.7 * len(names), 1.2 + 0.32 * len(cells)))
    image = ax.imshow(values, cmap="viridis", aspect="auto", vmin=0 if unit else None, vmax=1 if unit else None)
    ax.set(xticks=range(len(names)), xticklabels=names, yticks=range(len(cells)),
           yticklabels=[f"{c['name']} ({c['source']})" for c in cells], title="deciding rates per run")
    if values.size <= 300:
        for (i, j), value in np.ndenumerate(values):
            if np.isfinite(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                        color="white" if (value < 0.6 if unit else False) else "black")
    fig.colorbar(image, ax=ax, shrink=0.8)
    return fig


# ---------------------------------------------------------------------------------------------
# HTML


def _link(href: str, text: str) -> str:
    return f'<a href="{html.escape(href)}">{html.escape(text)}</a>'


def _html_table(rows: list[list[str]], header: list[str]) -> str:
    """A table whose cells are HTML already escaped by the caller (they hold links)."""
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<div class='table-scroll'><table><tr>{head}</tr>{body}</table></div>"  # wide tables scroll


def command(*words: str) -> str:
    """A workbench command line as the page shows it: each word quoted for the shell, escaped for HTML."""
    return f"<code>{html.escape(shlex.join(['workbench', *words]))}</code>"


def run_links(cell: dict[str, Any], folder: str) -> str:
    """A run's folder and report links (or the command that writes the report, from where the
    sweep's `folder` is a path), and its timeline's decision where it has one. The links are
    relative to the sweep folder, where the page is."""
    report = cell["report"]
    parts = [_link(cell["href"], "folder"),
             _link(report["href"], "report") if report["exists"] else
             f"no report yet ({command('analyze', str(Path(folder) / cell['name']))})"]
    timeline = cell["timeline"]
    if timeline:
        decided = timeline["decided_at"]
        parts.append(_link(timeline["href"], "timeline") + html.escape(
            f": {timeline['final_label']}, decided at step {decided}" if decided is not None else ": undecided"))
    else:
        parts.append("no timeline")
    return "; ".join(parts)


def _verdict_text(cell: dict[str, Any]) -> str:
    if cell["label"] is None:
        return html.escape(cell["status"] + (f": {cell['error']}" if cell["error"] else ""))
    return html.escape(f"{cell['label']} (from {cell['source']}, step {cell['step']})")


def _run_line(cell: dict[str, Any], seed_key: str | None, folder: str) -> str:
    """One run inside a square of the grid table."""
    who = f"{seed_key.rpartition('.')[2]}={_value(cell['point'][seed_key])}" if seed_key else cell["name"]
    rates = " ".join(f"{k} {v:.2f}" for k, v in list(cell["rates"].items())[:MAX_RATES_IN_CELL])
    return (f"<div><b>{html.escape(who)}</b> [{html.escape(cell['status'])}] {_verdict_text(cell)} "
            f"{html.escape(rates)}<br>{run_links(cell, folder)}</div>")


def grid_table_html(page: dict[str, Any]) -> str:
    """The grid again as a table (same layout as the figure, highest y first), each square
    listing its runs with their links; one table per facet point."""
    grid, axes = page["grid"], page["axes"]
    xs = grid[axes["x"]] if axes["x"] else [None]
    ys = grid[axes["y"]] if axes["y"] else [None]
    by_place = {_place(g["facet"], g["x"], g["y"]): g for g in page["groups"]}
    parts = []
    for facet in facet_points(grid, axes["facets"]):
        if facet:
            parts.append(f"<h3>{html.escape(', '.join(f'{k}={_value(v)}' for k, v in facet.items()))}</h3>")
        rows = []
        for y in reversed(ys):
            row = [html.escape(f"{axes['y']}={_value(y)}") if axes["y"] else ""]
            for x in xs:
                group = by_place[_place(facet, x, y)]
                head = html.escape(cell_text(group).replace("\n", "; "))
                row.append(f"<div class='verdict-cell'><b>{head}</b></div>" +
                           "".join(_run_line(page["cells"][name], axes["seed"], page["folder"])
                                   for name in group["runs"]))
            rows.append(row)
        parts.append(_html_table(rows, ["", *(f"{axes['x']}={_value(x)}" if axes["x"] else "all runs" for x in xs)]))
    return "".join(parts)


def cells_table_html(page: dict[str, Any]) -> str:
    """Every cell: status, verdict and its source, rates, timeline, report, last evaluation."""
    cells = list(page["cells"].values())
    metrics = sorted({m for c in cells for m in c["final"] if m not in HIDDEN_FINAL})
    rows = [[html.escape(c["name"]), html.escape(c["status"]), html.escape(c["label"] or "-"),
             html.escape(f"{c['source']} (step {c['step']})" if c["source"] else "-"),
             html.escape(" ".join(f"{k} {v:.3f}" for k, v in c["rates"].items())), run_links(c, page["folder"]),
             *(html.escape(_fmt(c["final"].get(m))) for m in metrics)] for c in cells]
    return _html_table(rows, ["cell", "status", "verdict", "verdict from", "rates", "links", *metrics])


def _fmt(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else ("" if value is None else str(value))


def _summary_html(page: dict[str, Any]) -> str:
    axes = page["axes"]
    state = "finished" if page["finished"] else "in progress (or stopped before its end): sweep.json is not written yet"
    drawn = " x ".join(k for k in (axes["x"], axes["y"]) if k) or "no grid key but the seed"
    facets = f"; one panel per {', '.join(axes['facets'])}" if axes["facets"] else ""
    seeds = (f"; {axes['seed']} aggregated (k of n: the runs of the majority verdict, of all seeds)"
             if axes["seed"] else "")
    counts = ", ".join(f"{n} {s}" for s, n in page["counts"].items())
    return (f"<p>Task <code>{html.escape(str(page['task']))}</code>, preset "
            f"<code>{html.escape(str(page['preset']))}</code>; sweep {html.escape(state)}. Cells: "
            f"{html.escape(counts)}.</p><p>Axes: {html.escape(drawn + facets + seeds)}. A verdict comes from the run's "
            "analysis.json, else the last point of its timeline.json, else the last record of its metrics.jsonl (the "
            f"task's summary); each run says which.</p>{_analyse_hint(page)}")


def _analyse_hint(page: dict[str, Any]) -> str:
    """The command that analyses every finished cell not analysed yet, where there is one."""
    waiting = [c for c in page["cells"].values() if c["status"] == "done" and c["source"] != "analysis.json"]
    if not waiting:
        return ""
    return (f"<p>{len(waiting)} finished cell(s) have no analysis yet: {command('analyze', page['folder'])} "
            "analyses them (heads, patching, verdict; a report each) and writes this page again.</p>")


def page_html(page: dict[str, Any]) -> str:
    """The whole page. Its figures draw the grid's values, names and labels as written: a `$` in
    them is text, never matplotlib's mathtext (`text.parse_math` off while they are made and saved)."""
    with plt.rc_context({"text.parse_math": False}):
        return _page_html(page)


def _page_html(page: dict[str, Any]) -> str:
    report = Report(f"Sweep {page['sweep']}")
    report.add("Grid", _summary_html(page) + figure_html(
        grid_figure(page), "Each square: the majority verdict over seeds (its colour), k of n, and the mean deciding "
                           "rates of the runs that have a verdict.") + grid_table_html(page))
    figure = rates_figure(page)
    if figure is not None:
        report.add("Rates per run", figure_html(figure, "Each run's deciding rates (from its verdict's source)."))
    elif sum(bool(c["rates"]) for c in page["cells"].values()) > MAX_RATE_ROWS:
        report.add("Rates per run", f"<p>Not drawn for more than {MAX_RATE_ROWS} runs: the Cells table lists each "
                                    "run's rates.</p>")
    report.add("Cells", cells_table_html(page))
    problems = [[html.escape(d["cell"]), html.escape(d["error"] or "")] for d in page["damaged"]]
    problems += [[html.escape(c["name"]), html.escape(c["error"] or "")] for c in page["cells"].values()
                 if c["status"] == "failed"]
    if problems:
        report.add("Damaged and failed cells", "<p>A failed cell is retried by running the sweep again; a damaged one "
                                               "needs its file moved away or repaired.</p>"
                   + _html_table(problems, ["cell", "error"]))
    if page["notes"]:
        report.add("Notes", "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in page["notes"]) + "</ul>")
    return report.to_html()


def write_sweep_page(folder: Path) -> tuple[dict[str, Any], Path, Path]:
    """Write the sweep's report.html and sweep_page.json (nothing else, nothing into its runs);
    returns the page and the two paths."""
    folder = Path(folder)
    page = sweep_page(folder)
    json_path, html_path = folder / PAGE_JSON, folder / REPORT
    atomic_write_bytes(json_path, json.dumps(page, indent=1, allow_nan=False).encode())
    atomic_write_bytes(html_path, page_html(page).encode("utf-8"))
    return page, html_path, json_path
