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
# # Your own model, your own prompts
#
# The other notebooks look at models the workbench trained on its own tasks. This one takes a
# `HookedTransformer` the workbench knows nothing about, and prompt pairs written by hand, and
# runs the same analyses with no project Task (`interp/outside.py`; the steps for your own model
# are in docs/outside-models.md):
#
# 1. a model whose circuit we know: two layers with weights set by hand, a previous-token head
#    feeding an induction head, and two distractor heads whose outputs nothing reads;
# 2. clean/corrupted prompt pairs with answer tokens (Python lists, and the same as a JSON file);
# 3. every head's attention (circuitsvis) and task-free head scores;
# 4. exact patching (each head, the residual stream per layer and position) and attribution;
# 5. path patching and the circuit graph;
# 6. a TransformerLens-style metric (one number per batch) through `scalar_metric`;
# 7. the HTML report.
#
# Swap in your own model and prompts in steps 1 and 2 (e.g. `HookedTransformer.from_pretrained("gpt2")`
# and IOI sentences); everything after that stays as it is.

# %%
import json
import os
from pathlib import Path

import circuitsvis as cv
from IPython.display import HTML, display

from interp import plots
from interp.attention import attention_patterns
from interp.circuit import circuit_svg
from interp.outside import PromptPairs, analyze_model
from interp.outside_prompts import scalar_metric
from interp.patching import patch_head_out
from interp.report import figure_html, table_html
from interp.toy_induction import TOY_VOCAB, hand_set_induction_model, induction_prompt_pairs

# %% tags=["parameters"]
# Parameters. Nothing trains here: SCALE only sets how many prompt pairs are analysed ("tiny":
# what the test suite runs; both take seconds). OUT: where the pairs file and the report go.
SCALE = os.environ.get("WORKBENCH_NOTEBOOK_SCALE", "small")
OUT = Path(os.environ.get("WORKBENCH_NOTEBOOK_OUT", "runs/notebooks"))

# %%
SCALES = {"tiny": dict(n_pairs=8), "small": dict(n_pairs=64)}
if SCALE not in SCALES:
    raise ValueError(f"SCALE={SCALE!r} is unknown; use one of {sorted(SCALES)}")
S = SCALES[SCALE]
folder = OUT / f"your-model-{SCALE}"
folder.mkdir(parents=True, exist_ok=True)

# %% [markdown]
# ## 1. A model with a known circuit
# `hand_set_induction_model()` builds a 2-layer, 2-head, attention-only causal
# `HookedTransformer` (10 tokens `a`..`j`, 8 positions, no norms) and sets every weight by hand.
# Its residual stream holds one-hot codes in five subspaces: token, position, previous token,
# answer, junk. L0H0 attends from each position to the one before and writes that token into the
# previous-token subspace; L1H0's query is the current token and its key the previous token, so
# it attends to the token *after* an earlier occurrence of the current one and copies it into
# the answer subspace, the only one the unembedding reads. L0H1 (attends to itself) and L1H1
# (attends to position 0) copy tokens into the junk subspace, which nothing reads.
#
# Below: the two QK circuits that make this work, read straight from the weights.

# %%
model = hand_set_induction_model()
attn0, attn1 = model.blocks[0].attn, model.blocks[1].attn
W_pos, W_E = model.pos_embed.W_pos, model.embed.W_E
# L0H0: positions (query) x positions (key); the band below the diagonal is "attend to i - 1"
qk_positions = (W_pos @ attn0.W_Q[0] @ attn0.W_K[0].T @ W_pos.T).detach()
# L1H0: query token x the previous token a key holds (what L0H0 writes, through its OV circuit)
prev_token_at_key = W_E @ attn0.W_V[0] @ attn0.W_O[0]  # [token, d_model]: L0H0's output for each token
qk_tokens = (W_E @ attn1.W_Q[0] @ attn1.W_K[0].T @ prev_token_at_key.T).detach()
display(HTML(figure_html(plots.heatmap(qk_positions.tolist(), "key position", "query position", "L0H0 QK (positions)",
                                       [str(i) for i in range(W_pos.shape[0])]),
                         "L0H0: query position i scores key position i - 1 (previous-token head).")))
display(HTML(figure_html(plots.heatmap(qk_tokens.tolist(), "previous token at the key", "query token",
                                       "L1H0 QK through L0H0 (K-composition)", TOY_VOCAB),
                         "L1H0: a query token scores keys whose previous token is the same (induction head).")))
print(f"{model.cfg.n_layers} layers x {model.cfg.n_heads} heads, attn_only={model.cfg.attn_only}, "
      f"normalization={model.cfg.normalization_type}, tokenizer: {model.tokenizer}")

# %% [markdown]
# ## 2. Prompt pairs
# A pair is a clean prompt, a corrupted twin of the same length, and two answer tokens: the
# clean prompt's answer and the corrupted prompt's. Clean `p A B q D C r A` asks for `B` (the
# token after the earlier `A`); corrupted `p D B q A C r A` swaps `A` and `D`, so the answer is
# `C`. The model has no tokenizer, so strings are split on whitespace into `vocab` names (with a
# tokenizer they are tokenised by it; lists of token ids work with any model). The default
# metric is the logit difference, answer minus wrong answer, at the last position.
#
# The same pairs as a JSON file, read back with `PromptPairs.from_json`:

# %%
pairs = induction_prompt_pairs(S["n_pairs"], seed=0)
spec = {"vocab": TOY_VOCAB, "pairs": [
    {"clean": " ".join(pairs.token_strings(c)), "corrupted": " ".join(pairs.token_strings(k)),
     "answer": TOY_VOCAB[int(a)], "wrong_answer": TOY_VOCAB[int(w)]}
    for c, k, a, w in zip(pairs.clean, pairs.corrupted, pairs.answers, pairs.wrong_answers)]}
pairs_file = folder / "pairs.json"
pairs_file.write_text(json.dumps(spec, indent=1))
pairs = PromptPairs.from_json(pairs_file, model=model)
display(HTML(table_html([[p["clean"], p["corrupted"], p["answer"], p["wrong_answer"]] for p in spec["pairs"][:5]],
                        ["clean", "corrupted", "answer", "wrong answer"])))
metric = pairs.logit_diff()
print(f"{len(pairs)} pairs from {pairs_file}; logit difference {metric(model(pairs.clean)).mean():.2f} clean, "
      f"{metric(model(pairs.corrupted)).mean():.2f} corrupted")

# %% [markdown]
# ## 3. Attention
# Every head on the first clean prompt; hover a head to zoom in.

# %%
tokens = pairs.token_strings(pairs.clean[0])
patterns = attention_patterns(model, pairs.clean[:1])[:, 0]  # [layer, head, query_pos, key_pos]
n_layers, n_heads = patterns.shape[:2]
cv.attention.attention_heads(
    attention=patterns.flatten(0, 1),
    tokens=tokens,
    attention_head_names=[f"L{layer}H{head}" for layer in range(n_layers) for head in range(n_heads)],
    mask_upper_tri=True,
)

# %% [markdown]
# ## 4. The analysis, and head scores
# `analyze_model` runs everything below in one call. Head scores need no task: attention mass on
# each kind's targets relative to uniform attention (previous token, self, position 0, earlier
# copies of the query's token, and induction: the token after an earlier copy).

# %%
analysis = analyze_model(model, pairs)
print(f"analysed in {analysis.seconds:.2f} s")
display(HTML(figure_html(analysis.head_score_figure(), "Head scores; * marks each head's label.")))
display(HTML(table_html([[f"L{layer}", *row] for layer, row in enumerate(analysis.heads.labels)],
                        ["layer", *[f"H{head}" for head in range(n_heads)]])))

# %% [markdown]
# ## 5. Exact and attribution patching
# Copy one activation from the clean run into the corrupted one; 1 = the clean answer is
# restored, 0 = still the corrupted one. Exact patching finds the two heads of the circuit at
# 1.0 each and the distractors at 0. Attribution (a first-order estimate) finds the induction
# head but nearly misses the previous-token head: its effect goes through L1H0's hard
# (saturated) attention, where the gradient is close to zero. That is why the exact sweep is
# the one to read, and attribution only a screen.

# %%
patching = analysis.patching
display(HTML(figure_html(plots.heatmap(patching.residual.values.tolist(), "position", "layer",
                                       "residual stream (clean -> corrupted)", tokens, -1.0, 1.0))))
display(HTML(figure_html(plots.heatmap(patching.heads.values.tolist(), "head", "layer", "head outputs, exact",
                                       None, -1.0, 1.0))))
attribution = patching.estimates["atp"].estimate
display(HTML(table_html([[f"L{layer}H{head}", round(patching.heads.values[layer, head].item(), 3),
                          round(attribution.values[layer, head].item(), 3)]
                         for layer in range(n_layers) for head in range(n_heads)],
                        ["head", "exact", "attribution"])))

# %% [markdown]
# ## 6. Path patching and the circuit
# Path patching: a sender head's output changed to the clean run's along one path only. The
# circuit: the fewest heads (by exact effect) keeping 90% of the behaviour, with every larger set
# too, every other head resample-ablated, then the edges among them that keep it. Expected: L0H0 -> L1H0's key
# (K-composition) and L1H0 -> logits.

# %%
print(patching.paths_refused or "path patching ran")
display(HTML(table_html([list(edge) for edge in patching.paths.strongest(5)], ["sender", "receiver", "value"])))
circuit = patching.circuit
print(f"circuit: {circuit.nodes}, faithfulness {circuit.faithfulness} (mean ablation {circuit.faithfulness_mean}); "
      f"edges {circuit.edges}")
display(HTML(circuit_svg(circuit.to_dict(), n_layers, n_heads, analysis.heads.labels)))

# %% [markdown]
# ## 7. A TransformerLens-style metric
# TransformerLens tutorials write metrics that return one number for the batch. The workbench
# averages one value per pair, and refuses a one-number metric; `scalar_metric(fn)` wraps it
# (the functions call the metric on exactly the pairs, so the wrapped mean is `fn` itself).

# %%
answer_tokens = list(zip(pairs.answers.tolist(), pairs.wrong_answers.tolist()))


def mean_logit_diff(logits):
    """TransformerLens style: the mean over the batch of logit(answer) - logit(wrong answer)."""
    last = logits[:, -1, :]
    return sum(last[i, a] - last[i, w] for i, (a, w) in enumerate(answer_tokens)) / len(answer_tokens)


try:
    patch_head_out(model, pairs.clean, pairs.corrupted, mean_logit_diff)
except ValueError as err:
    print("unwrapped:", err)
wrapped = patch_head_out(model, pairs.clean, pairs.corrupted, scalar_metric(mean_logit_diff))
print("wrapped:", wrapped.values.tolist(), "| built-in logit difference:", patching.heads.values.tolist())

# %% [markdown]
# ## 8. The report
# One self-contained HTML file (figures inlined, the circuitsvis bundle inlined once: it opens
# offline), and the analysis as JSON.

# %%
report = analysis.write_report(folder / "report.html", title="A hand-set induction circuit")
written = analysis.write_json(folder / "analysis.json")
print(f"report: {report} ({report.stat().st_size / 1e6:.1f} MB); analysis: {written}")
