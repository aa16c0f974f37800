"""The figures of the findings page, drawn from committed data (data/*.json) and the zoo.

Each function takes its data file's contents and returns a matplotlib figure; `draw_all` writes
them as PNGs. PNG metadata carries no date or version, so a redraw from the same numbers with the
same matplotlib gives the same bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch, Rectangle  # noqa: E402

from models.runs import read_metrics  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"
VERDICT_COLOURS = {"inferential": "#3b6fb6", "symmetric": "#e08a2c", "mixed": "#b0b0b0"}
ARCH_COLOURS = {"BERT": "#c0392b", "ALBERT": "#2471a3"}
DPI = 90


def composite_phase(data: dict[str, Any]) -> plt.Figure:
    """(depth x gamma) grid; each cell split into one strip per seed, coloured by the verdict on
    the held-out pair and labelled with its x-10 / x-6 rates."""
    gammas, depths, seeds = data["gammas"], data["depths"], data["seeds"]
    cells = {(c["depth"], c["gamma"], c["seed"]): c for c in data["cells"]}
    fig, ax = plt.subplots(figsize=(8.2, 4.6))
    width = 1.0 / len(seeds)
    for row, depth in enumerate(depths):
        for col, gamma in enumerate(gammas):
            for k, seed in enumerate(seeds):
                cell = cells[(depth, gamma, seed)]
                x = col + k * width
                ax.add_patch(Rectangle((x, row), width, 1, facecolor=VERDICT_COLOURS[cell["verdict"]],
                                       edgecolor="white", linewidth=1.5))
                mark = "*" if "note" in cell else ""
                ax.text(x + width / 2, row + 0.5, f"s{seed}\nx-10 {cell['x10']:.2f}\nx-6 {cell['x6']:.2f}{mark}",
                        ha="center", va="center", fontsize=6.5,
                        color="black" if cell["verdict"] == "mixed" else "white")
    ax.set(xlim=(0, len(gammas)), ylim=(0, len(depths)), ylabel="depth (layers)",
           xlabel="init scale gamma (std = d_in^-gamma; larger = smaller init)")
    ax.set_xticks([c + 0.5 for c in range(len(gammas))], [str(g) for g in gammas])
    ax.set_yticks([r + 0.5 for r in range(len(depths))], [str(d) for d in depths])
    ax.set_title("Composite at the matched protocol: verdict per run (seeds 0-2), held-out pair (4,3)", fontsize=10)
    ax.legend(handles=[Patch(color=c, label=v) for v, c in VERDICT_COLOURS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8, frameon=False)
    fig.text(0.99, 0.01, "* a note in the lab notebook (seen accuracy, or the rate by key position)",
             ha="right", fontsize=6.5, color="#555555")
    fig.tight_layout()
    return fig


def zoo_accuracy(entry: str) -> list[float]:
    """Per-variable test accuracy at a zoo entry's last evaluation (its metrics.jsonl)."""
    records = [r for r in read_metrics(ROOT / entry) if "acc_per_var" in r]
    return records[-1]["acc_per_var"]


def lego_per_variable(data: dict[str, Any]) -> plt.Figure:
    """Per-variable accuracy, one panel per depth; BERT red, ALBERT blue, seed 0 solid, seed 1
    dashed; the supervised variables shaded; hollow circles are the zoo entries' own metrics."""
    panels = data["panels"]
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 3.6), sharey=True,
                             gridspec_kw={"width_ratios": [p["n_vars"] for p in panels]})
    for ax, panel in zip(axes, panels, strict=True):
        ax.axvspan(-0.5, panel["supervised"] - 0.5, color="#eeeeee")
        for model in panel["models"]:
            colour, style = ARCH_COLOURS[model["arch"]], "-" if model["seed"] == 0 else "--"
            ax.plot(range(len(model["acc"])), model["acc"], style, marker=".", color=colour,
                    label=f"{model['arch']} s{model['seed']}")
            if "range" in model:
                first, last, low, high = model["range"]
                ax.add_patch(Rectangle((first - 0.3, low), last - first + 0.6, high - low, color=colour, alpha=0.35))
        for zoo in panel["zoo"]:
            acc = zoo_accuracy(zoo["entry"])
            ax.plot(range(len(acc)), acc, "o", mfc="none", ms=5, color=ARCH_COLOURS[zoo["arch"]], alpha=0.8)
        ax.axhline(0.5, color="#888888", linewidth=0.6, linestyle=":")
        ax.set(title=f"{panel['layers']} layers, n = {panel['n_vars']} ({panel['device']})", xlabel="variable #",
               ylim=(0.4, 1.03))
        ax.set_xticks(range(panel["n_vars"]))
        ax.title.set_fontsize(9)
    axes[0].set_ylabel("test accuracy")
    handles, labels = axes[0].get_legend_handles_labels()
    handles.append(plt.Line2D([], [], marker="o", mfc="none", color="#555555", linestyle="none"))
    labels.append("zoo entry")
    fig.legend(handles, labels, loc="lower center", ncol=5, fontsize=8, frameon=False)
    fig.suptitle("LEGO: BERT vs ALBERT per variable (shaded: supervised; dotted: chance)", fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def templates_efficiency(data: dict[str, Any]) -> plt.Figure:
    """Four panels against the number of training symbols: the 600-step losses (plain vs
    augmented), the test errors of transformers and MLPs by input setting, the losses trained to
    the stop rule, and the copy template's errors by width."""
    fig, (left, middle, right, copy) = plt.subplots(1, 4, figsize=(16, 3.7))
    short = data["steps600"]
    for name, colour in (("plain", "#555555"), ("augmented", "#2471a3")):
        series = short[name]
        left.errorbar(short["n"], series["loss"], yerr=series["std"], marker="o", ms=3, capsize=2, color=colour,
                      label=name)
    left.set(xscale="log", yscale="log", xlabel="training symbols n", ylabel="test loss, unseen symbols",
             title="600 steps, seeds 0-2 (mean ± std)")
    inputs = data["inputs"]
    middle.plot(short["n"], short["plain"]["error"], "o-", ms=3, color="#555555",
                label="transformer (plain), frozen emb.")
    trained = inputs["transformer_learned_embeddings"]
    middle.errorbar(trained["n"], trained["error"], yerr=trained["std"], marker="s", ms=3, capsize=2,
                    color="#2e8b57", label="transformer, learned emb.")
    middle.plot(inputs["mlp_one_hot"]["n"], inputs["mlp_one_hot"]["error"], "^-", ms=3, color="#c0392b",
                label="MLP, one-hot")
    middle.plot(inputs["mlp_frozen_embeddings"]["n"], inputs["mlp_frozen_embeddings"]["error"], "v:", ms=3,
                color="#c0392b", label="MLP, frozen emb.")
    middle.set(xscale="log", xlabel="training symbols n", ylabel="test error, unseen symbols", ylim=(-0.02, 0.55),
               title="who generalises (600 steps, mean of 3 seeds)")
    long = data["stop_rule"]
    for series in long["series"]:
        label = series["label"]
        colour = "#2471a3" if label.startswith("augmented") else "#8e44ad" if "3e-2" in label else "#555555"
        style = "--" if "seed 1" in series["label"] else "-"
        marker = "s" if "3e-2" in series["label"] else ("^" if "1x" in series["label"] else "o")
        right.plot(long["n"], series["loss"], style, marker=marker, ms=3, color=colour, label=series["label"])
    right.set(xscale="log", yscale="log", xlabel="training symbols n", ylabel="test loss, unseen symbols",
              title="stop rule, up to 3,000 steps")
    widths = data["copy_width"]
    shades = {32: "#a9cce3", 128: "#5499c7", 256: "#1b4f72"}
    for series in widths["series"]:
        plain = series["variant"] == "plain"
        errors = [float("nan") if e is None else e for e in series["error"]]
        copy.plot(widths["n"], errors, "-" if plain else "--", marker="o" if plain else "s", ms=3,
                  color=shades[series["width"]], label=f"{series['variant']}, d {series['width']}")
    copy.axhline(0.05, color="#999999", lw=0.6, ls=":")
    copy.set(xscale="log", xlabel="training symbols n", ylabel="test error, unseen symbols", ylim=(-0.03, 1.05),
             title="copy, by width (stop rule, seed 0)")
    for ax in (left, middle, right, copy):
        ax.title.set_fontsize(9)
        ax.legend(fontsize=6.5)
    fig.suptitle("Templates: same-different data efficiency, and copying by width "
                 "(augmented = identity scalars a_h, b_h)", fontsize=10)
    fig.tight_layout()
    return fig


def composite_spike(data: dict[str, Any]) -> plt.Figure:
    """Left: the whole run's training loss (log) with the held-out pair's x-10 and x-6 on a second
    axis; right: the training loss of each replay from the kept state, step by step."""
    columns = data["run_columns"]
    run = {name: [row[i] for row in data["run"]] for i, name in enumerate(columns)}
    fig, (ax_run, ax_replay) = plt.subplots(1, 2, figsize=(12, 3.8), gridspec_kw={"width_ratios": [1.4, 1]})
    ax_run.plot(run["step"], run["train_loss"], color="black", label="training loss")
    ax_run.set(yscale="log", xlabel="step", ylabel="training loss (nats, log)",
               title="the run: loss and held-out answers")
    rates = ax_run.twinx()
    rates.plot(run["step"], run["held_out_inferential"], color=VERDICT_COLOURS["inferential"],
               label="x-10 (inferential)")
    rates.plot(run["step"], run["held_out_symmetric"], color=VERDICT_COLOURS["symmetric"], label="x-6 (symmetric)")
    rates.set(ylim=(0, 1), ylabel="held-out pair answers (fraction)")
    lines = ax_run.get_legend_handles_labels()[0] + rates.get_legend_handles_labels()[0]
    ax_run.legend(handles=lines, fontsize=8, loc="center left")
    styles = {"none": ("as trained", "black", "-"), "float64": ("loss in float64", "#7b3294", "--"),
              "eps1e-6": ("Adam eps 1e-6", "#1a9641", "-")}
    for name, rows in data["replays"].items():
        label, colour, line = styles.get(name, (name, "grey", ":"))
        ax_replay.plot([r[0] for r in rows], [r[1] for r in rows], color=colour, linestyle=line, label=label)
    ax_replay.set(yscale="log", xlabel="step", ylabel="training loss (nats, log)",
                  title=f"replays from step {data['replays']['none'][0][0] - 1}")
    ax_replay.legend(fontsize=8)
    fig.tight_layout()
    return fig


FIGURES = {
    "composite-matched-phase.png": ("composite_matched_phase.json", composite_phase),
    "lego-bert-albert.png": ("lego_per_variable.json", lego_per_variable),
    "templates-efficiency.png": ("templates_efficiency.json", templates_efficiency),
    "composite-spike.png": ("composite_spike.json", composite_spike),
}


def draw_all(out_dir: Path, data_dir: Path = DATA) -> list[Path]:
    """Write every figure of FIGURES into `out_dir` as a PNG; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (data_file, draw) in FIGURES.items():
        fig = draw(json.loads((data_dir / data_file).read_text()))
        path = out_dir / name
        fig.savefig(path, dpi=DPI, metadata={"Software": None})
        plt.close(fig)
        written.append(path)
    return written
