"""LEGO's verdict on one model: per-variable accuracy, extrapolation, the order variables were
learned in, and for Z2 the parity rule each variable's answers follow; the label, rates and
summary a timeline and the sweep page show of it. `interp.tasks.lego` composes it into
`workbench analyze`'s findings and report.

Shape glossary: label = one slot per variable in chain order.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any

import torch
from transformer_lens import HookedTransformer

from interp.task_analysis import predictions, without_unset
from models.runs import LoadedRun
from tasks import LegoTask, seeded_generator

LEARNED_ACCURACY = 0.95  # a LEGO variable counts as learned from the first evaluation at or above it
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


def lego_verdict(model: HookedTransformer, task: LegoTask, metrics: list[dict[str, Any]], n: int = 2000,
                 seed: int = 0) -> LegoVerdict:
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
    verdict = LegoVerdict([round(a, 4) for a in acc], supervised, None if gap is None else round(gap, 4), learned,
                          shortcut)
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
        return {"rule": self.describe(), "agreement": self.agreement, "accuracy": self.accuracy,
                "true": self.is_true_rule}


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


def rule_findings(rules: list[ParityRule]) -> list[str]:
    """One line naming the variables whose answers follow another parity than the chain's."""
    other = [f"#{r.variable} {r.describe()} ({r.agreement:.2f})" for r in rules if not r.is_true_rule]
    if not other:
        return ["every variable's answers follow its chain parity x0 + g0 + ... + gk"]
    return ["answers follow another parity than the chain (x0 + g0 + ... + gk) on " + ", ".join(other)]


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
