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
# # Composite functions: does the initialisation scale decide the solution?
#
# Each sequence holds a key x followed by two anchors (a1, a2); the answer is x shifted by both
# anchors. The pair (4,3) is never trained, and its mirror (3,4) is trained on x-6 instead of the
# composition x-10. On (4,3) an *inferential* model composes the primitives (x-10); a *symmetric*
# one copies the mirror pair's target (x-6).
#
# The composite-function paper finds the answer set by the initialisation rate gamma (every
# weight drawn with std d_in^-gamma): small init (large gamma, 0.8) -> inferential, large init
# (small gamma, 0.5) -> symmetric. Here we train the same model at both scales and put their
# verdicts and mechanisms side by side: answers on the held-out pair, attention from the last
# token to key and anchors, similarity of representations with equal targets, and probes.

# %%
import os
from pathlib import Path

import circuitsvis as cv
from IPython.display import HTML, display

from interp.attention import attention_patterns, classify_heads
from interp.report import figure_html, table_html
from interp.tasks.composite import composite_curves, composite_probe_map, composite_verdict
from models.config import ModelConfig, RunConfig, TrainConfig
from models.presets import get_preset
from models.train import train_or_load
from tasks import CompositeConfig, seeded_generator

# %% tags=["parameters"]
# Parameters. SCALE "tiny" trains two 2-layer models for a few dozen steps (seconds; what the
# test suite runs, too short to fit: both verdicts read "unlearned"); "small" trains the
# composite-cpu preset at each gamma (1,000 steps, a few minutes each on 2 cores). Finished runs
# in OUT are loaded, not retrained.
SCALE = os.environ.get("WORKBENCH_NOTEBOOK_SCALE", "small")
OUT = Path(os.environ.get("WORKBENCH_NOTEBOOK_OUT", "runs/notebooks"))
GAMMAS = {"small init": 0.8, "large init": 0.5}  # name -> model.init_gamma

# %%
# What each scale costs: the run to train (before its gamma is set), and how many samples the
# analyses draw.
SCALES = {
    "tiny": dict(
        config=RunConfig(
            task=CompositeConfig(),
            model=ModelConfig(n_layers=2, d_model=32, n_heads=1, d_mlp=64),
            train=TrainConfig(steps=40, batch_size=32, warmup_steps=4, eval_every=10, eval_size=128,
                              checkpoint_every=40),
        ),
        n_verdict=256, n_probe=512, n_heads_sample=64,
    ),
    "small": dict(config=get_preset("composite-cpu"), n_verdict=2000, n_probe=4000, n_heads_sample=512),
}
if SCALE not in SCALES:
    raise ValueError(f"SCALE={SCALE!r} is unknown; use one of {sorted(SCALES)}")
S = SCALES[SCALE]



runs = {name: train_or_load(S["config"].with_overrides([f"model.init_gamma={gamma}"]),
                            OUT / f"composite-{SCALE}-gamma{gamma}", progress=SCALE != "tiny")
        for name, gamma in GAMMAS.items()}
for name, run in runs.items():
    print(f"{name}: {run.path} (gamma {run.config.model.init_gamma}, {run.config.train.steps} steps)")

# %% [markdown]
# ## Training curves
# Seen-pair accuracy, and what each model answers on the held-out pair while it trains.

# %%
for name, run in runs.items():
    display(HTML(f"<h3>{name}</h3>" + figure_html(composite_curves(run.metrics))))

# %% [markdown]
# ## Verdicts side by side
# Seen-pair accuracy on test keys; on the held-out pair (4,3), the share of answers that are
# inferential (x-10), symmetric (x-6) or neither. "unlearned" when seen pairs are below 90%.

# %%
verdicts = {name: composite_verdict(run.model, run.task, n=S["n_verdict"]) for name, run in runs.items()}
evidence = ["verdict", "seen_accuracy", "held_out_inferential", "held_out_symmetric", "held_out_other",
            "cosine_same_target", "cosine_different_target"]
display(HTML(table_html([[key, *[getattr(v, key) for v in verdicts.values()]] for key in evidence],
                        ["evidence", *[f"{name} (gamma {GAMMAS[name]})" for name in runs]])))

# %% [markdown]
# ## Mechanisms side by side
# Head-averaged attention per layer on held-out sequences. The paper's inferential mechanism
# first moves the key into the anchors (anchor -> key in layer 0), then reads the anchors from
# the last token; the symmetric one reads the anchor pair as a unit.

# %%
flow_names = list(next(iter(verdicts.values())).attention_flow)
n_layers = len(next(iter(verdicts.values())).attention_flow[flow_names[0]])
rows = [[flow, f"L{layer}", *[round(v.attention_flow[flow][layer], 3) for v in verdicts.values()]]
        for flow in flow_names for layer in range(n_layers)]
display(HTML(table_html(rows, ["attention", "layer", *runs])))

# %% [markdown]
# The attention of every head on one held-out sequence, for each model (causal: each token sees
# only the ones before it).

# %%
for name, run in runs.items():
    task = run.task
    held_out_pair = task.is_held_out.nonzero()[:1, 0]  # the first held-out pair's id, as a batch of one
    example = task.sample(1, seeded_generator(12345), split="test", pair_ids=held_out_pair)
    patterns = attention_patterns(run.model, example.tokens)[:, 0]  # [layer, head, query_pos, key_pos]
    names = [f"L{layer}H{head}" for layer in range(patterns.shape[0]) for head in range(patterns.shape[1])]
    display(HTML(f"<h3>{name}</h3>"))
    display(cv.attention.attention_heads(attention=patterns.flatten(0, 1), tokens=task.token_strings(example.tokens[0]),
                                         attention_head_names=names, mask_upper_tri=task.causal))

# %% [markdown]
# Head labels from attention scores (the same classifier as for LEGO).

# %%
labels = {name: classify_heads(run.model, run.task,
                               run.task.sample(S["n_heads_sample"], seeded_generator(0), split="test").tokens).labels
          for name, run in runs.items()}
display(HTML(table_html([[f"L{layer}",
                          *[", ".join(labels[name][layer]) for name in runs]] for layer in range(n_layers)],
                        ["layer", *runs])))

# %% [markdown]
# ## Probes side by side
# Where the key, the first composition g(key; a1) and the target are linearly readable: at the
# key, at each anchor and at the last position, layer by layer. An inferential model should
# hold g(key; a1) somewhere before it answers.

# %%
probe_maps = {name: composite_probe_map(run.model, run.task, n_train=S["n_probe"], n_test=S["n_probe"])
              for name, run in runs.items()}
first = next(iter(probe_maps.values()))
rows = [[site, quantity, layer, *[round(m.at(site, quantity)[i].item(), 3) for m in probe_maps.values()]]
        for site in first.site_names for quantity in first.quantity_names for i, layer in enumerate(first.layer_names)]
display(HTML(table_html(rows, ["site", "quantity", "layer", *runs])))
for name, verdict in verdicts.items():
    print(f"{name} (gamma {GAMMAS[name]}): {verdict.verdict}")
