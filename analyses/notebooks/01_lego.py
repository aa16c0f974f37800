# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # LEGO: which heads follow the chain?
#
# A LEGO sentence is a shuffled chain of clauses, `a = + 1 ; b = - a ; ...`; the model reads
# each variable's value at its left-hand token. This notebook takes one trained model and asks,
# step by step, *how* it gets the values:
#
# 1. every head's attention, inline (circuitsvis);
# 2. head scores and labels (association, manipulation, broadcast, previous, self);
# 3. activation patching on counterfactual twins (which heads and positions carry the answer);
# 4. layer-wise linear probes (where each variable's value becomes readable);
# 5. the verdict, with its evidence.
#
# Every step calls the public functions of `tasks/`, `models/` and `interp/`, the same ones
# `workbench analyze` uses. Open this file in Jupyter or VS Code (jupytext percent format).

# %%
import os
from pathlib import Path

import circuitsvis as cv
from IPython.display import HTML, display

from interp import plots
from interp.attention import attention_patterns, classify_heads
from interp.patching import attribute_head_out, logit_diff_metric, patch_head_out, patch_residual
from interp.report import figure_html, table_html
from interp.task_analysis import counterfactual_pairs
from interp.tasks.lego import lego_curves
from interp.tasks.lego_probes import lego_probe_map, percolation_summary
from interp.tasks.lego_verdict import lego_parity_rules, lego_verdict
from models.config import ModelConfig, RunConfig, TrainConfig
from models.presets import get_preset
from models.runs import load_run
from models.train import train_or_load
from tasks import LegoConfig, seeded_generator

# %% tags=["parameters"]
# Parameters. SCALE "tiny" trains a 2-layer model for a few dozen steps (seconds; what the test
# suite runs); "small" loads RUN_DIR when it exists (`make demo` writes runs/demo), else trains
# the lego-cpu preset there (about 6 minutes on 2 cores).
SCALE = os.environ.get("WORKBENCH_NOTEBOOK_SCALE", "small")
OUT = Path(os.environ.get("WORKBENCH_NOTEBOOK_OUT", "runs/notebooks"))  # where runs are trained
RUN_DIR = Path(os.environ.get("WORKBENCH_NOTEBOOK_RUN", "runs/demo"))  # "small": load this run if it exists

# %%
# What each scale costs: the run to train, and how many samples the analyses draw.
SCALES = {
    "tiny": dict(
        config=RunConfig(
            task=LegoConfig(n_vars=4, n_supervised=2),
            model=ModelConfig(n_layers=2, d_model=32, n_heads=2, d_mlp=64),
            train=TrainConfig(steps=40, batch_size=32, warmup_steps=4, eval_every=10, eval_size=128,
                              checkpoint_every=40),
        ),
        n_heads_sample=64, n_pairs=16, n_probe=256, n_verdict=256,
    ),
    "small": dict(config=get_preset("lego-cpu"), n_heads_sample=512, n_pairs=64, n_probe=3000, n_verdict=2000),
}
if SCALE not in SCALES:
    raise ValueError(f"SCALE={SCALE!r} is unknown; use one of {sorted(SCALES)}")
S = SCALES[SCALE]

# the demo's run when it is there (whatever it was trained with), else train (or reuse) our own
use_demo = SCALE == "small" and (RUN_DIR / "model.safetensors").exists()
run = load_run(RUN_DIR) if use_demo else train_or_load(S["config"], OUT / f"lego-{SCALE}", progress=SCALE != "tiny")
model, task = run.model, run.task
print(f"run {run.path}: {model.cfg.n_layers} layers x {model.cfg.n_heads} heads, {task.cfg.n_vars} variables, "
      f"#0..#{task.cfg.n_supervised - 1} supervised; planted heads: {run.config.model.planted or 'none'}")

# %% [markdown]
# ## Training curves
# Solid lines are supervised variables, dashed ones are not (length extrapolation).

# %%
supervised = task.sample(1, seeded_generator(0), split="test").loss_mask[0].tolist()
display(HTML(figure_html(lego_curves(run.metrics, supervised), "Per-variable test accuracy during training.")))

# %% [markdown]
# ## 1. The attention of every head
# One test sentence; hover a head to zoom in. `mask_upper_tri=False`: the LEGO model is a
# bidirectional encoder, every token sees every other one.

# %%
example = task.sample(1, seeded_generator(12345), split="test")
strings = task.token_strings(example.tokens[0])
patterns = attention_patterns(model, example.tokens)[:, 0]  # [layer, head, query_pos, key_pos]
n_layers, n_heads = patterns.shape[:2]
print(task.decode(example.tokens[0]))
cv.attention.attention_heads(
    attention=patterns.flatten(0, 1),  # every head of every layer in one view
    tokens=strings,
    attention_head_names=[f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)],
    mask_upper_tri=task.causal,
)

# %% [markdown]
# ## 2. Head scores and labels
# Each score is the attention mass on the kind's targets relative to uniform attention
# (0 = uniform, 1 = all mass on the targets); a head gets the label of its best kind when the
# score passes the threshold calibrated on planted heads, else "mixed".

# %%
heads = classify_heads(model, task, task.sample(S["n_heads_sample"], seeded_generator(0), split="test").tokens)
scores = heads.to_dict()["scores"]
display(HTML(figure_html(plots.head_score_heatmaps(scores, heads.labels), "Head scores; * marks each head's label.")))
display(HTML(table_html([[f"L{layer}", *row] for layer, row in enumerate(heads.labels)],
                        ["layer", *[f"H{head}" for head in range(n_heads)]])))
print("association heads:", heads.heads_labelled("association"))

# %% [markdown]
# ## 3. Activation patching
# Clean sentences and their twins with the root clause's group element flipped (so every
# variable's value changes), all with the same clause order. Copy one activation from clean
# into corrupted and measure the logit difference at the deepest variable the model fits:
# 1 = the clean answer is restored, 0 = still the corrupted one.

# %%
clean, corrupted, slot, description = counterfactual_pairs(task, S["n_pairs"], seed=0, model=model)
metric = logit_diff_metric(clean, corrupted, label_index=slot)
residual = patch_residual(model, clean.tokens, corrupted.tokens, metric)
head_out = patch_head_out(model, clean.tokens, corrupted.tokens, metric)
attribution = attribute_head_out(model, clean.tokens, corrupted.tokens, metric)
print(f"{description}; logit difference {residual.clean_metric:.2f} clean vs {residual.corrupted_metric:.2f} corrupted")
display(HTML(figure_html(plots.heatmap(residual.values.tolist(), "position", "layer", "residual stream "
                                                                                      "(clean -> corrupted)",
                                       task.token_strings(clean.tokens[0]), -1.0, 1.0))))
display(HTML(figure_html(plots.heatmap(head_out.values.tolist(), "head", "layer", "head outputs, exact", None, -1.0,
                                       1.0))))
display(HTML(figure_html(plots.heatmap(attribution.values.tolist(), "head", "layer", "head outputs, attribution", None,
                                       -1.0, 1.0))))

# %% [markdown]
# ## 4. Probes
# For every layer's residual stream and every chain depth, a linear classifier reads the
# variable's value at its own token. A for-loop solution shows a diagonal: depth k becomes
# readable about one layer after depth k-1.

# %%
probes = lego_probe_map(model, task, n_train=S["n_probe"], n_test=S["n_probe"])
display(HTML(figure_html(plots.heatmap(probes.accuracy.tolist(), "chain depth", "layer", "probe accuracy",
                                       probes.depth_names, 0.0, 1.0, "viridis"))))
print(f"first layer reaching {probes.threshold:.0%} per depth: {probes.first_layer}; "
      f"{percolation_summary(probes.first_layer)}; chance {probes.chance:.2f}")

# %% [markdown]
# ## 5. The verdict
# Per-variable accuracy, the extrapolation gap, and when each variable was learned (the parity
# shortcut learns the last variable before the middle ones).

# %%
verdict = lego_verdict(model, task, run.metrics, n=S["n_verdict"])
for line in verdict.findings:
    print("-", line)
display(HTML(table_html(
    [[f"#{i}", acc, "yes" if sup else "no", step]
     for i, (acc, sup, step) in enumerate(zip(verdict.acc_per_var, verdict.supervised, verdict.learned_step))],
    ["variable", "test accuracy", "supervised", "learned at step"])))

# %% [markdown]
# ## 6. What each variable's answer computes
# In Z2 every true value is a parity: #k = x0 + g0 + ... + gk (root value, then the chain's
# group elements). The rule the model's answers agree with most, among all parities, says what
# it computes where it is wrong. For example, x0 + g0 + g2 + g3 for #3 means "one hop, then stop",
# and x0 + g0 + ... + g5 everywhere is the parity shortcut.

# %%
if task.cfg.group == "z2":  # parities describe Z2 only
    rules = lego_parity_rules(model, task, n=S["n_verdict"])
    display(HTML(table_html([[f"#{r.variable}", r.describe(), r.agreement, "yes" if r.is_true_rule else "no",
                              r.accuracy]
                             for r in rules], ["variable", "closest parity rule", "agreement", "true rule",
                                               "accuracy"])))
