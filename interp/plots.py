"""Matplotlib figures for reports (Agg backend: no display needed)."""

from __future__ import annotations

from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def lego_curves(metrics: list[dict[str, Any]], supervised: list[bool]) -> plt.Figure:
    """Per-variable test accuracy over training steps (solid: supervised, dashed: not), and loss."""
    records = [m for m in metrics if "acc_per_var" in m]
    steps = [m["step"] for m in records]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 3.8))
    per_var = list(zip(*[m["acc_per_var"] for m in records])) if records else []
    colours = plt.cm.viridis([i / max(1, len(per_var) - 1) for i in range(len(per_var))])
    for i, accs in enumerate(per_var):
        ax_acc.plot(steps, accs, color=colours[i], linestyle="-" if supervised[i] else "--", label=f"#{i}")
    ax_acc.set(xlabel="step", ylabel="test accuracy", ylim=(0.0, 1.02), title="per-variable accuracy (chain order)")
    ax_acc.legend(fontsize=7, ncol=2)
    _loss_panel(ax_loss, records)
    fig.tight_layout()
    return fig


def composite_curves(metrics: list[dict[str, Any]]) -> plt.Figure:
    """Seen-pair accuracy and the held-out pair's inferential/symmetric rates over steps, and loss."""
    records = [m for m in metrics if "acc_seen" in m]
    steps = [m["step"] for m in records]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax_acc.plot(steps, [m["acc_seen"] for m in records], label="seen pairs (test keys)")
    if records and "held_out_inferential" in records[-1]:
        ax_acc.plot(steps, [m.get("held_out_inferential") for m in records], label="held-out: inferential")
        ax_acc.plot(steps, [m.get("held_out_symmetric") for m in records], label="held-out: symmetric")
    ax_acc.set(xlabel="step", ylabel="rate", ylim=(0.0, 1.02), title="accuracy and held-out answers")
    ax_acc.legend(fontsize=8)
    _loss_panel(ax_loss, records)
    fig.tight_layout()
    return fig


def templates_curves(metrics: list[dict[str, Any]]) -> plt.Figure:
    """Test accuracy (symbols never seen in training) over steps, per class where there are
    classes, and loss."""
    records = [m for m in metrics if "acc" in m]
    steps = [m["step"] for m in records]
    fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(11, 3.8))
    for key, label in (("acc", "all"), ("acc_same", "same"), ("acc_different", "different")):
        if records and key in records[-1]:
            ax_acc.plot(steps, [m.get(key) for m in records], label=label)
    ax_acc.set(xlabel="step", ylabel="test accuracy", ylim=(0.0, 1.02), title="accuracy on unseen symbols")
    ax_acc.legend(fontsize=8)
    _loss_panel(ax_loss, records)
    fig.tight_layout()
    return fig


def _loss_panel(ax: plt.Axes, records: list[dict[str, Any]]) -> None:
    steps = [m["step"] for m in records]
    ax.plot(steps, [m["train_loss"] for m in records], label="train")
    ax.plot(steps, [m["eval_loss"] for m in records], label="test")
    ax.set(xlabel="step", ylabel="cross-entropy", yscale="log", title="loss")
    ax.legend(fontsize=8)


def head_score_heatmaps(scores: dict[str, list[list[float]]], labels: list[list[str]]) -> plt.Figure:
    """One heatmap per kind (layer x head), each head annotated with its label's initial."""
    kinds = list(scores)
    fig, axes = plt.subplots(1, len(kinds), figsize=(3.0 * len(kinds), 0.5 * len(labels) + 1.8), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        image = ax.imshow(scores[kind], cmap="RdBu_r", vmin=-1, vmax=1, aspect="auto")
        ax.set(title=kind, xlabel="head", ylabel="layer", xticks=range(len(labels[0])), yticks=range(len(labels)))
        for layer, row in enumerate(labels):
            for head, label in enumerate(row):
                if label == kind:
                    ax.text(head, layer, "*", ha="center", va="center", fontsize=14, color="black")
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.8, label="score (0 = uniform, 1 = all mass on target)")
    return fig


def heatmap(values: list[list[float]], xlabel: str, ylabel: str, title: str, xticklabels: list[str] | None = None,
            vmin: float | None = None, vmax: float | None = None, cmap: str = "RdBu_r") -> plt.Figure:
    """A labelled heatmap (rows = y, columns = x)."""
    n_rows, n_cols = len(values), len(values[0])
    fig, ax = plt.subplots(figsize=(min(14, 1.2 + 0.35 * n_cols), 1.2 + 0.4 * n_rows))
    image = ax.imshow(values, cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    ax.set(xlabel=xlabel, ylabel=ylabel, title=title, yticks=range(n_rows))
    if xticklabels is not None:
        ax.set_xticks(range(n_cols), xticklabels, rotation=90, fontsize=7)
    fig.colorbar(image, ax=ax)
    fig.tight_layout()
    return fig
