"""LEGO's analysis: the verdict (per-variable accuracy, extrapolation, the order variables were
learned in, and for Z2 the parity rule each variable's answers follow), the probe map of
information percolation along the chain, the for-loop evidence of the circuit graph, the
report's sections and curves, and `lego-cpu` as the task's default preset. Registered with
`interp.analysis.register_analysis` at the end of the file. Also what the LEGO studies
(analyses/studies/lego.py) read from one model: whether it extrapolates, how its last variable
is computed (the shortcut), and their figures and tables; and why a model sits on the #2
plateau (analyses/plateau.py): the hop's attention and the loss's pull toward it.

Shape glossary: layer = residual streams (interp.probes), depth = LEGO chain index, label = one
slot per variable in chain order.
"""

from __future__ import annotations

import copy
import dataclasses
import html
import json
import time
from dataclasses import dataclass, field, fields
from typing import Any

import matplotlib.pyplot as plt
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor
from transformer_lens import HookedTransformer

from interp import plots
from interp.analysis import TaskAnalysis, _named_chain, predictions, register_analysis, without_unset
from interp.attention import attention_patterns, mass_on_keys
from interp.circuit import Circuit, chains_to_logits, loop_steps
from interp.patching import logit_diff_metric, patch_head_out
from interp.probes import ProbeSet, layer_names, probe_grid, rounded
from interp.report import figure_html, table_html
from interp.report_format import or_never, rate
from interp.tasks.lego_heads import lego_share_probe
from models.presets import lego_cpu, register_preset
from models.runs import LoadedRun
from tasks import Batch, LegoTask, logits_at_labels, seeded_generator
from tasks.lego import PAD

LEARNED_ACCURACY = 0.95  # a LEGO variable counts as learned from the first evaluation at or above it
FIRST_REACH_THRESHOLD = 0.95  # DESIGN.md: a depth is "solved" at a layer once its probe reaches 95%
MIN_PERCOLATION_DEPTHS = 3  # resolved depths a slope is fitted on: through two, any line fits exactly
EXTRAPOLATING_ACCURACY = 0.6  # a model extrapolates when its first unsupervised variable ends at or above it


# ---------------------------------------------------------------------------------------------
# The verdict


@dataclass
class LegoVerdict:
    acc_per_var: list[float]
    supervised: list[bool]
    extrapolation_gap: float | None  # mean supervised accuracy - mean unsupervised accuracy
    learned_step: list[int | None]  # first evaluation step with accuracy >= LEARNED_ACCURACY
    last_learned_before_middle: bool | None  # the shortcut signature (None: not enough learned)
    findings: list[str] = field(default_factory=list)
    parity_rules: list[ParityRule] | None = None  # Z2: per variable, the parity its answers follow best
    # from the circuit graph (interp.analysis), where drawn: its for-loop chain (else longest path) and what it says
    circuit_chain: list[str] | None = None
    findings_from_circuit: list[str] | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}
        data["parity_rules"] = None if self.parity_rules is None else [rule.summary() for rule in self.parity_rules]
        return without_unset(data, ("parity_rules", "circuit_chain", "findings_from_circuit"))


def lego_verdict(model: HookedTransformer, task: LegoTask, metrics: list[dict[str, Any]], n: int = 2000, seed: int = 0) -> LegoVerdict:
    """Accuracy per variable, extrapolation, and the order in which variables were learned."""
    batch = task.sample(n, seeded_generator(seed), split="test")
    correct = predictions(model, batch) == batch.labels
    acc = correct.float().mean(0).tolist()
    supervised = task.supervised_slots()
    sup = [a for a, s in zip(acc, supervised) if s]
    unsup = [a for a, s in zip(acc, supervised) if not s]
    gap = sum(sup) / len(sup) - sum(unsup) / len(unsup) if sup and unsup else None
    learned = learned_steps(metrics, len(acc))
    shortcut = last_learned_before_middle(learned)
    verdict = LegoVerdict([round(a, 4) for a in acc], supervised, None if gap is None else round(gap, 4), learned, shortcut)
    verdict.findings = _verdict_lines(verdict)
    return verdict


def learned_steps(metrics: list[dict[str, Any]], n_vars: int, threshold: float = LEARNED_ACCURACY) -> list[int | None]:
    """Per variable, the first evaluation step whose test accuracy reaches `threshold` (None: never)."""
    steps: list[int | None] = [None] * n_vars
    for record in metrics:
        for i, accuracy in enumerate(record.get("acc_per_var", [])):
            if steps[i] is None and accuracy >= threshold:
                steps[i] = record["step"]
    return steps


def last_learned_before_middle(steps: list[int | None]) -> bool | None:
    """True when the last variable was learned strictly before every middle variable (#1..#n-2)
    that was learned at all, with at least one middle one still unlearned or later."""
    if len(steps) < 3 or steps[-1] is None:
        return None
    middle = steps[1:-1]
    return all(s is None or steps[-1] < s for s in middle) and any(s is None or s > steps[-1] for s in middle)


def extrapolates(run: LoadedRun) -> bool:
    """Whether a run's first unsupervised variable ends at EXTRAPOLATING_ACCURACY or above
    (False when every variable is supervised or the run has no evaluation)."""
    records = [r for r in run.metrics if "acc_per_var" in r]
    cfg = run.config.task
    if not records or cfg.supervision == "all" or cfg.n_supervised >= cfg.n_vars:
        return False
    return records[-1]["acc_per_var"][cfg.n_supervised] >= EXTRAPOLATING_ACCURACY


@dataclass
class ParityRule:
    """The rule a model's answers for one Z2 variable follow best: the parity of a subset of the
    sentence's root value (`x0`) and chain elements (`g0`, `g1`, ... in chain order), negated
    when `negated`. The true value of #k is x0 + g0 + ... + gk."""

    variable: int
    terms: list[str]
    negated: bool
    agreement: float  # share of test sentences on which the model's answer equals the rule's
    true_terms: list[str]
    accuracy: float  # share on which it equals the true value

    @property
    def is_true_rule(self) -> bool:
        return not self.negated and self.terms == self.true_terms

    def describe(self) -> str:
        return f"{'not ' if self.negated else ''}{' + '.join(self.terms) or '0'}"

    def summary(self) -> dict[str, Any]:
        """The rule as JSON: its text, agreement, the model's accuracy, and whether it is the chain's."""
        return {"rule": self.describe(), "agreement": self.agreement, "accuracy": self.accuracy, "true": self.is_true_rule}


@torch.no_grad()
def lego_parity_rules(model: HookedTransformer, task: LegoTask, n: int = 2000, seed: int = 0) -> list[ParityRule]:
    """For each variable of a Z2 LEGO model, the parity rule (over every subset of root value and
    chain elements, and its negation) its answers agree with most, on `n` test sentences.

    Every true label is such a parity, so this names what a model that is wrong computes
    instead: e.g. x0 + g0 + g2 + g3 for #3 is "#0's value, my parent's element and mine" (one
    hop, then stop) rather than the chain. 2^(n_vars + 2) rules, scored at once.
    """
    if task.cfg.group != "z2":
        raise ValueError(f"parity rules describe the z2 task; this task's group is {task.cfg.group!r}")
    batch = task.sample(n, seeded_generator(seed), split="test")
    answers = predictions(model, batch)
    bits = torch.cat([batch.latents["root"][:, None], batch.latents["elements"]], 1).float()  # [n, 1 + n_vars]
    n_terms = bits.shape[1]
    subsets = ((torch.arange(2 ** n_terms)[:, None] >> torch.arange(n_terms)) & 1).float()  # [rules, terms]
    rules = (bits @ subsets.T).long() % 2  # [n, rules]: index 0 = value "1", 1 = "-1", as in the labels
    names = ["x0", *[f"g{i}" for i in range(n_terms - 1)]]
    found = []
    for k in range(answers.shape[1]):
        agree = (rules == answers[:, k : k + 1]).float().mean(0)  # negation agrees 1 - agree
        best = int(torch.maximum(agree, 1 - agree).argmax())
        negated = bool(agree[best] < 0.5)
        terms = [names[i] for i in range(n_terms) if subsets[best, i]]
        found.append(ParityRule(k, terms, negated, round(max(agree[best].item(), 1 - agree[best].item()), 4),
                                names[: k + 2], round((answers[:, k] == batch.labels[:, k]).float().mean().item(), 4)))
    return found


def _verdict_lines(v: LegoVerdict) -> list[str]:
    lines = []
    sup = [i for i, s in enumerate(v.supervised) if s]
    unfit = [i for i in sup if v.acc_per_var[i] < 0.98]
    if sup and not unfit:
        lines.append(f"fits every supervised variable (#{sup[0]}..#{sup[-1]} >= 98%)")
    elif unfit:
        shown = ", ".join(f"#{i} ({v.acc_per_var[i]:.2f})" for i in unfit)
        lines.append(f"does not fit supervised variable(s) {shown}: below 98% test accuracy")
    if v.extrapolation_gap is not None:
        lines.append(f"extrapolation gap (supervised - unsupervised mean accuracy): {v.extrapolation_gap:.3f}")
    if v.last_learned_before_middle:
        lines.append("the last variable was learned before the middle ones: the parity shortcut signature")
    return lines


# ---------------------------------------------------------------------------------------------
# Probes: information percolation along the chain


def first_layer_reaching(accuracy: Float[Tensor, "layer depth"], threshold: float = FIRST_REACH_THRESHOLD) -> list[int | None]:
    """Per depth, the first layer whose probe accuracy is at least `threshold` (None if none)."""
    reached = accuracy >= threshold
    first = reached.float().argmax(0).tolist()
    return [layer if ok else None for layer, ok in zip(first, reached.any(0).tolist())]


def percolation_fit(first_layers: list[int | None]) -> tuple[float | None, float | None]:
    """Least-squares line through (depth, first layer) over the resolved depths (those that reach
    the threshold): its slope (layers per reasoning step) and R^2 (1 = perfectly linear, a "for
    loop"). Both None from fewer than MIN_PERCOLATION_DEPTHS resolved depths: two points always
    lie on a line. R^2 is None when the first layers are all equal (nothing to explain)."""
    points = [(depth, layer) for depth, layer in enumerate(first_layers) if layer is not None]
    if len(points) < MIN_PERCOLATION_DEPTHS:
        return None, None
    x, y = torch.tensor(points, dtype=torch.float64).T
    x_c, y_c = x - x.mean(), y - y.mean()
    slope = float((x_c * y_c).sum() / (x_c**2).sum())
    total = float((y_c**2).sum())
    residual = float(((y_c - slope * x_c) ** 2).sum())
    return slope, (1 - residual / total if total > 0 else None)


def resolved_depths(first_layers: list[int | None]) -> int:
    """How many depths reach the threshold at some layer: the points a percolation slope is fitted on."""
    return sum(layer is not None for layer in first_layers)


def percolation_summary(first_layers: list[int | None]) -> str:
    """The percolation line every report prints: slope and R^2 with the number of resolved depths
    they were fitted on, or why there is no slope."""
    slope, linearity = percolation_fit(first_layers)
    n, total = resolved_depths(first_layers), len(first_layers)
    if slope is None:
        return (f"no percolation slope: {n} of {total} depths resolved (reach the threshold); "
                f"a slope needs >= {MIN_PERCOLATION_DEPTHS}")
    fit = "n/a, every resolved depth first reaches it at the same layer" if linearity is None else f"{linearity:.2f}"
    return f"percolation slope {slope:.2f} layers per reasoning step (R^2 {fit}), fitted on {n} of {total} resolved depths"


@dataclass
class ProbeMap:
    """LEGO probe accuracy per (layer, chain depth), read at each variable's own token."""

    accuracy: Float[Tensor, "layer depth"]
    train_accuracy: Float[Tensor, "layer depth"]
    layer_names: list[str]
    depth_names: list[str]
    chance: float  # 1 / n_classes
    majority: list[float]  # per depth, test accuracy of always answering the most frequent class
    threshold: float
    first_layer: list[int | None]  # per depth, first layer reaching `threshold`
    slope: float | None  # layers per reasoning step
    linearity: float | None  # R^2 of the slope's line
    n_train: int
    n_test: int
    method: str
    seconds: float  # wall time of the whole map: residuals, fits and scoring

    def to_dict(self) -> dict[str, object]:
        return {
            "accuracy": rounded(self.accuracy), "train_accuracy": rounded(self.train_accuracy),
            "layer_names": self.layer_names, "depth_names": self.depth_names, "chance": self.chance,
            "majority": [round(m, 4) for m in self.majority], "threshold": self.threshold, "first_layer": self.first_layer, "slope": self.slope,
            "linearity": self.linearity, "resolved_depths": resolved_depths(self.first_layer),
            "n_train": self.n_train, "n_test": self.n_test,
            "method": self.method, "seconds": round(self.seconds, 3),
        }


def lego_probe_set(task: LegoTask, batch: Batch) -> ProbeSet:
    """Sites are the variables' own (clause left-hand) tokens in chain order; targets their values."""
    return ProbeSet(batch.tokens, batch.label_pos, batch.labels.unsqueeze(-1), batch.label_mask)


def lego_probe_map(
    model: HookedTransformer, task: LegoTask, n_train: int = 3000, n_test: int = 2000, seed: int = 0,
    split: str = "test", method: str = "lda", threshold: float = FIRST_REACH_THRESHOLD,
) -> ProbeMap:
    """Where each variable's value becomes linearly readable at its own token, layer by layer.

    Probes are fitted on `n_train` sentences drawn with `seed` and scored on `n_test` fresh ones
    drawn with `seed + 1`. split="test" draws full-length sentences, so every depth has every
    sample; padded variables (split="train" with min_vars) are left out of fit and score.
    """
    start = time.perf_counter()
    train = lego_probe_set(task, task.sample(n_train, seeded_generator(seed), split))
    test = lego_probe_set(task, task.sample(n_test, seeded_generator(seed + 1), split))
    grid = probe_grid(model, train, test, task.d_vocab_out, method)
    accuracy = grid.accuracy[..., 0]
    first = first_layer_reaching(accuracy, threshold)
    slope, linearity = percolation_fit(first)
    return ProbeMap(accuracy, grid.train_accuracy[..., 0], layer_names(model), task.label_names, 1 / task.d_vocab_out,
                    grid.majority[:, 0].tolist(), threshold, first, slope, linearity, n_train, n_test, method,
                    time.perf_counter() - start)


# ---------------------------------------------------------------------------------------------
# How the last variable is computed: the shortcut's evidence (`workbench study lego-shortcut`)


def last_variable_evidence(model: HookedTransformer, task: LegoTask, n_train: int, n_test: int) -> dict[str, Any]:
    """Probes per depth (is the last variable readable earlier than the middle ones?), head
    patching at the last slot and at #1 (which heads carry it?), and each head's attention mass
    from those slots to the group-element tokens. Probes fit on `n_train` sentences, score on
    `n_test`."""
    probe = lego_probe_map(model, task, n_train=n_train, n_test=n_test)
    gen = seeded_generator(7)
    clean = task.sample(64, gen, split="test", aligned=True)
    n_vars = task.cfg.n_vars
    patches = {}
    for depth, slot in ((0, n_vars - 1), (0, 1)):
        corrupted, _ = task.corrupt(clean, gen, depth=depth)
        result = patch_head_out(model, clean.tokens, corrupted.tokens, logit_diff_metric(clean, corrupted, slot))
        patches[f"#{slot}"] = [[round(v, 3) for v in row] for row in result.values.tolist()]
    # a parity shortcut reads the group elements (the signs) of every clause from the last
    # variable's token; following the chain reads them one clause at a time
    signs = (clean.tokens >= task.first_element) & (clean.tokens < task.first_value)
    with torch.no_grad():
        patterns = attention_patterns(model, clean.tokens)
    sign_mass = {}
    for slot in (n_vars - 1, 1):
        mass, baseline = mass_on_keys(patterns, clean.label_pos[:, slot], signs)
        sign_mass[f"#{slot}"] = [[round(v, 3) for v in row] for row in mass.tolist()]
    return {"probe_accuracy": probe.to_dict()["accuracy"], "probe_first_layer": probe.first_layer,
            "depth_names": probe.depth_names, "head_patching": patches, "sign_attention": sign_mass,
            "sign_attention_uniform": round(baseline, 3)}


def last_variable_evidence_html(evidence: dict[str, Any]) -> str:
    """The report section of `last_variable_evidence` (empty evidence: the model did not train)."""
    if not evidence:
        return "<p>No evidence: the model did not train.</p>"
    parts = [figure_html(plots.heatmap(evidence["probe_accuracy"], "chain depth", "layer", "probe accuracy",
                                       evidence["depth_names"], vmin=0.5, vmax=1.0, cmap="viridis"),
                         f"First layer reaching 95% per depth: {', '.join(map(or_never, evidence['probe_first_layer']))}. A last variable "
                         "readable before the middle ones points to a shortcut rather than following the chain.")]
    for slot, values in evidence["head_patching"].items():
        parts.append(figure_html(plots.heatmap(values, "head", "layer", f"head-output patching, metric at {slot}",
                                               vmin=-1.0, vmax=1.0), f"Clean head output patched into the corrupted run "
                                               f"(root flipped); 1 = restores the clean answer at {slot}."))
    for slot, values in evidence.get("sign_attention", {}).items():
        parts.append(figure_html(plots.heatmap(values, "head", "layer", f"attention from {slot} to group elements",
                                               vmin=0.0, vmax=1.0, cmap="viridis"),
                                 f"Mean attention mass from variable {slot}'s token to the group-element (sign) tokens "
                                 f"of all clauses; uniform attention gives {evidence['sign_attention_uniform']}."))
    return "".join(parts)


# ---------------------------------------------------------------------------------------------
# The #2 plateau (analyses/plateau.py): does the loss pull any head toward the hop?
#
# Variable #k (k >= 2) needs one association hop per step back along the chain: from the clause of
# #k, attend to the clause of its parent #k-1, whose left-hand token is the same letter as #k's
# right-hand token. For every head we read, at #k's left-hand (LHS) and right-hand (RHS) tokens,
#
# - `attention`: the mass on the parent's LHS token, and what uniform attention would give there;
# - `pull`: minus the gradient of #k's loss with respect to that attention score, minus the same
#   for the query's average other key. Positive means gradient descent raises the hop's attention.
#
# On uniform training data a Z2 model's #k is parent XOR own element, so copying the parent's value
# alone gains nothing at first order and the pull averages to ~0: the plateau. The measurement is
# per batch, so the same model can be read on uniform and on biased (mixed-input) sentences.
#
# `parent_element_split` reads what a model knows of the hop from its answers alone: #k's
# accuracy apart for sentences whose parent clause applies the identity and for the others. The
# zero-hop rule (x0 + g0 + gk, what plateau models answer) is right exactly when the parent's
# element is the identity (1 and 0); guessing gives chance on both; the hop gives 1 and 1. In Z2,
# `signal` = the two accuracies' sum minus 1 is how well the answers track the parent's element:
# 0 for the zero-hop rule and for guessing alike, 1 for the hop.
# Shapes: batch, layer, head_index, query_pos, key_pos, and site (LHS or RHS of #k).

SITES = ("lhs", "rhs")
RHS_OFFSET = 3  # `lhs = g rhs ;`: the right-hand token is three after the left-hand one


@dataclass
class HopPull:
    """Per (site, layer, head): attention on the parent's LHS, its uniform baseline, and the pull."""

    variable: int
    attention: Float[Tensor, "site layer head_index"]
    uniform: float
    pull: Float[Tensor, "site layer head_index"]
    loss: float

    def strongest(self) -> tuple[str, int, int, float]:
        """The (site, layer, head, pull) with the largest pull."""
        return _largest(self.pull)

    def most_attentive(self) -> tuple[str, int, int, float]:
        """The (site, layer, head, attention) that puts the most attention on the parent."""
        return _largest(self.attention)


def _largest(values: Float[Tensor, "site layer head_index"]) -> tuple[str, int, int, float]:
    flat = int(values.argmax())
    site, rest = divmod(flat, values.shape[1] * values.shape[2])
    layer, head = divmod(rest, values.shape[2])
    return SITES[site], layer, head, float(values.flatten()[flat])


def hop_pull(model: HookedTransformer, task: LegoTask, batch: Batch, variable: int) -> HopPull:
    """Attention on, and gradient pull toward, the parent clause of `variable` for every head,
    from `variable`'s loss alone, averaged over the batch (full-length sentences)."""
    if not 1 <= variable < task.cfg.n_vars:
        raise ValueError(f"variable={variable} has no parent clause; use 1..{task.cfg.n_vars - 1}")
    if not batch.label_mask[:, variable].all():
        raise ValueError("hop_pull needs full-length sentences (split='test', or no task.min_vars)")
    scores: dict[int, Tensor] = {}
    patterns: dict[int, Tensor] = {}

    def keep_scores(value: Tensor, hook) -> Tensor:
        value.retain_grad()
        scores[hook.layer()] = value
        return value

    def keep_pattern(value: Tensor, hook) -> Tensor:  # the pattern used (planted heads replace it)
        patterns[hook.layer()] = value.detach()
        return value

    hooks = [hook for layer in range(model.cfg.n_layers) for hook in
             [(f"blocks.{layer}.attn.hook_attn_scores", keep_scores), (f"blocks.{layer}.attn.hook_pattern", keep_pattern)]]
    with torch.enable_grad():
        logits = model.run_with_hooks(batch.tokens, fwd_hooks=hooks)
        picked = logits_at_labels(logits, batch.label_pos)[:, variable]
        loss = F.cross_entropy(picked, batch.labels[:, variable])
        loss.backward()
    rows = torch.arange(len(batch))
    lhs = batch.label_pos[:, variable]
    queries = torch.stack([lhs, lhs + RHS_OFFSET])  # [site batch]
    parent = batch.label_pos[:, variable - 1]
    attention, pull = [], []
    for layer in range(model.cfg.n_layers):
        pattern, g = patterns[layer], -scores[layer].grad  # [batch head q k]; g: descent direction
        att = torch.stack([pattern[rows, :, q, parent] for q in queries])  # [site batch head]
        toward = torch.stack([g[rows, :, q, parent] for q in queries])
        others = torch.stack([g[rows, :, q, :].mean(-1) for q in queries])
        attention.append(att.mean(1))
        pull.append((toward - others).mean(1) * len(batch))  # undo the loss's mean over the batch
    model.zero_grad(set_to_none=True)
    n_keys = int((batch.tokens[0] != PAD).sum())
    return HopPull(variable, torch.stack(attention, 1), 1.0 / n_keys, torch.stack(pull, 1), loss.item())


@dataclass
class ParentSplit:
    """#`variable`'s accuracy where its parent clause's element is the identity, and elsewhere."""

    variable: int
    identity: float
    other: float
    share_identity: float  # of the sentences

    @property
    def signal(self) -> float:
        """identity + other - 1: 0 for the zero-hop rule and for guessing, 1 for the hop (Z2)."""
        return self.identity + self.other - 1


def parent_element_split(batch: Batch, predicted: Tensor, variable: int) -> ParentSplit:
    """Split #`variable`'s accuracy (`predicted`: [batch label] answers) by whether its parent
    #variable-1 applies the identity (element 0). Needs every sentence to hold the variable."""
    if variable < 1 or variable >= batch.labels.shape[1]:
        raise ValueError(f"variable={variable} has no parent clause; use 1..{batch.labels.shape[1] - 1}")
    held = batch.label_mask[:, variable]
    if not held.all():
        raise ValueError("parent_element_split needs full-length sentences (split='test', or no task.min_vars)")
    right = (predicted[:, variable] == batch.labels[:, variable]).float()
    identity = batch.latents["elements"][:, variable - 1] == 0
    if identity.all() or not identity.any():
        raise ValueError("the batch needs sentences with and without the identity at the parent; sample more")
    return ParentSplit(variable, right[identity].mean().item(), right[~identity].mean().item(),
                       identity.float().mean().item())



# ---------------------------------------------------------------------------------------------
# workbench analyze and the report


def lego_findings(run: LoadedRun, seed: int) -> tuple[ProbeMap, LegoVerdict]:
    probes = lego_probe_map(run.model, run.task, seed=seed)
    verdict = lego_verdict(run.model, run.task, run.metrics, seed=seed)
    verdict.findings += _percolation_findings(probes.first_layer)
    if run.task.cfg.group == "z2":
        verdict.parity_rules = lego_parity_rules(run.model, run.task, seed=seed)
        verdict.findings += _rule_findings(verdict.parity_rules)
    return probes, verdict


def _lego_circuit_findings(verdict: LegoVerdict, circuit: Circuit, labels: dict[str, str],
                           planted: set[str]) -> LegoVerdict:
    """For-loop evidence from the circuit graph: a path to the logits on which an association
    head feeds a manipulation head in the next layer, or the other way round."""
    chains = chains_to_logits(circuit.edges)
    looping = [(chain, steps) for chain in chains if (steps := loop_steps(chain, labels))]
    if looping:
        chain, steps = looping[0]
        line = (f"circuit: {len(steps)} for-loop step(s), association and manipulation heads in consecutive layers on "
                f"a path to the logits: {_named_chain(chain, labels, planted)}")
    elif chains:
        chain = chains[0]
        line = (f"circuit: no path to the logits passes from an association head to a manipulation head in the next "
                f"layer or back; longest path: {_named_chain(chain, labels, planted)}")
    else:
        chain, line = [], "circuit: no path patching edge of the circuit reaches the logits"
    return dataclasses.replace(verdict, circuit_chain=chain, findings_from_circuit=[line])


def _rule_findings(rules: list[ParityRule]) -> list[str]:
    """One line naming the variables whose answers follow another parity than the chain's."""
    other = [f"#{r.variable} {r.describe()} ({r.agreement:.2f})" for r in rules if not r.is_true_rule]
    if not other:
        return ["every variable's answers follow its chain parity x0 + g0 + ... + gk"]
    return ["answers follow another parity than the chain (x0 + g0 + ... + gk) on " + ", ".join(other)]


def _percolation_findings(first: list[int | None]) -> list[str]:
    return [f"probes: {percolation_summary(first)}; first layer reaching 95% per depth {first}"]


def _lego_verdict_html(verdict: dict[str, Any]) -> str:
    lines = verdict["findings"] + verdict.get("findings_from_circuit", [])
    items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
    rules = verdict.get("parity_rules")  # Z2 only
    rows = [[f"#{i}", rate(a), "yes" if s else "no", or_never(verdict["learned_step"][i]),
             *([f"{rules[i]['rule']} ({rules[i]['agreement']:.2f})"] if rules else [])]
            for i, (a, s) in enumerate(zip(verdict["acc_per_var"], verdict["supervised"]))]
    header = ["variable", "test accuracy", "supervised", "learned at step", *(["closest parity rule"] if rules else [])]
    return f"<ul>{items}</ul>" + table_html(rows, header)


def _lego_probes_html(probes: dict[str, Any]) -> str:
    fig = plots.heatmap(probes["accuracy"], "chain depth", "layer (0: embedding, k: after block k-1)", "probe accuracy",
                        probes["depth_names"], 0.0, 1.0, "viridis")
    note = (f"Chance {probes['chance']:.2f}. First layer reaching {probes['threshold']:.0%} per depth: "
            f"{', '.join(map(or_never, probes['first_layer']))}; {percolation_summary(probes['first_layer'])}.")
    return figure_html(fig, "Linear probe accuracy for each variable's value at its own token.") + f"<p>{html.escape(note)}</p>"


def parity_rules_section(rules: dict[str, list[dict[str, Any]]]) -> tuple[str, str]:
    """A report section (title, html): the parity rule each model's answers follow per variable
    (`ParityRule.summary()` lists by model name), with how to read it."""
    n_vars = max(len(r) for r in rules.values())
    table = table_html(
        [[n, *[f"{r['rule']} ({r['agreement']:.2f})" for r in model_rules]] for n, model_rules in rules.items()],
        ["model", *[f"#{i}" for i in range(n_vars)]])
    return "What each model computes (parity rules)", table + ("<p>Per variable, the parity of root value x0 and chain elements g0, g1, ... that the model's "
                    "test answers agree with most (share in brackets; <code>interp.tasks.lego.lego_parity_rules</code>). "
                    "The true value of #k is x0 + g0 + ... + gk.</p>")


def lego_accuracy_figure(table: dict[str, list[float]], supervised: list[bool], title: str, chance: float) -> plt.Figure:
    """Final test accuracy per variable (chain order), one line per model (the paper's Figure 3 end point)."""
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for name, acc in table.items():
        ax.plot(range(len(acc)), acc, marker="o", label=name)
    first_unsup = next((i for i, s in enumerate(supervised) if not s), None)
    if first_unsup is not None:
        ax.axvspan(first_unsup - 0.5, len(supervised) - 0.5, color="0.92", label="not supervised")
    ax.axhline(chance, color="0.6", linestyle=":", label="chance")
    ax.set(xlabel="variable (chain order)", ylabel="final test accuracy", ylim=(0, 1.02), title=title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


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
    plots.loss_panel(ax_loss, records)
    fig.tight_layout()
    return fig


# what a planted LEGO model is not, and where to look instead (analyses/lab/lego-recipes.md, "The #2 plateau")
PLANTED_NOTE = (
    "No plain LEGO model from random init has learned the association hop at this shape on CPU (26 letters, batch "
    "128: analyses/lab/lego-recipes.md, \"The #2 plateau\"). Plain models that did learn it, nothing planted or mimicked: "
    "<code>workbench analyze zoo/lego-association</code> (six letters, batch 512, one hop; L2H3 is a learned "
    "association head) and <code>zoo/lego-three-hops</code> (a curriculum from it: n = 8, #0-#4, three hops).")


def _lego_curves(run: LoadedRun) -> plt.Figure:
    return lego_curves(run.metrics, run.task.supervised_slots())


def lego_verdict_label(verdict: dict[str, Any]) -> str:
    """Which variables the model answers (accuracy >= LEARNED_ACCURACY), e.g. "#0-#2 learned"."""
    learned = [i for i, acc in enumerate(verdict["acc_per_var"]) if acc >= LEARNED_ACCURACY]
    if not learned:
        return "none learned"
    runs: list[list[int]] = []
    for i in learned:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return " ".join(f"#{r[0]}" if len(r) == 1 else f"#{r[0]}-#{r[-1]}" for r in runs) + " learned"


def lego_timeline_panels(verdict: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The timeline's evidence: accuracy per variable ("#2 (not supervised)" for extrapolation)."""
    names = [f"#{i}" + ("" if sup else " (not supervised)") for i, sup in enumerate(verdict["supervised"])]
    return {"accuracy per variable": dict(zip(names, verdict["acc_per_var"]))}


def lego_verdict_rates(verdict: dict[str, Any]) -> dict[str, float]:
    """Accuracy per variable, "#0" ... "#n-1"."""
    return {f"#{i}": acc for i, acc in enumerate(verdict["acc_per_var"])}


def lego_summary(record: dict[str, Any]) -> dict[str, Any] | None:
    """A run's verdict from its last evaluation's accuracy per variable (`lego_verdict_label`);
    None where the record has none."""
    if not isinstance(record.get("acc_per_var"), list):
        return None
    verdict = {"acc_per_var": record["acc_per_var"]}
    return {"label": lego_verdict_label(verdict), "rates": lego_verdict_rates(verdict)}


register_analysis("lego", TaskAnalysis(
    lego_findings, lambda verdict: json.dumps(verdict.findings), _lego_verdict_html, _lego_probes_html,
    _lego_curves, "Solid: supervised variables; dashed: not supervised (extrapolation).", _lego_circuit_findings,
    planted_note=PLANTED_NOTE, verdict_label=lego_verdict_label, timeline_panels=lego_timeline_panels,
    summary=lego_summary, verdict_rates=lego_verdict_rates, share_probe=lego_share_probe))
register_preset("lego-cpu", lego_cpu, default_for="lego")
