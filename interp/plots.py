"""Matplotlib figures for reports (Agg backend: no display needed). Each task's training curves
are in its module of interp/tasks/."""

from __future__ import annotations

import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402


def loss_panel(ax: plt.Axes, records: list[dict[str, Any]]) -> None:
    """Train and test loss over steps: the right-hand panel of every task's training curves. A
    record without a loss leaves a gap in its line."""
    steps = [m["step"] for m in records]
    ax.plot(steps, [m.get("train_loss", math.nan) for m in records], label="train")
    ax.plot(steps, [m.get("eval_loss", math.nan) for m in records], label="test")
    ax.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="loss")
    plain_log_labels(ax)
    ax.legend(fontsize=8)


def plain_log_labels(ax: plt.Axes) -> None:
    """A log axis spanning less than a decade labels its ticks 0.05, 5.1, ..., not 5.1 x 10^0."""
    low, high = ax.get_ylim()
    if low > 0 and high / low < 10:
        plain = FuncFormatter(lambda value, _: f"{value:.3g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)


def rates_and_loss(metrics: list[dict[str, Any]], series: list[tuple[str, str]], ylabel: str, title: str) -> plt.Figure:
    """Training curves of a task: on the left the `series` (metric key, label) over steps, each
    drawn where the records have it (the first key selects the records), on the right the loss."""
    records = [m for m in metrics if series[0][0] in m]
    steps = [m["step"] for m in records]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 3.8))
    for key, label in series:
        if records and key in records[-1]:
            ax_acc.plot(steps, [m.get(key) for m in records], label=label)
    ax_acc.set(xlabel="step", ylabel=ylabel, ylim=(0.0, 1.02), title=title)
    ax_acc.legend(fontsize=8)
    loss_panel(ax_loss, records)
    fig.tight_layout()
    return fig


def tick_step(n: int, most: int) -> int:
    """Every how many rows or columns to label so that at most `most` labels show (1: all)."""
    return max(1, -(-n // most))


def integer_ticks(ax: plt.Axes, n_cols: int, n_rows: int, most_x: int = 20, most_y: int = 24) -> None:
    """Integer ticks only (an image 1 column wide otherwise gets -0.5, 0.0, 0.5 crowded under it),
    thinned to at most `most_x` / `most_y` labels."""
    ax.set_xticks(range(0, n_cols, tick_step(n_cols, most_x)))
    ax.set_yticks(range(0, n_rows, tick_step(n_rows, most_y)))


def head_score_heatmaps(scores: dict[str, list[list[float]]], labels: list[list[str]]) -> plt.Figure:
    """One heatmap per kind (layer x head), * on each head whose label is that kind. Panels
    share the layer axis (labelled once); each panel is at least 2 inches wide, so a one-head model
    stays legible, and grows with the heads."""
    kinds = list(scores)
    n_layers, n_heads = len(labels), len(labels[0])
    width = max(2.0, 0.9 + 0.3 * n_heads)
    fig, axes = plt.subplots(1, len(kinds), figsize=(width * len(kinds) + 1.2, 0.32 * n_layers + 1.9), squeeze=False,
                             sharey=True)
    for index, (ax, kind) in enumerate(zip(axes[0], kinds)):
        image = ax.imshow(scores[kind], cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        ax.set(title=kind, xlabel="head")
        integer_ticks(ax, n_heads, n_layers, most_x=8)
        if index == 0:
            ax.set_ylabel("layer")
        for layer, row in enumerate(labels):
            for head, label in enumerate(row):
                if label == kind:
                    ax.text(head, layer, "*", ha="center", va="center", fontsize=14 if n_heads * n_layers <= 64 else 9,
                            color="black")
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="score (0 = uniform, 1 = all mass on target)")
    return fig


def heatmap(values: list[list[float]], xlabel: str, ylabel: str, title: str, xticklabels: list[str] | None = None,
            vmin: float | None = None, vmax: float | None = None, cmap: str = "RdBu_r") -> plt.Figure:
    """A labelled heatmap (rows = y, columns = x). Integer ticks, thinned where there are many
    rows or columns; at least 3.2 x 2.2 inches, so one head or one layer stays readable."""
    n_rows, n_cols = len(values), len(values[0])
    fig, ax = plt.subplots(figsize=(min(14.0, max(3.2, 1.6 + 0.35 * n_cols)), max(2.2, 1.2 + 0.32 * n_rows)))
    image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
    integer_ticks(ax, n_cols, n_rows)
    if xticklabels is not None and len(xticklabels) == n_cols:  # else the integer ticks stand
        ax.set_xticks(range(n_cols), xticklabels, rotation=90, fontsize=7)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    return fig


def rate_bars(series: dict[str, list[float | None]], xlabel: str, ylabel: str, title: str,
              xticklabels: list[str] | None = None) -> plt.Figure:
    """Grouped bars: one group per index (e.g. key position), one bar per series; a missing value
    (None) is left out and marked "n/a" at the foot of its slot. Rates, so the axis runs 0 to 1."""
    names = list(series)
    n = max((len(v) for v in series.values()), default=0)
    fig, ax = plt.subplots(figsize=(min(12.0, max(4.0, 2.0 + 0.5 * n)), 2.8))
    width = 0.8 / max(1, len(names))
    for k, name in enumerate(names):
        xs = [i + (k - (len(names) - 1) / 2) * width for i, v in enumerate(series[name]) if v is not None]
        ax.bar(xs, [v for v in series[name] if v is not None], width=width, label=name)
    for i in range(n):
        if all(i >= len(v) or v[i] is None for v in series.values()):
            ax.text(i, 0.02, "n/a", ha="center", fontsize=7, color="0.4")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title, ylim=(0.0, 1.05))
    ax.set_xticks(range(n), xticklabels if xticklabels is not None and len(xticklabels) == n else range(n))
    if len(names) > 1:
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    return fig


def faithfulness_curve(curve: list[float], target: float, kept: int) -> plt.Figure:
    """A circuit's faithfulness over the number of heads kept (0 .. all), the target dashed and
    the circuit's size dotted."""
    fig, ax = plt.subplots(figsize=(5.5, 2.8))
    ax.plot(range(len(curve)), curve, marker=".", color="tab:blue")
    ax.axhline(target, color="0.4", linestyle="--", linewidth=1)
    ax.axvline(kept, color="0.4", linestyle=":", linewidth=1)
    ax.set(xlabel="heads kept (largest |effect| first)", ylabel="faithfulness", xlim=(-0.5, len(curve) - 0.5))
    fig.tight_layout()
    return fig


LABELLED_TOKENS = 24  # an attention grid names its tokens up to this many (more would not be legible, and slow)


def attention_grid(patterns: Any, tokens: list[str], names: list[list[str]], causal: bool) -> plt.Figure:
    """Every head's attention on one example, a small heatmap per head (rows: layers, columns:
    heads), each titled with its name and label: the whole model at a size a page can hold.
    `patterns` is [layer, head, query, key] (numpy or torch, on the CPU). Token names label the
    outer edges where there are few enough to read (LABELLED_TOKENS); a causal model's future keys
    are left blank. The heads are tiles of one image on one axes: a figure of 48 axes took seconds
    to lay out and draw, one image takes a fraction of one."""
    import numpy as np
    from matplotlib.patches import Rectangle

    values = np.asarray(patterns, dtype=float)
    n_layers, n_heads, n_pos = values.shape[0], values.shape[1], values.shape[-1]
    if causal:
        values = np.where(np.tril(np.ones((n_pos, n_pos), dtype=bool)), values, np.nan)
    named = n_pos <= LABELLED_TOKENS  # token names on the outer edges, as plain texts (ticks cost more to lay out)
    cell = 2.3 if named else 2.8  # inches a head
    gap = math.ceil(0.3 * n_pos / cell)  # blank tokens between two heads: about 0.3 inch
    band = math.ceil(0.25 * n_pos / cell)  # blank rows above a head, for its title
    across, down = n_pos + gap, band + n_pos + gap  # from one head's corner to the next one's
    mosaic = np.full((n_layers * down - gap, n_heads * across - gap), np.nan)
    for layer in range(n_layers):
        for head in range(n_heads):
            top, left = layer * down + band, head * across
            mosaic[top:top + n_pos, left:left + n_pos] = values[layer, head]
    inch = cell / n_pos  # a token's width
    fig, ax = plt.subplots(figsize=(mosaic.shape[1] * inch + 0.8, mosaic.shape[0] * inch + 0.6))
    blues = plt.get_cmap("Blues").with_extremes(bad="white")  # the gaps, and a causal model's future keys
    image = ax.imshow(mosaic, cmap=blues, vmin=0, vmax=1, interpolation="nearest")
    for layer in range(n_layers):
        for head in range(n_heads):
            left, top = head * across - 0.5, layer * down + band - 0.5
            ax.add_patch(Rectangle((left, top), n_pos, n_pos, fill=False, linewidth=0.6, edgecolor="0.6",
                                   clip_on=False))
            ax.text(left + n_pos / 2, top - 0.2, names[layer][head], ha="center", va="bottom", fontsize=9)
    if named:
        bottom = n_layers * down - gap - 0.5
        for i, token in enumerate(tokens):
            for head in range(n_heads):
                ax.text(head * across + i, bottom + 0.3, token, rotation=90, ha="center", va="top", fontsize=5)
            for layer in range(n_layers):
                ax.text(-0.8, layer * down + band + i, token, ha="right", va="center", fontsize=5)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_frame_on(False)
    names_pt = 3.2 * max(map(len, tokens)) + 6 if named else 0  # room the token names take
    ax.annotate("key", (0.5, 0), xycoords="axes fraction", xytext=(0, -names_pt - 4), textcoords="offset points",
                ha="center", va="top", fontsize=8)
    ax.annotate("query", (0, 0.5), xycoords="axes fraction", xytext=(-names_pt - 6, 0), textcoords="offset points",
                ha="right", va="center", rotation=90, fontsize=8)
    fig.colorbar(image, ax=ax, shrink=min(0.6, 3.0 / n_layers), label="attention")
    return fig
