"""The report's timeline section, drawn from timeline.json (interp/timeline.py): the verdict's
evidence over steps, the loss with every change of verdict marked, which head becomes what and
when (labels, patching shares, circuit membership), and when the verdict settled."""

from __future__ import annotations

import html
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

from interp import plots
from interp.report import figure_html, table_html

CHANGE_STYLE = {"color": "0.35", "linestyle": ":", "linewidth": 1.0}
DECIDED_STYLE = {"color": "black", "linestyle": "-", "linewidth": 1.2}


def timeline_html(timeline: dict[str, Any], metrics: list[dict[str, Any]]) -> str:
    """The whole section: a sentence saying when the verdict settled, then the figures and tables."""
    points, summary = timeline["points"], timeline["summary"]
    steps = [p["step"] for p in points]
    parts = [_decided_html(summary, len(points), timeline), figure_html(
        evidence_figure(points, summary), "The verdict's evidence at every snapshot. Dotted lines: a change of "
        "verdict; solid line: the step from which the verdict no longer changes.")]
    measured = any(p.get("loss") is not None for p in points)
    if measured or any("train_loss" in m for m in metrics):
        parts.append(figure_html(loss_figure(metrics, points, summary), _loss_caption(metrics, points, timeline)))
    parts.append(figure_html(heads_figure(points), "Per head (rows) and snapshot (columns): its label (colour), and "
                                                   "its exact patching share; a dot marks a head of the circuit. A "
                                                   "white column: the model did not tell clean from corrupted inputs "
                                                   "apart at that snapshot, so no share is defined."))
    parts.append(_crossings_html(summary))
    parts.append(_heads_table_html(summary, steps))
    return "".join(parts)


def _loss_caption(metrics: list[dict[str, Any]], points: list[dict[str, Any]], timeline: dict[str, Any]) -> str:
    caption = ("Loss (cross-entropy in nats, log scale) with the snapshots (green ticks), the event snapshots kept "
               "just before a loss spike (red triangles), the verdict's changes (dotted) and the step it settled "
               "(solid).")
    if any(p.get("loss") is not None for p in points):
        return caption + (" Black dots: the test loss of every snapshot's weights, from step 0, on "
                          f"{timeline.get('loss_sample', 'a fixed test batch')}; lines: the training record "
                          "(metrics.jsonl), from its first evaluation.")
    first = next((m["step"] for m in metrics if "train_loss" in m), None)
    before = sum(p["step"] < first for p in points)
    return caption + (f" The loss is recorded from the first evaluation (step {first}); {before} of the "
                      f"{len(points)} snapshots come before it (this timeline.json predates the loss at "
                      "every snapshot: analyse the timeline again for it)." if before else "")


def _decided_html(summary: dict[str, Any], n: int, timeline: dict[str, Any]) -> str:
    changes = "; ".join(f"{html.escape(c['from'])} &rarr; {html.escape(c['to'])} at step {c['step']}"
                        for c in summary["changes"]) or "none"
    return (f"<p class='verdict'>{html.escape(str(summary['final_label']))}, decided at step "
            f"{summary['decided_at']}</p><p>{n} snapshots analysed; changes of verdict: {changes}. Patching: "
            f"{html.escape(str(timeline.get('pairs', '')))}. Circuit: "
            f"{html.escape(str(timeline.get('circuit_form', '')))}. Heads: "
            f"{html.escape(str(timeline.get('heads_origin', '')))}.</p>")


def _mark(ax: plt.Axes, summary: dict[str, Any]) -> None:
    for change in summary["changes"]:
        ax.axvline(max(change["step"], 1), **CHANGE_STYLE)
    if summary["decided_at"] is not None:
        ax.axvline(max(summary["decided_at"], 1), **DECIDED_STYLE)


def _steps_axis(ax: plt.Axes, steps: list[int]) -> None:
    """Log-spaced snapshots (the default) on a symmetric-log axis, which shows step 0 and the late
    steps alike; snapshots spanning less than two decades (a list of evenly spaced steps) on a
    linear one."""
    positive = [s for s in steps if s > 0]
    if positive and max(positive) / min(positive) > 100:
        ax.set_xscale("symlog", linthresh=min(positive))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps, not 2.5 or 7.5
    ax.set_xlim(0, max(steps, default=1) * 1.1)
    ax.set_xlabel("step")


def evidence_figure(points: list[dict[str, Any]], summary: dict[str, Any]) -> plt.Figure:
    """One panel per evidence group, each series a line over the snapshots' steps."""
    panels = list(points[0]["panels"]) if points else []
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.6 * max(1, len(panels)), 3.6), squeeze=False)
    steps = [p["step"] for p in points]
    for ax, panel in zip(axes[0], panels):
        names = list(dict.fromkeys(name for p in points for name in p["panels"].get(panel, {})))
        series = [[p["panels"].get(panel, {}).get(name, np.nan) for p in points] for name in names]
        for name, values in zip(names, series):
            ax.plot(steps, values, marker=".", label=name)
        _rates_axis(ax, series)
        _mark(ax, summary)
        _steps_axis(ax, steps)
        ax.set_title(panel, fontsize=10)
        if len(names) <= 10:
            ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def _rates_axis(ax: plt.Axes, series: list[list[float]]) -> None:
    """Rates (every value in [0, 1]) on the whole 0-1 axis: a 0-0.03 axis makes noise look like learning."""
    values = [v for one in series for v in one if v is not None and np.isfinite(v)]
    if values and min(values) >= 0 and max(values) <= 1:
        ax.set_ylim(-0.02, 1.02)


def loss_figure(metrics: list[dict[str, Any]], points: list[dict[str, Any]], summary: dict[str, Any]) -> plt.Figure:
    records = [m for m in metrics if "train_loss" in m]
    steps = [m["step"] for m in records]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ax.plot(steps, [m["train_loss"] for m in records], label="train (record)")
    if records and "eval_loss" in records[-1]:
        ax.plot(steps, [m.get("eval_loss", np.nan) for m in records], label="test (record)")
    measured = [(p["step"], p["loss"]) for p in points if p.get("loss") is not None]
    if measured:
        ax.plot([step for step, _ in measured], [loss for _, loss in measured], marker="o", markersize=3.5,
                linestyle="none", color="black", label="test, at each snapshot")
    ax.set(yscale="log", ylabel="cross-entropy (nats)", title="loss, snapshots and changes of verdict")
    plots.plain_log_labels(ax)
    events = False
    for point in points:
        ax.axvline(max(point["step"], 1), ymax=0.04, color="tab:green")
        if any(r.startswith("before step") for r in point["reasons"]):
            events = True
            ax.plot([max(point["step"], 1)], [ax.get_ylim()[1]], marker="v", color="tab:red", clip_on=False)
    _mark(ax, summary)
    _steps_axis(ax, [p["step"] for p in points] + steps)
    handles, _ = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], color="tab:green", marker="|", linestyle="none", markersize=10, label="snapshot"))
    if events:
        handles.append(Line2D([], [], color="tab:red", marker="v", linestyle="none", label="event snapshot"))
    if summary.get("changes"):
        handles.append(Line2D([], [], label="verdict changes", **CHANGE_STYLE))
    if summary.get("decided_at") is not None:
        handles.append(Line2D([], [], label="verdict settled", **DECIDED_STYLE))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def heads_figure(points: list[dict[str, Any]]) -> plt.Figure:
    """Two heatmaps over (head, snapshot): the label as a category, and the patching share
    (blank where the model has no clean/corrupted gap to normalise by); circuit heads dotted."""
    heads = [(layer, head) for layer, row in enumerate(points[0]["head_labels"]) for head in range(len(row))]
    labels = sorted({p["head_labels"][layer][head] for p in points for layer, head in heads})
    codes = np.array([[labels.index(p["head_labels"][layer][head]) for p in points] for layer, head in heads])
    shares = np.array([[np.nan if p["head_patching"] is None else p["head_patching"][layer][head] for p in points]
                       for layer, head in heads], dtype=float)
    height = 2.4 + 0.28 * len(heads)
    fig, (ax_label, ax_share) = plt.subplots(1, 2, figsize=(min(22, 7 + 0.5 * len(points)), height))
    colours = iter(plt.get_cmap("tab10").colors)
    palette = ListedColormap([(0.85, 0.85, 0.85) if label == "mixed" else next(colours) for label in labels] or ["w"])
    ax_label.imshow(codes, cmap=palette, vmin=-0.5, vmax=len(labels) - 0.5, aspect="auto", interpolation="nearest")
    ax_label.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=palette(i)) for i in range(len(labels))],
                    labels=labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    image = ax_share.imshow(shares, cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto", interpolation="nearest")
    fig.colorbar(image, ax=ax_share, shrink=0.8, label="exact patching share")
    share_title = "patching share (dot: in the circuit; white: no share defined)"
    for ax, title in ((ax_label, "head label"), (ax_share, share_title)):
        ax.set(title=title, yticks=range(len(heads)), yticklabels=[f"L{layer}H{head}" for layer, head in heads])
        ax.set_xticks(range(len(points)), [str(p["step"]) for p in points], rotation=90, fontsize=7)
        ax.set_xlabel("snapshot step")
    for column, point in enumerate(points):
        for row, (layer, head) in enumerate(heads):
            if f"L{layer}H{head}" in point["circuit"]:
                ax_share.plot(column, row, marker="o", markersize=3, color="black")
    fig.tight_layout()
    return fig


def _crossings_html(summary: dict[str, Any]) -> str:
    """The first step each series of the first panel reaches each level."""
    crossings = summary.get("crossings") or {}
    panel, series = next(iter(crossings.items()), (None, None))
    if not series:
        return ""
    levels = list(next(iter(series.values())))
    rows = [[name, *("never" if found[level] is None else found[level] for level in levels)]
            for name, found in series.items()]
    return (f"<p>First snapshot at which each series of <em>{html.escape(panel)}</em> reaches a level "
            "(the order in which the model learns them):</p>"
            + table_html(rows, ["series", *[f">= {lv}" for lv in levels]]))


def _heads_table_html(summary: dict[str, Any], steps: list[int]) -> str:
    """When each head that ever carries the effect, joins the circuit or gets a label did so."""
    rows = []
    for name, found in summary.get("heads", {}).items():
        if found["carrier_from"] is None and found["circuit_from"] is None and not found["labels"]:
            continue
        labels = ", ".join(f"{label} from {step}" for label, step in found["labels"].items()) or "mixed throughout"
        rows.append([name, _or_never(found["carrier_from"]), _or_never(found["circuit_from"]), labels])
    if not rows:
        return "<p>No head carries the effect, joins the circuit or gets a label at any snapshot.</p>"
    return ("<p>When each head formed: the first snapshot at which it carries at least 0.3 of the patching effect, "
            "joins the circuit, and holds each label.</p>"
            + table_html(rows, ["head", "carrier from step", "in circuit from step", "labels"]))


def _or_never(step: int | None) -> str:
    return "never" if step is None else str(step)
