"""A head's label with its causal evidence: does the answer depend on the head that looks like X?

A label (`interp.attention`) says where a head looks. Exact patching says whether the answer
depends on it. Here every head gets both, and a status that joins them:

  used          labelled, and its *share* reaches USED: patching its clean output into the
                corrupted run restores at least that fraction of the clean-corrupted difference
  twin          labelled, its own share below USED, but patched together with another head of the
                same label (a *partner*) the pair restores at least TWIN_GAIN more than the two
                alone: redundant heads doing one job, so that patching either moves nothing
  not used      labelled, below USED alone and with every partner tried: it looks like its kind,
                and the answer does not depend on it
  unnamed       "mixed" (no kind passes), yet it carries at least CARRIES: a used head no kind names
  idle          "mixed" and below CARRIES

The share is the largest over the pair sets a `ShareProbe` holds: the analysis's own
counterfactual pairs by default, a task's own sets where it declares them (LEGO: every hop,
`interp/tasks/lego_heads.py`).

Shape glossary: layer, head_index.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens import HookedTransformer

from interp.attention import HeadScores
from interp.patching import Metric, mean_metric, patch_head_out
from models.planted import token_context

USED = 0.05  # a labelled head restoring less than this alone is not shown as used
CARRIES = 0.3  # a head restoring at least this carries the answer, labelled or not
TWIN_GAIN = 0.1  # a pair restoring this much more than its two heads alone are twins
MAX_PARTNERS = 3  # partners tried per head (those of its label with the largest shares)
STATUSES = ("used", "twin", "not used", "unnamed", "idle")


@dataclass
class PairSet:
    """Aligned clean and corrupted tokens and the metric read on them."""

    clean: Int[Tensor, "batch pos"]
    corrupted: Int[Tensor, "batch pos"]
    metric: Metric


@dataclass
class ShareProbe:
    """The pair sets a head's share is measured on, and what they change."""

    sets: list[PairSet]
    description: str

    def shares(self, model: HookedTransformer) -> Float[Tensor, "layer head_index"]:
        """Per head, the largest normalised effect of patching its output (all positions) clean ->
        corrupted, over the sets."""
        device = next(model.parameters()).device
        return torch.stack([patch_head_out(model, s.clean.to(device), s.corrupted.to(device), s.metric).values
                            for s in self.sets]).amax(0)

    def joint(self, model: HookedTransformer, heads: list[tuple[int, int]]) -> float:
        """The largest normalised effect, over the sets, of patching these heads together."""
        return max(patch_heads_together(model, s.clean, s.corrupted, s.metric, heads) for s in self.sets)


@torch.no_grad()
def patch_heads_together(
    model: HookedTransformer, clean_tokens: Int[Tensor, "batch pos"], corrupted_tokens: Int[Tensor, "batch pos"],
    metric: Metric, heads: list[tuple[int, int]],
) -> float:
    """Patch the clean outputs (`attn.hook_z`, every position) of all `heads` into the corrupted run
    at once; normalised as `patch_head_out` (0 = corrupted, 1 = clean)."""
    device = next(model.parameters()).device
    clean_tokens, corrupted_tokens = clean_tokens.to(device), corrupted_tokens.to(device)
    n = clean_tokens.shape[0]
    logits, cache = model.run_with_cache(torch.cat([clean_tokens, corrupted_tokens]),
                                         names_filter=lambda name: name.endswith("attn.hook_z"))
    clean_metric = mean_metric(metric, logits[:n]).item()
    corrupted_metric = mean_metric(metric, logits[n:]).item()

    def put_clean(z: Tensor, hook: Any) -> Tensor:
        chosen = [head for layer, head in heads if layer == hook.layer()]
        z[:, :, chosen] = cache[hook.name][:n, :, chosen]
        return z

    with token_context(model, corrupted_tokens), model.hooks(fwd_hooks=[(lambda name: name.endswith("attn.hook_z"),
                                                                          put_clean)]):
        value = mean_metric(metric, model(corrupted_tokens)).item()
    return (value - corrupted_metric) / (clean_metric - corrupted_metric)


@dataclass
class HeadEvidence:
    """Per head: its label, the score of that kind (of its best kind where "mixed"), its share,
    status (STATUSES), and for a twin the partner and the pair's share."""

    labels: list[list[str]]
    scores: list[list[float]]
    shares: list[list[float]]
    status: list[list[str]]
    partner: list[list[str | None]]
    joint: list[list[float | None]]
    pairs: str  # what the share's pair sets change
    reads: list[list[str | None]] | None = None  # a depth or gathering head's target in words (`where_words`)

    def to_dict(self) -> dict[str, Any]:
        return {"pairs": self.pairs, "shares": self.shares, "status": self.status, "partner": self.partner,
                "joint": self.joint, "scores": self.scores, "reads": self.reads,
                "thresholds": {"used": USED, "carries": CARRIES, "twin_gain": TWIN_GAIN}}


def head_evidence(model: HookedTransformer, heads: HeadScores, probe: ShareProbe,
                  shares: Float[Tensor, "layer head_index"] | None = None, task: Any = None) -> HeadEvidence:
    """Every head's label joined with its share (`probe.shares`, or `shares` already measured on
    the probe's sets); twins found by patching pairs of one label together; `task` names what
    depth and gathering heads read."""
    shares = probe.shares(model) if shares is None else shares
    n_layers, n_heads = shares.shape
    best = heads.scores.amax(0)
    scores = [[round(float(heads.score(label)[layer, head] if label in heads.kinds else best[layer, head]), 4)
               for head, label in enumerate(row)] for layer, row in enumerate(heads.labels)]
    status = [["" for _ in range(n_heads)] for _ in range(n_layers)]
    partner: list[list[str | None]] = [[None] * n_heads for _ in range(n_layers)]
    joint: list[list[float | None]] = [[None] * n_heads for _ in range(n_layers)]
    for layer in range(n_layers):
        for head in range(n_heads):
            label, share = heads.labels[layer][head], float(shares[layer, head])
            if label == "mixed":
                status[layer][head] = "unnamed" if share >= CARRIES else "idle"
            elif share >= USED:
                status[layer][head] = "used"
            else:
                found = _twin(model, heads, probe, shares, (layer, head))
                status[layer][head] = "not used" if found is None else "twin"
                if found is not None:
                    (other_layer, other_head), together = found
                    partner[layer][head] = f"L{other_layer}H{other_head}"
                    joint[layer][head] = round(together, 4)
    reads = [[where_words(task, label, heads.where[layer][head] if heads.where else None)
               for head, label in enumerate(row)] for layer, row in enumerate(heads.labels)]
    return HeadEvidence(heads.labels, scores, shares.round(decimals=4).tolist(), status, partner, joint,
                        probe.description, reads)


def _twin(model: HookedTransformer, heads: HeadScores, probe: ShareProbe, shares: Tensor,
          head: tuple[int, int]) -> tuple[tuple[int, int], float] | None:
    """The first partner (same label and, for depth and gathering heads, the same target; the
    largest shares first) with which `head` restores TWIN_GAIN more than the two alone."""
    layer, index = head
    label = heads.labels[layer][index]
    where = heads.where[layer][index] if heads.where else None
    same = [(other_layer, other) for other_layer, row in enumerate(heads.labels)
            for other, other_label in enumerate(row)
            if other_label == label and (other_layer, other) != head
            and (heads.where[other_layer][other] if heads.where else None) == where]
    same.sort(key=lambda h: -float(shares[h]))
    for other in same[:MAX_PARTNERS]:
        together = probe.joint(model, [head, other])
        if together >= float(shares[head]) + float(shares[other]) + TWIN_GAIN:
            return other, together
    return None


def where_words(task: Any, label: str, where: int | None) -> str | None:
    """What a depth or gathering head reads, in words: "depth 2" (LEGO: "#2's clause"), "every
    segment's group element" (a task's optional `role_names`, else "offset 2"); None otherwise."""
    if where is None or label not in ("depth", "gathering"):
        return None
    if label == "depth":
        names = getattr(task, "label_names", None)
        has_names = hasattr(task, "role_names") and names and where < len(names)
        return f"{names[where]}'s clause" if has_names else f"depth {where}"
    roles = getattr(task, "role_names", None)
    return f"every segment's {roles[where] if roles and where < len(roles) else f'offset {where}'}"


def describe(label: str, status: str, share: float, partner: str | None = None, joint: float | None = None,
             where: str | None = None) -> str:
    """The label in words with its evidence: "association, used (share 0.45)"."""
    kind = f"{label} ({where})" if where is not None else label
    if status == "used":
        return f"{kind}, used (share {share:.2f})"
    if status == "twin":
        return f"{kind}, used redundantly with {partner} (alone {share:.2f}, together {joint:.2f})"
    if status == "not used":
        return f"looks like {kind}, not used (share {share:.2f})"
    if status == "unnamed":
        return f"mixed: carries {share:.2f}, no kind names its pattern"
    return f"{kind} (share {share:.2f})"


def _number(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, (int, float)) else str(value)


STATUS_WORDS = {"used": "looks like its kind, and the answer depends on it",
                "twin": "looks like its kind; alone it moves nothing, with its twin it does (redundant heads)",
                "not used": "looks like its kind, and the answer does not depend on it",
                "unnamed": "carries the answer, and no kind names its pattern"}


def head_evidence_html(heads: dict[str, Any]) -> str:
    """The report's table of labels with their evidence, from analysis.json's "heads": every head
    that is labelled or carries at least CARRIES, with its pattern score, share and status; ""
    for an analysis written before labels had evidence."""
    import html

    from interp.report import table_html

    evidence = heads.get("evidence")
    if not evidence:
        return ""
    rows, counts = [], dict.fromkeys(STATUS_WORDS, 0)
    reads = evidence.get("reads") or [[None] * len(row) for row in heads["labels"]]
    for layer, row in enumerate(heads["labels"]):
        for head, label in enumerate(row):
            status, share = evidence["status"][layer][head], evidence["shares"][layer][head]
            if status == "idle":
                continue
            counts[status] = counts.get(status, 0) + 1
            kind = label if reads[layer][head] is None else f"{label} ({reads[layer][head]})"
            twin = (f"with {evidence['partner'][layer][head]}: together {_number(evidence['joint'][layer][head])}"
                    if status == "twin" else "")
            rows.append([f"L{layer}H{head}", kind, _number(evidence["scores"][layer][head]), _number(share), status,
                         twin])
    if not rows:
        return "<p>No head is labelled or carries the answer.</p>"
    said = "; ".join(f"{n} {STATUS_WORDS[s]}" for s, n in counts.items() if n and s in STATUS_WORDS)
    return (f"<p><b>Labels and what the answer depends on.</b> The share is exact patching of the head's output "
            f"(clean into corrupted), on {html.escape(evidence['pairs'])}; a labelled head is <i>used</i> from "
            f"{evidence['thresholds']['used']} and carries the answer from {evidence['thresholds']['carries']}. "
            f"{html.escape(said)}.</p>"
            + table_html(rows, ["head", "label", "pattern score", "share", "status", "twin"]))
