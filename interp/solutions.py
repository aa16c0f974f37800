"""Solution verdicts: which solution did the model find, with the numbers that say so.

Composite: on the held-out pair, the share of answers equal to the inferential target, the
symmetric target, or neither (overall and per key position); "unlearned" when seen-pair
accuracy < 90%. Evidence: attention
from the last token to key and anchors and from the anchors to the key, per layer; cosine
similarity of last-token representations for equal targets from different pairs.

LEGO: per-variable accuracy and the extrapolation gap, the step at which each variable was
learned (shortcut: the last variable before the middle ones), percolation from probes, and the
head labels.
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.attention import attention_patterns
from tasks import Batch, CompositeTask, LegoTask, TemplatesTask, logits_at_labels, seeded_generator
from tasks.base import uniform_choice

SEEN_ACCURACY_TO_COUNT = 0.9  # below it a composite cell counts as not learned (PAPERS.md)
LEARNED_ACCURACY = 0.95  # a LEGO variable counts as learned from the first evaluation at or above it


@torch.no_grad()
def predictions(model: HookedTransformer, batch: Batch) -> Int[Tensor, "batch label"]:
    device = next(model.parameters()).device
    logits = model(batch.tokens.to(device))
    return logits_at_labels(logits, batch.label_pos.to(device)).argmax(-1).cpu()


@dataclass
class CompositeVerdict:
    verdict: str  # inferential | symmetric | mixed | unlearned
    seen_accuracy: float
    held_out_inferential: float
    held_out_symmetric: float
    held_out_other: float
    attention_flow: dict[str, list[float]] = field(default_factory=dict)  # per layer, head-averaged
    cosine_same_target: float | None = None
    cosine_different_target: float | None = None
    route: str | None = None  # the circuit graph's longest path to the logits (interp.analysis), where drawn
    # per key position (0 .. seq_len-3): the held-out rates of the inferential and symmetric answers
    # (None where no sequence had its key there); a solution can differ by where the pair sits
    held_out_by_key_position: dict[str, list[float | None]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return _without_unset(asdict(self), ("route",))


def composite_verdict(model: HookedTransformer, task: CompositeTask, n: int = 2000, seed: int = 0) -> CompositeVerdict:
    """The held-out answer rates on test keys, with the mechanism evidence."""
    gen = seeded_generator(seed)
    seen = task.sample(n, gen, split="test", pair_ids=_trained_pairs(task, n, gen))
    held = task.sample(n, gen, split="test", pair_ids=_held_out_pairs(task, n, gen))
    seen_acc = (predictions(model, seen) == seen.labels).float().mean().item()
    pred = predictions(model, held)[:, 0]
    inf = (pred == held.latents["inferential"]).float().mean().item()
    sym = (pred == held.latents["symmetric"]).float().mean().item()
    same, different = last_token_similarity(model, task, seen, gen)
    return CompositeVerdict(
        verdict=classify_composite(seen_acc, inf, sym), seen_accuracy=round(seen_acc, 4),
        held_out_inferential=round(inf, 4), held_out_symmetric=round(sym, 4), held_out_other=round(1 - inf - sym, 4),
        attention_flow=composite_attention_flow(model, held), cosine_same_target=round(same, 4),
        cosine_different_target=round(different, 4),
        held_out_by_key_position={name: _rate_by_key_position(pred, held, name, task.n_key_positions)
                                  for name in ("inferential", "symmetric")},
    )


def held_out_on_training_keys(model: HookedTransformer, task: CompositeTask, n: int = 2000, seed: int = 0
                              ) -> dict[str, Any]:
    """The held-out pair's answer rates with keys of the *training* split: the pair is unseen, the
    (key, position) combinations are not. The composite paper's public code reports this reading
    (its test-key reading is only logged); `composite_verdict` reads test keys, new pair and new
    keys at once."""
    gen = seeded_generator(seed + 1)
    held = task.sample(n, gen, split="train", pair_ids=_held_out_pairs(task, n, gen))
    pred = predictions(model, held)[:, 0]
    rates = {a: round((pred == held.latents[a]).float().mean().item(), 4) for a in ("inferential", "symmetric")}
    return {"train_keys_inferential": rates["inferential"], "train_keys_symmetric": rates["symmetric"],
            "train_keys_by_key_position": {a: _rate_by_key_position(pred, held, a, task.n_key_positions)
                                           for a in ("inferential", "symmetric")}}


def _rate_by_key_position(pred: Int[Tensor, " batch"], held: Batch, answer: str, n_positions: int) -> list[float | None]:
    """Per key position, the share of `pred` equal to the `answer` latent (None: no sequence there)."""
    positions = held.latents["key_pos"]
    rates = []
    for p in range(n_positions):
        here = positions == p
        rates.append(round((pred[here] == held.latents[answer][here]).float().mean().item(), 4) if here.any() else None)
    return rates


def classify_composite(seen_accuracy: float, inferential: float, symmetric: float) -> str:
    if seen_accuracy < SEEN_ACCURACY_TO_COUNT:
        return "unlearned"
    if inferential > 0.5:
        return "inferential"
    if symmetric > 0.5:
        return "symmetric"
    return "mixed"


def _trained_pairs(task: CompositeTask, n: int, gen: torch.Generator) -> Tensor:
    ids = (~task.is_held_out).nonzero()[:, 0]
    return ids[torch.randint(len(ids), (n,), generator=gen)]


def _held_out_pairs(task: CompositeTask, n: int, gen: torch.Generator) -> Tensor:
    ids = task.is_held_out.nonzero()[:, 0]
    if len(ids) == 0:
        raise ValueError("the task has no held-out pair; set task.held_out")
    return ids[torch.randint(len(ids), (n,), generator=gen)]


@torch.no_grad()
def composite_attention_flow(model: HookedTransformer, batch: Batch) -> dict[str, list[float]]:
    """Per layer, head-averaged attention: last token -> key, anchor 1, anchor 2; anchor 1 and
    anchor 2 -> key."""
    device = next(model.parameters()).device
    patterns = attention_patterns(model, batch.tokens.to(device)).mean(2).cpu()  # [layer, batch, q, k]
    key = batch.latents["key_pos"]
    rows, last = torch.arange(len(batch)), batch.tokens.shape[1] - 1
    read = lambda q, k: patterns[:, rows, q, k].mean(-1).round(decimals=4).tolist()  # noqa: E731
    return {
        "last->key": read(last, key), "last->anchor1": read(last, key + 1), "last->anchor2": read(last, key + 2),
        "anchor1->key": read(key + 1, key), "anchor2->key": read(key + 2, key),
    }


@torch.no_grad()
def last_token_similarity(model: HookedTransformer, task: CompositeTask, batch: Batch, gen: torch.Generator) -> tuple[float, float]:
    """Mean cosine similarity of the final last-token residual between each input and a twin
    with another trained pair and a key chosen so that the target is the same; and, as a
    baseline, with a twin whose key gives a different target."""
    latents = dict(batch.latents)
    other = _other_trained_pair(task, latents["pair"], gen)
    same_key = latents["key"] + task.trained_shift[latents["pair"]] - task.trained_shift[other]
    in_range = (same_key >= task.cfg.value_min) & (same_key <= task.cfg.value_max)
    same_key = same_key.clamp(task.cfg.value_min, task.cfg.value_max)
    other_key = torch.where(same_key + 7 <= task.cfg.value_max, same_key + 7, same_key - 7)  # target moves by 7
    twin = task.build({**latents, "pair": other, "key": same_key})
    shifted = task.build({**latents, "pair": other, "key": other_key})
    base = _last_residual(model, batch.tokens)
    same = F.cosine_similarity(base, _last_residual(model, twin.tokens), dim=-1)[in_range].mean().item()
    different = F.cosine_similarity(base, _last_residual(model, shifted.tokens), dim=-1)[in_range].mean().item()
    return same, different


def _other_trained_pair(task: CompositeTask, pair: Tensor, gen: torch.Generator) -> Tensor:
    allowed = ~task.is_held_out.unsqueeze(0) & (torch.arange(len(task.pairs)).unsqueeze(0) != pair.unsqueeze(1))
    return uniform_choice(allowed, gen)


def _last_residual(model: HookedTransformer, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_model"]:
    device = next(model.parameters()).device
    name = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    _, cache = model.run_with_cache(tokens.to(device), names_filter=name)
    return cache[name][:, -1].cpu()


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
        return _without_unset(data, ("parity_rules", "circuit_chain", "findings_from_circuit"))


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
    verdict.findings = _lego_findings(verdict)
    return verdict


def _without_unset(data: dict[str, Any], optional: tuple[str, ...]) -> dict[str, Any]:
    """`data` without the `optional` keys that are None: analysis.json holds what was measured."""
    return {key: value for key, value in data.items() if value is not None or key not in optional}


@dataclass
class TemplatesVerdict:
    verdict: str  # generalises | memorises | unlearned
    accuracy: dict[str, float]  # per split of the symbol alphabet: train, val, test
    chance: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def templates_verdict(model: HookedTransformer, task: TemplatesTask, n: int = 2000, seed: int = 0,
                      threshold: float = LEARNED_ACCURACY) -> TemplatesVerdict:
    """Accuracy on strings of training symbols and of symbols never seen in training. A model
    that reaches `threshold` on both generalises; on training symbols only, it memorises."""
    gen = seeded_generator(seed)
    accuracy = {}
    for split in ("train", "val", "test"):
        batch = task.sample(n, gen, split=split)
        accuracy[split] = round((predictions(model, batch) == batch.labels).float().mean().item(), 4)
    if accuracy["train"] < threshold:
        verdict = "unlearned"
    else:
        verdict = "generalises" if accuracy["test"] >= threshold else "memorises"
    return TemplatesVerdict(verdict, accuracy, round(task.chance_accuracy(), 4))


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


def _lego_findings(v: LegoVerdict) -> list[str]:
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
