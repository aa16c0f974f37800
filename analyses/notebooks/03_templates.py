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
# # Templates: can a transformer tell "same" from "different" for symbols it never saw?
#
# Same-different strings are two symbols, `a a -> 1` or `a b -> 0`. The model trains on symbols
# from one alphabet (`x0 ... x{n-1}`) and is tested on a disjoint one (`z*`), so the test
# measures reasoning with abstract symbols, not memorised pairs. The template paper (docs/papers.md,
# section 3) finds that a plain transformer needs a large training alphabet for this, and that
# *identity-augmented attention* cuts the data needed by about an order of magnitude: per head
# two trainable scalars a_h, b_h (from 0) add `a_h * X X^T` to the attention scores (attend to
# the same symbol) and `b_h * A_h X` to the head's output (copy what is attended to).
#
# Here we train the same model with and without the identity terms, on the same training
# alphabet, and compare them step by step:
#
# 1. test loss and accuracy on unseen symbols (and on the training alphabet, for the gap);
# 2. the attention of every head on an unseen "same" string (circuitsvis);
# 3. head scores: does the second symbol attend to the first when they are equal?
# 4. the learned a_h, b_h, and what the model loses when they are switched off.
#
# Both models keep their token embeddings at the random init (`model.fixed_embeddings`), so an
# unseen symbol looks statistically like a seen one on the way in and out.

# %%
import os
from pathlib import Path

import circuitsvis as cv
import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from IPython.display import HTML, display

import interp.tasks  # noqa: F401 (registers each task's presets)
from interp import plots
from interp.attention import attention_patterns, classify_heads, mass_on_keys
from interp.report import figure_html, table_html
from models.config import ModelConfig, RunConfig, TrainConfig
from models.presets import get_preset
from models.train import train_or_load
from tasks import TemplatesConfig, logits_at_labels, seeded_generator

# %% tags=["parameters"]
# Parameters. SCALE "tiny" trains two 2-layer models for a few dozen steps (seconds; what the
# test suite runs, too short to learn: expect chance); "small" trains the templates-cpu preset
# (600 steps, under a minute each on one core) with and without the identity terms. N_TRAIN is
# the training alphabet size; finished runs in OUT are loaded, not retrained.
SCALE = os.environ.get("WORKBENCH_NOTEBOOK_SCALE", "small")
OUT = Path(os.environ.get("WORKBENCH_NOTEBOOK_OUT", "runs/notebooks"))
N_TRAIN = int(os.environ.get("WORKBENCH_NOTEBOOK_N_TRAIN", "64"))  # training symbols (the x* alphabet)
VARIANTS = {"plain": False, "augmented": True}  # name -> model.identity_attention

# %%
# What each scale costs: the run to train (before its variant and alphabet are set), and how
# many unseen-symbol strings the evaluations draw.
SCALES = {
    "tiny": dict(
        config=RunConfig(
            task=TemplatesConfig(template="same_different", n_val_symbols=4, n_test_symbols=64),
            model=ModelConfig(n_layers=2, d_model=32, n_heads=4, fixed_embeddings=True),
            train=TrainConfig(steps=40, batch_size=64, lr=3e-3, warmup_steps=4, eval_every=10, eval_size=128,
                              checkpoint_every=40),
        ),
        n_eval=256,
    ),
    "small": dict(config=get_preset("templates-cpu"), n_eval=2000),
}
if SCALE not in SCALES:
    raise ValueError(f"SCALE={SCALE!r} is unknown; use one of {sorted(SCALES)}")
S = SCALES[SCALE]



runs = {name: train_or_load(S["config"].with_overrides([f"model.identity_attention={str(augmented).lower()}",
                                                        f"task.n_train_symbols={N_TRAIN}"]),
                            OUT / f"templates-{SCALE}-n{N_TRAIN}-{name}", progress=SCALE != "tiny")
        for name, augmented in VARIANTS.items()}
task = runs["plain"].task  # both runs share the task: same alphabets, same token ids
print(f"training alphabet x0..x{N_TRAIN - 1}; test alphabet z0..z{task.cfg.n_test_symbols - 1} (never trained on)")
for name, run in runs.items():
    print(f"{name}: {run.path} ({run.config.train.steps} steps, "
          f"identity_attention={run.config.model.identity_attention})")

# %% [markdown]
# ## Training curves
# Test loss and accuracy on unseen symbols during training (the trainer evaluates on the test
# alphabet). Chance is accuracy 0.5.

# %%
fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
for name, run in runs.items():
    steps = [r["step"] for r in run.metrics]
    axes[0].plot(steps, [r["eval_loss"] for r in run.metrics], marker="o", label=name)
    axes[1].plot(steps, [r["acc"] for r in run.metrics], marker="o", label=name)
axes[0].set(xlabel="step", ylabel="test loss (unseen symbols)", yscale="log")
axes[1].set(xlabel="step", ylabel="test accuracy (unseen symbols)", ylim=(0, 1.02))
axes[0].legend()
fig.tight_layout()
display(HTML(figure_html(fig, f"Same-different, n = {N_TRAIN} training symbols, tested on unseen ones.")))

# %% [markdown]
# ## 1. Test loss and accuracy, unseen vs seen symbols
# Cross-entropy at the label position and accuracy, overall and per class, on fresh strings from
# the test alphabet and from the training alphabet. A model that memorised its training symbols
# does well on the second and at chance on the first.


# %%
@torch.no_grad()
def evaluate(run, split: str, seed: int = 7) -> dict:
    """Loss and accuracies of a run on `S["n_eval"]` fresh strings from one alphabet."""
    batch = run.task.sample(S["n_eval"], seeded_generator(seed), split=split)
    picked = logits_at_labels(run.model(batch.tokens), batch.label_pos)  # [batch, label, d_vocab_out]
    loss = F.cross_entropy(picked[:, 0], batch.labels[:, 0]).item()
    return {"loss": round(loss, 4), **run.task.accuracy(batch, picked.argmax(-1))}


scores = {(name, split): evaluate(run, split) for name, run in runs.items() for split in ("test", "train")}
columns = ["loss", "acc", "acc_same", "acc_different"]
display(HTML(table_html([[name, "unseen (z*)" if split == "test" else "trained (x*)", *[s[c] for c in columns]]
                         for (name, split), s in scores.items()], ["model", "symbols", *columns])))

# %% [markdown]
# ## 2. The attention of every head on an unseen "same" string
# Causal model: the second symbol can look at the first or at itself. The `a_h X X^T` term adds
# the symbols' similarity to the scores, so a head with a large a_h looks back at an equal symbol.

# %%
candidates = task.sample(64, seeded_generator(12345), split="test")
example = candidates.select(candidates.latents["same"].nonzero()[:1, 0])  # the first "same" string
print("string:", task.decode(example.tokens[0]), "-> label", task.vocab[example.labels[0, 0].item()])
for name, run in runs.items():
    patterns = attention_patterns(run.model, example.tokens)[:, 0]  # [layer, head, query_pos, key_pos]
    head_names = [f"L{layer}H{head}" for layer in range(patterns.shape[0]) for head in range(patterns.shape[1])]
    display(HTML(f"<h3>{name}</h3>"))
    display(cv.attention.attention_heads(attention=patterns.flatten(0, 1), tokens=task.token_strings(example.tokens[0]),
                                         attention_head_names=head_names, mask_upper_tri=task.causal))

# %% [markdown]
# ## 3. Head scores
# Over many unseen strings: the *association* score counts how much the second symbol attends
# to an equal first symbol, relative to uniform attention (only "same" strings have a repeat).
# The contrast that decides the task is the attention from the second symbol to the first in
# "same" vs "different" strings: a head that compares symbols puts more mass there when they
# are equal (uniform attention gives 0.5 for both).

# %%
batch = task.sample(S["n_eval"], seeded_generator(0), split="test")
same = batch.latents["same"]
second = torch.ones(len(batch.tokens), dtype=torch.long)  # query: the second symbol
first = torch.zeros_like(batch.tokens, dtype=torch.bool)
first[:, 0] = True  # key: the first symbol
heads, contrast = {}, {}
for name, run in runs.items():
    heads[name] = classify_heads(run.model, task, batch.tokens)
    patterns = attention_patterns(run.model, batch.tokens)  # [layer, batch, head, query_pos, key_pos]
    mass_same, _ = mass_on_keys(patterns[:, same], second[same], first[same])
    mass_diff, _ = mass_on_keys(patterns[:, ~same], second[~same], first[~same])
    contrast[name] = (mass_same, mass_diff)
    display(HTML(f"<h3>{name}</h3>" + figure_html(plots.head_score_heatmaps(heads[name].to_dict()["scores"],
                                                                            heads[name].labels),
                                                  "Head scores on unseen symbols; * marks each head's label.")))
n_layers, n_heads = contrast["plain"][0].shape
rows = [[f"L{layer}H{head}", *[v for name in runs for v in (round(heads[name].score("association")[layer, head].item(),
                                                                  3),
                                                             round(contrast[name][0][layer, head].item(), 3),
                                                             round(contrast[name][1][layer, head].item(), 3))]]
        for layer in range(n_layers) for head in range(n_heads)]
display(HTML(table_html(rows, ["head", *[f"{name}: {col}" for name in runs
                                         for col in ("association", "2nd->1st if same", "2nd->1st if different")]])))

# %% [markdown]
# ## 4. The learned a_h and b_h, and the model without them
# `attn.identity_a` scales the symbols' similarity in the scores, `attn.identity_b` the copied
# input in the output. Setting one of them to 0 in every head (then restoring it) shows what the
# augmented model's answers rest on.

# %%
augmented = runs["augmented"].model
a_h = torch.stack([block.attn.identity_a.detach() for block in augmented.blocks])  # [layer, head_index]
b_h = torch.stack([block.attn.identity_b.detach() for block in augmented.blocks])
head_labels = [f"H{head}" for head in range(n_heads)]
display(HTML(figure_html(plots.heatmap(a_h.tolist(), "head", "layer", "a_h (X X^T in the scores)", head_labels),
                         "a_h per head, augmented model")
             + figure_html(plots.heatmap(b_h.tolist(), "head", "layer", "b_h (A_h X in the output)", head_labels),
                           "b_h per head, augmented model")))

ablated = {"both terms": scores[("augmented", "test")]}
for term in ("identity_a", "identity_b"):
    saved = [getattr(block.attn, term).detach().clone() for block in augmented.blocks]
    with torch.no_grad():
        for block in augmented.blocks:
            getattr(block.attn, term).zero_()
    ablated[f"{term} = 0"] = evaluate(runs["augmented"], "test")
    with torch.no_grad():
        for block, value in zip(augmented.blocks, saved):
            getattr(block.attn, term).copy_(value)
display(HTML(table_html([[setting, *[s[c] for c in columns]] for setting, s in ablated.items()],
                        ["augmented model, unseen symbols", *columns])))
for name in runs:
    print(f"{name}: test loss {scores[(name, 'test')]['loss']}, accuracy {scores[(name, 'test')]['acc']} "
          "on unseen symbols")
