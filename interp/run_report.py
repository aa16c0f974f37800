"""The report of one trained run, in the order a reader asks: the summary and how the heads came
to be, the verdict and its evidence (heads, patching, circuit, probes: `workbench analyze`), the
timeline, the training curves, every head's attention on a few decoded test examples, and the
configuration last, folded."""

from __future__ import annotations

import html
import json
from pathlib import Path

from interp import plots
from interp.analysis import RunAnalysis
from interp.analysis_file import read_analysis
from interp.analysis_html import analysis_sections
from interp.attention import attention_patterns
from interp.report import Report, figure_html
from interp.report_format import pair_grid_html, pair_keys
from interp.tasks import task_analysis
from models.runs import REPORT, LoadedRun, non_finite_note, non_finite_weights
from tasks import seeded_generator


def build_run_report(run: LoadedRun, n_examples: int = 2, seed: int = 12345,
                     analysis: RunAnalysis | None = None) -> Report:
    """Summary, configuration, curves, attention views; with `analysis` (or the run's
    analysis.json), also the verdict, head scores, patching and probes."""
    from interp.timeline import read_timeline
    from interp.timeline_html import timeline_html

    report = Report(f"interp-workbench run: {run.path.name}")
    # analysis.json and timeline.json are read checked against every field the sections draw
    # (interp.analysis_file, interp.timeline), both before anything is drawn: a damaged one is refused at once
    written = analysis.to_dict() if analysis is not None else read_analysis(run.path)
    timeline = read_timeline(run.path)
    report.add("Summary", _non_finite_html(run) + _summary_html(run) + _analysed_weights_html(run, written))
    if written:
        analysis_sections(report, written)
    if timeline is not None:
        report.add("Timeline: the solution through training", timeline_html(timeline, run.metrics))
    report.add("Training curves", _curves_html(run))
    labels = written["heads"]["labels"] if written else None  # read by analysis_sections above
    report.add("Attention patterns", _attention_html(report, run, n_examples, seed, labels))
    config = run.config.to_json()
    report.add("Configuration", f"<pre>{html.escape(config)}</pre>",
               folded=f"config.json, {config.count(chr(10)) + 1} lines: open to read")
    return report


def _non_finite_html(run: LoadedRun) -> str:
    """A warning at the top when the model's weights hold NaN or infinity (its numbers below mean nothing)."""
    weights = non_finite_weights(run.model)
    if not weights:
        return ""
    return f"<p class='warning'><strong>{html.escape(non_finite_note([], weights)['statement'])}.</strong></p>"


def _analysed_weights_html(run: LoadedRun, written: dict | None) -> str:
    """Which weights the analysis below read, and a warning where they are not the ones loaded
    now (an analysis of an earlier checkpoint, or of other weights)."""
    if not written:
        return ""
    analysed = written["weights"]
    if analysed is None:
        return "<p>The analysis below does not record which weights it read (an older analysis.json).</p>"
    line = f"The analysis below read the weights of step {html.escape(str(analysed.get('step')))}"
    if run.weights is not None and analysed.get("digest") != run.weights.digest:
        return (f"<p><strong>{line}, not the weights in this folder now (step {run.weights.step}): its numbers may "
                f"not describe them. Run <code>workbench analyze {html.escape(str(run.path))}</code> "
                "again.</strong></p>")
    return f"<p>{line} (sha256 {html.escape(str(analysed.get('digest', ''))[:12])}...).</p>"


def write_run_report(run: LoadedRun, path: str | Path | None = None, **kwargs) -> Path:
    return build_run_report(run, **kwargs).write(path or run.path / REPORT)


HEAD_ORIGINS = {
    "planted": "some heads' attention patterns are planted (hardcoded: {planted}), so the head classifier finds "
               "what was put in there",
    "mimicked": "mimicked, then learned: {steps} steps of mimicking pre-training on random tokens (heads 0 and 1 of "
                "every layer imitate conv and same-token patterns), then the task",
    "warm-started": "warm-started from the weights of {source} (train.init_from); that run's origin applies too",
    "learned": "learned: random initialisation, nothing planted or mimicked",
}


def heads_origin_html(run: LoadedRun) -> str:
    """One paragraph: how this model got its heads (RunConfig.heads_origin), in words."""
    cfg = run.config
    origin = cfg.heads_origin
    planted = ", ".join(f"{_where(w)} {kind}" for w, kind in cfg.model.planted.items())
    text = HEAD_ORIGINS[origin].format(planted=planted, steps=cfg.train.mimic_steps, source=cfg.train.init_from)
    note = task_analysis(cfg.task.name).planted_note if origin == "planted" else ""
    note = f" {note}" if note else ""
    return f"<p class='origin'><b>Heads: {html.escape(text)}.</b>{note}</p>"


def _where(key: str) -> str:
    """A planted-head key ("1.0", or "*.0" for every layer) in words."""
    layer, head = key.split(".")
    return f"head {head} of every layer" if layer == "*" else f"layer {layer} head {head}"


# what every run's metrics.jsonl records, in words with units (a task names its own: TaskAnalysis.metric_words)
METRIC_WORDS = {"step": "training step", "lr": "learning rate at that step", "train_loss":
                "training loss on the last batch (nats)", "eval_loss": "loss on the evaluation batch (nats)",
                "elapsed_s": "training time so far (seconds)", "stopped": "why training stopped early",
                "diverged": "the loss became NaN or infinite"}


def _summary_html(run: LoadedRun) -> str:
    final = next((m for m in reversed(run.metrics) if "eval_loss" in m), None)
    if final is None:
        return heads_origin_html(run) + "<p>No evaluation was recorded.</p>"
    words = {**METRIC_WORDS, **task_analysis(run.config.task.name).metric_words()}
    grids = {k: v for k, v in final.items() if pair_keys(v) is not None}  # acc_per_pair: a grid, below
    rows = "".join(f"<tr><td>{_named(k, words)}</td><td>{html.escape(readable(k, v))}</td></tr>"
                   for k, v in final.items() if k not in grids)
    sample = (f"<p>Last evaluation, at step {html.escape(str(final['step']))}, on this run's evaluation batch: "
              f"{run.config.train.eval_size} sequences of the test split, drawn once when training began (the "
              "verdict below, where there is one, measures on fresh sequences instead). Hover a field for its "
              "key in metrics.jsonl.</p>")
    return (heads_origin_html(run) + sample + f"<table><tr><th>quantity</th><th>value</th></tr>{rows}</table>"
            + "".join(_pair_grid_html(run, k, v, words) for k, v in grids.items()))


def _named(key: str, words: dict[str, str]) -> str:
    """A metrics field in words, its raw key in a tooltip; the key itself where it has no words."""
    if key not in words:
        return f"<code>{html.escape(key)}</code>"
    return f"<abbr title='{html.escape(key, quote=True)}'>{html.escape(words[key])}</abbr>"


def _pair_grid_html(run: LoadedRun, key: str, values: dict[str, float], words: dict[str, str]) -> str:
    """A metric per (anchor 1, anchor 2) pair as a grid; the pairs held out of training (a task
    config's `held_out`, where it has one) outlined."""
    held_out = set(getattr(run.config.task, "held_out", None) or ())
    note = " Outlined: held out of training." if held_out else ""
    return (f"<p>{_named(key, words)}, per pair (row: first anchor, column: second anchor; green: 1).{note}</p>"
            + (pair_grid_html(values, held_out) or ""))


def readable(key: str, value: object) -> str:
    """A metric as a reader wants it: losses to 3 significant figures, the learning rate in
    scientific notation, other fractions to 3 decimals (an evaluation of 2000 rows carries no
    more); lists and dicts element by element."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return json.dumps(value)
    if isinstance(value, float):
        if key == "lr":
            return f"{value:.2e}"
        return f"{value:.3g}" if "loss" in key else f"{round(value, 3)}"
    if isinstance(value, list):
        return "[" + ", ".join(readable(key, v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {readable(key, v)}" for k, v in value.items()) + "}"
    return json.dumps(value, default=str)


def _curves_html(run: LoadedRun) -> str:
    steps = task_analysis(run.config.task.name)
    return figure_html(steps.curves(run), steps.curves_caption)


def _attention_html(report: Report, run: LoadedRun, n_examples: int, seed: int,
                    labels: list[list[str]] | None = None) -> str:
    """Every head's attention on `n_examples` test examples: per example, one figure of every
    head (named with its label where the run is analysed), then the interactive circuitsvis views,
    one per layer, folded."""
    batch = run.task.sample(n_examples, seeded_generator(seed), split="test")
    device = next(run.model.parameters()).device
    patterns = attention_patterns(run.model, batch.tokens.to(device)).cpu()  # [layer, batch, head, q, k]
    n_layers, n_heads = run.model.cfg.n_layers, run.model.cfg.n_heads
    names = [[f"L{layer}H{head}" + (f" {_label(labels, layer, head)}" if labels else "") for head in range(n_heads)]
             for layer in range(n_layers)]
    parts = []
    for i in range(n_examples):
        strings = run.task.token_strings(batch.tokens[i])
        keep = _visible_length(strings)
        parts.append(f"<p class='example'>Example {i + 1}: {html.escape(' '.join(strings[:keep]))}</p>")
        parts.append(figure_html(
            plots.attention_grid(patterns[:, i, :, :keep, :keep].numpy(), strings[:keep], names, run.task.causal),
            f"Example {i + 1}: every head's attention (rows: layers; columns: heads; each row of a square is a "
            "query, its columns the keys it attends to; darker is more)" + (", each head with its label from "
            "the analysis." if labels else "; analyse the run to name each head's label.")))
        views = "".join(f"<div>Layer {layer}</div>" + report.attention_widget(
            strings[:keep], patterns[layer, i, :, :keep, :keep], names[layer], run.task.causal)
            for layer in range(n_layers))
        parts.append(f"<details class='views'><summary>Example {i + 1}, interactive (circuitsvis): hover a head to "
                     f"zoom, click to lock; {n_layers} layer(s)</summary>{views}</details>")
    return "".join(parts)


def _label(labels: list[list[str]], layer: int, head: int) -> str:
    """A head's label from analysis.json, or "" where the file has none for it."""
    try:
        return str(labels[layer][head])
    except (IndexError, TypeError):
        return ""


def _visible_length(strings: list[str]) -> int:
    """Positions up to the last non-padding token."""
    keep = len(strings)
    while keep > 1 and strings[keep - 1] == "[PAD]":
        keep -= 1
    return keep


